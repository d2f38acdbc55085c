//! Attention fusion for ONNX models exported from PyTorch.
//!
//! [`fuse`] finds every multi-head-attention block (QK MatMul → scale → mask → Softmax →
//! context MatMul, with the exporters' head split/merge, GQA repeat, split scales and guards
//! around it), proves it exact, and replaces it by one standard ONNX `Attention` node
//! (opset 23). Each Softmax that is not fused is reported as a [`NearMiss`] naming the node
//! and the failed predicate.
//!
//! A mask layer proven to be exactly the causal triangle (`key j visible iff j ≤ i`, Lq = Lk)
//! becomes `is_causal=1` (the kernel then skips the key blocks above the diagonal); whatever
//! else that layer masked (padding) stays as `attn_mask`. Each block's report says how the
//! triangle was proven, or why `is_causal` was not used.
//!
//! Layers: [`graph`] (a view with producers/consumers and a symbolic shape/value evaluator),
//! [`pattern`] (the declarative pattern language), [`attention`] (the rule, in named pieces),
//! [`causal`] (the causal-mask proofs), [`rewrite`] (emission and cleanup), [`upgrade`]
//! (opset raise), [`text`] (snapshots, DOT).

pub mod attention;
pub mod causal;
pub mod graph;
pub mod pattern;
pub mod rewrite;
pub mod text;
pub mod upgrade;

use anyhow::{Context, Result};
use attnrt_onnx::{node_label, opset, validate::topo_order, validate_model, ModelProto};
use serde::Serialize;

pub use text::{block_dot, structure_text};

/// Options of [`fuse`].
#[derive(Default, Clone, Debug)]
pub struct FusionOptions {
    /// Refuse blocks whose fusion has caveats (results that differ from the original on edge
    /// inputs, such as rows where every key is masked).
    pub strict: bool,
}

/// The fused model and what happened.
#[derive(Clone, Debug)]
pub struct Fused {
    /// The rewritten model (the input unchanged when nothing was fused).
    pub model: ModelProto,
    /// The report.
    pub report: FusionReport,
}

/// What fusion did and did not do.
#[derive(Serialize, Clone, Debug, Default)]
pub struct FusionReport {
    /// Fused blocks, in the order of their Softmax nodes.
    pub blocks: Vec<FusedBlock>,
    /// Softmax nodes that were not fused, with the failed predicate.
    pub near_misses: Vec<NearMiss>,
    /// Model-level notes (opset raise, converted nodes, why nothing was fused).
    pub notes: Vec<String>,
    /// Default-domain opset of the input.
    pub opset_before: i64,
    /// Default-domain opset of the output.
    pub opset_after: i64,
}

/// One fused attention block.
#[derive(Serialize, Clone, Debug)]
pub struct FusedBlock {
    /// The fused node's name (`attnrt/Attention_<i>`).
    pub node: String,
    /// The rule and the variants it matched.
    pub rule: String,
    /// The Softmax node of the block.
    pub softmax: String,
    /// Labels of the nodes removed.
    pub replaced: Vec<String>,
    /// "3d" (head split absorbed) or "4d".
    pub layout: String,
    /// Query heads, when known.
    pub q_heads: Option<i64>,
    /// Key/value heads, when known.
    pub kv_heads: Option<i64>,
    /// The emitted `scale` attribute (`None`: the op's default 1/sqrt(head_size)).
    pub scale: Option<f32>,
    /// "none", "additive", "bool", or a combination ("additive+fill").
    pub mask: String,
    /// Whether `is_causal` was set.
    pub is_causal: bool,
    /// How the causal triangle was proven, or why `is_causal` was not used (absent when the
    /// block has no mask).
    pub causal_note: Option<String>,
    /// The emitted `softcap` attribute, when the block caps its scores.
    pub softcap: Option<f32>,
    /// Where the fused result differs from the original on edge inputs.
    pub caveats: Vec<String>,
}

/// A Softmax that looked like attention but was not fused.
#[derive(Serialize, Clone, Debug)]
pub struct NearMiss {
    /// The Softmax node.
    pub softmax: String,
    /// The rule tried.
    pub rule: String,
    /// The node where the rule failed.
    pub node: String,
    /// The failed predicate.
    pub reason: String,
}

impl FusionReport {
    /// One line per fused block, then the opset change.
    pub fn summary_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .blocks
            .iter()
            .map(|b| {
                let heads = match (b.q_heads, b.kv_heads) {
                    (Some(q), Some(k)) if q != k => format!(" heads={q}/{k}"),
                    (Some(q), _) => format!(" heads={q}"),
                    _ => String::new(),
                };
                let scale = b.scale.map_or("default".to_string(), |s| format!("{s}"));
                let caveats = if b.caveats.is_empty() { String::new() } else { format!(" caveats={}", b.caveats.len()) };
                format!(
                    "{}: {} → Attention {}{heads} scale={scale} mask={}{} ({} nodes replaced){caveats}",
                    b.node,
                    b.softmax,
                    b.layout,
                    b.mask,
                    if b.is_causal { " causal" } else { "" },
                    b.replaced.len()
                )
            })
            .collect();
        lines.push(format!(
            "{} block(s) fused, {} not fused; opset {} → {}",
            self.blocks.len(),
            self.near_misses.len(),
            self.opset_before,
            self.opset_after
        ));
        lines
    }

    /// Every near miss with its node and reason, every caveat, and the notes.
    pub fn explain_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for b in &self.blocks {
            lines.push(format!("fused {} ({}): rule {}", b.node, b.softmax, b.rule));
            if let Some(n) = &b.causal_note {
                lines.push(format!("  {n}"));
            }
            for c in &b.caveats {
                lines.push(format!("  caveat: {c}"));
            }
        }
        for m in &self.near_misses {
            lines.push(format!(
                "not fused: {} (rule {}): at {}: {}",
                m.softmax, m.rule, m.node, m.reason
            ));
        }
        lines.extend(self.notes.iter().map(|n| format!("note: {n}")));
        lines
    }
}

/// The opset the `Attention` op needs.
pub const ATTENTION_OPSET: i64 = 23;

/// Finds and fuses the attention blocks of `model`.
pub fn fuse(model: &ModelProto, options: &FusionOptions) -> Result<Fused> {
    validate_model(model).context("the input model is not valid")?;
    let opset_before = opset::default_version(model).unwrap_or(1);
    let mut report = FusionReport {
        opset_before,
        opset_after: opset_before,
        ..Default::default()
    };
    let graph = model.graph.as_ref().context("the model has no graph")?;

    // Pass 1: which Softmax nodes fuse, on the input as it is.
    let order = topo_order(graph).context("the input graph has a cycle")?;
    let view = graph::GraphView::new(graph, &order);
    let mut candidates: Vec<String> = Vec::new();
    for &i in &order {
        let n = &graph.node[i];
        if n.op_type != "Softmax" || !opset::is_default_domain(&n.domain) {
            continue;
        }
        if let Some(reason) = precheck(opset_before, n) {
            report
                .near_misses
                .push(near_miss(n, &node_label(n), reason));
            continue;
        }
        match attention::check(&view, i, options.strict) {
            Ok(m) if options.strict && !m.caveats.is_empty() => report.near_misses.push(near_miss(
                n,
                &node_label(n),
                format!(
                    "strict: fusion would have caveats: {}",
                    m.caveats.join("; ")
                ),
            )),
            Ok(_) => candidates.push(n.output[0].clone()),
            Err(r) => report.near_misses.push(near_miss(n, &r.node, r.reason)),
        }
    }
    if candidates.is_empty() {
        return Ok(Fused {
            model: model.clone(),
            report,
        });
    }

    // The Attention op needs opset 23; raise it only now that something will be fused.
    let (mut work, up) = match upgrade::raise_opset(model, ATTENTION_OPSET) {
        Ok(x) => x,
        Err(e) => {
            report.notes.push(format!(
                "nothing fused: cannot raise the opset to {ATTENTION_OPSET}: {e:#}"
            ));
            for c in &candidates {
                report.near_misses.push(NearMiss {
                    softmax: c.clone(),
                    rule: "attention".into(),
                    node: "(model)".into(),
                    reason: format!("opset cannot be raised: {e:#}"),
                });
            }
            return Ok(Fused {
                model: model.clone(),
                report,
            });
        }
    };
    if up.from != up.to {
        report.notes.push(format!(
            "default-domain opset raised {} → {}",
            up.from, up.to
        ));
    }
    report
        .notes
        .extend(up.converted.iter().map(|c| format!("converted {c}")));
    report.opset_after = up.to;

    // Pass 2: rewrite one block at a time, re-checking on the current graph.
    for sm_out in candidates {
        let g = work.graph.as_ref().context("no graph")?;
        let order = topo_order(g)?;
        let view = graph::GraphView::new(g, &order);
        let Some(sm) = g
            .node
            .iter()
            .position(|n| n.op_type == "Softmax" && n.output.first() == Some(&sm_out))
        else {
            continue;
        };
        let sm_label = node_label(&g.node[sm]);
        let m = match attention::check(&view, sm, options.strict) {
            Ok(m) => m,
            Err(r) => {
                report.near_misses.push(NearMiss {
                    softmax: sm_label,
                    rule: "attention".into(),
                    node: r.node,
                    reason: r.reason,
                });
                continue;
            }
        };
        let name = format!("attnrt/Attention_{}", report.blocks.len());
        let mut next = work.clone();
        let done = rewrite::rewrite(next.graph.as_mut().context("no graph")?, &m, &name)
            .with_context(|| format!("fusing the block of Softmax {sm_label}"))?;
        validate_model(&next).with_context(|| {
            format!("the model is invalid after fusing {name} (Softmax {sm_label})")
        })?;
        work = next;
        let layout = match m.layout {
            attention::Layout::ThreeD { .. } => "3d",
            _ => "4d",
        };
        let (q_heads, kv_heads) = match m.layout {
            attention::Layout::ThreeD { q_heads, kv_heads } => (Some(q_heads), Some(kv_heads)),
            _ => m.heads,
        };
        report.blocks.push(FusedBlock {
            node: done.node,
            rule: format!("attention[{}]", m.tags.join(", ")),
            softmax: sm_label,
            replaced: done.removed,
            layout: layout.into(),
            q_heads,
            kv_heads,
            scale: m.scale_attr,
            mask: done.mask,
            is_causal: m.is_causal,
            causal_note: m.causal_note,
            softcap: m.softcap,
            caveats: m.caveats,
        });
    }
    if report.blocks.is_empty() {
        report.opset_after = opset_before;
        return Ok(Fused {
            model: model.clone(),
            report,
        });
    }
    Ok(Fused {
        model: work,
        report,
    })
}

fn near_miss(softmax: &attnrt_onnx::NodeProto, node: &str, reason: String) -> NearMiss {
    NearMiss {
        softmax: node_label(softmax),
        rule: "attention".into(),
        node: node.to_string(),
        reason,
    }
}

/// Checks that do not need the graph: Softmax before opset 13 defaults to axis 1 and flattens.
fn precheck(opset: i64, n: &attnrt_onnx::NodeProto) -> Option<String> {
    let has_axis = n.attribute.iter().any(|a| a.name == "axis");
    (opset < 13 && !has_axis)
        .then(|| format!("opset {opset} Softmax without `axis` (defaults to 1 and flattens)"))
}
