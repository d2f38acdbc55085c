//! Attention fusion for ONNX models exported from PyTorch.
//!
//! [`fuse`] finds every multi-head-attention block (QK MatMul → scale → mask → Softmax →
//! context MatMul, with the exporters' head split/merge, GQA repeat, split scales and guards
//! around it), proves it exact, and replaces it by one standard ONNX `Attention` node
//! (opset 23). Each Softmax that is not fused is reported as a [`NearMiss`] naming the node
//! and the failed check.
//!
//! A mask layer proven to be exactly the causal triangle (`key j visible iff j ≤ i`, Lq = Lk)
//! becomes `is_causal=1` (the kernel then skips the key blocks above the diagonal); whatever
//! else that layer masked (padding) stays as `attn_mask`. Each block's report says how the
//! triangle was proven, or why `is_causal` was not used.
//!
//! Modules, from the ground up (each uses only those before it):
//!
//! - [`mismatch`]: the one failure type every check returns;
//! - [`graph`]: a view with producers/consumers, skip-through nodes and a symbolic
//!   shape/value evaluator;
//! - [`pattern`]: the declarative pattern language, which looks through skip-through nodes
//!   (`Identity`, `Dropout` in inference mode, same-type `Cast`);
//! - [`masks`]: mask layers and the causal-mask proofs;
//! - [`rules`]: the attention rule as small staged rules, one file per piece
//!   (`crates/attnrt-fusion/RULES.md` maps each file to the subgraph it matches);
//! - [`rewrite`]: emission and cleanup;
//! - [`activations`]: the GELU pass after attention (one ONNX `Gelu` per exported GELU);
//! - [`report`]: the report and its text; [`upgrade`]: the opset raise; [`text`]: snapshots,
//!   DOT.

#![warn(missing_docs)]

pub mod activations;
pub mod graph;
pub mod masks;
pub mod mismatch;
pub mod pattern;
pub mod report;
pub mod rewrite;
pub mod rules;
pub mod text;
pub mod upgrade;

use anyhow::{Context, Result};
use attnrt_onnx::{node_label, opset, validate::topo_order, validate_model, ModelProto, NodeProto};

pub use mismatch::{Check, Mismatch};
pub use report::{Fused, FusedBlock, FusionReport, NearMiss};
pub use text::{block_dot, structure_text};

/// Options of [`fuse`].
#[derive(Clone, Debug)]
pub struct FusionOptions {
    /// Refuse blocks whose fusion has caveats (results that differ from the original on edge
    /// inputs, such as rows where every key is masked).
    pub strict: bool,
    /// Also fuse GELU in its exported forms into ONNX `Gelu` ([`activations`]); on by default.
    pub gelu: bool,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions {
            strict: false,
            gelu: true,
        }
    }
}

/// The opset the `Attention` op needs.
pub const ATTENTION_OPSET: i64 = 23;

/// Finds and fuses the attention blocks of `model`, then (with `options.gelu`) its GELUs.
pub fn fuse(model: &ModelProto, options: &FusionOptions) -> Result<Fused> {
    validate_model(model).context("the input model is not valid")?;
    let opset_before = opset::default_version(model).unwrap_or(1);
    let mut report = FusionReport {
        opset_before,
        opset_after: opset_before,
        ..Default::default()
    };
    let attention = fuse_attention(model, options, &mut report)?;
    let base = attention.as_ref().unwrap_or(model);
    let gelu = match options.gelu {
        true => fuse_gelu(base, &mut report)?,
        false => None,
    };
    match gelu.or(attention) {
        Some(model) => Ok(Fused { model, report }),
        None => {
            report.opset_after = opset_before;
            Ok(Fused {
                model: model.clone(),
                report,
            })
        }
    }
}

/// The GELU pass on `model` (see [`activations`]): the model with every GELU fused, or
/// `None` when there is none (near misses recorded either way).
fn fuse_gelu(model: &ModelProto, report: &mut FusionReport) -> Result<Option<ModelProto>> {
    let graph = model.graph.as_ref().context("the model has no graph")?;
    let opset_now = opset::default_version(model).unwrap_or(1);
    let found = activations::find(graph, opset_now)?;
    for (anchor, m) in found.misses {
        report
            .near_misses
            .push(NearMiss::of_rule("gelu", anchor, m));
    }
    if found.matches.is_empty() {
        return Ok(None);
    }
    let (mut work, matches) = if opset_now >= activations::GELU_OPSET {
        (model.clone(), found.matches)
    } else {
        let raised = match upgrade::raise_opset(model, activations::GELU_OPSET) {
            Ok((up, how)) => {
                note_raise(report, &how, " (Gelu)");
                up
            }
            Err(e) => {
                report.notes.push(format!(
                    "no GELU fused: cannot raise the opset to {}: {e:#}",
                    activations::GELU_OPSET
                ));
                return Ok(None);
            }
        };
        // Node indices after a raise may differ: match again on the model being rewritten.
        let g = raised.graph.as_ref().context("no graph")?;
        let matches = activations::find(g, opset::default_version(&raised).unwrap_or(1))?.matches;
        (raised, matches)
    };
    report.activations = activations::rewrite(&mut work, &matches, 0)?;
    validate_model(&work).context("the model is invalid after fusing its GELUs")?;
    Ok(Some(work))
}

/// Records an opset raise (for `what`, e.g. " (Gelu)") and its converted nodes in the notes.
fn note_raise(report: &mut FusionReport, up: &opset::UpgradeReport, what: &str) {
    if up.from != up.to {
        report.notes.push(format!(
            "default-domain opset raised {} → {}{what}",
            up.from, up.to
        ));
    }
    report
        .notes
        .extend(up.converted.iter().map(|c| format!("converted {c}")));
    report.opset_after = up.to;
}

/// The attention passes: the model with every provable block fused, or `None` when nothing
/// was fused (near misses and notes recorded in `report`).
fn fuse_attention(
    model: &ModelProto,
    options: &FusionOptions,
    report: &mut FusionReport,
) -> Result<Option<ModelProto>> {
    let opset_before = report.opset_before;
    let candidates = candidates(model, opset_before, options, report)?;
    if candidates.is_empty() {
        return Ok(None);
    }
    // The Attention op needs opset 23; raise it only now that something will be fused.
    let mut work = match upgrade::raise_opset(model, ATTENTION_OPSET) {
        Ok((work, up)) => {
            note_raise(report, &up, "");
            work
        }
        Err(e) => {
            report.notes.push(format!(
                "no attention fused: cannot raise the opset to {ATTENTION_OPSET}: {e:#}"
            ));
            for c in candidates {
                report.near_misses.push(NearMiss::new(
                    c,
                    Mismatch::new(
                        "(model)",
                        Check::Opset,
                        format!("a model whose opset can be raised to {ATTENTION_OPSET}"),
                        format!("opset cannot be raised: {e:#}"),
                    ),
                ));
            }
            return Ok(None);
        }
    };
    // Pass 2: rewrite one block at a time, re-checking on the current graph.
    for sm_out in candidates {
        if let Some(next) = fuse_block(&work, &sm_out, options, report)? {
            work = next;
        }
    }
    if report.blocks.is_empty() {
        report.opset_after = opset_before;
        return Ok(None);
    }
    Ok(Some(work))
}

/// Pass 1: which Softmax nodes fuse, on the input as it is; returns their output tensors and
/// records the others as near misses.
fn candidates(
    model: &ModelProto,
    opset_version: i64,
    options: &FusionOptions,
    report: &mut FusionReport,
) -> Result<Vec<String>> {
    let graph = model.graph.as_ref().context("the model has no graph")?;
    let order = topo_order(graph).context("the input graph has a cycle")?;
    let view = graph::GraphView::new(graph, &order, opset_version);
    let mut candidates = Vec::new();
    for &i in &order {
        let n = &graph.node[i];
        if n.op_type != "Softmax" || !opset::is_default_domain(&n.domain) {
            continue;
        }
        let checked =
            precheck(opset_version, n).and_then(|()| rules::check(&view, i, options.strict));
        match checked {
            Ok(m) if options.strict && !m.caveats.is_empty() => {
                report.near_misses.push(NearMiss::new(
                    node_label(n),
                    Mismatch::new(
                        node_label(n),
                        Check::Strict,
                        "a fusion without caveats (--strict)",
                        format!("fusion would have caveats: {}", m.caveats.join("; ")),
                    ),
                ));
            }
            Ok(_) => candidates.push(n.output[0].clone()),
            Err(m) => report.near_misses.push(NearMiss::new(node_label(n), m)),
        }
    }
    Ok(candidates)
}

/// Pass 2 for the Softmax producing `sm_out`: re-checks the block on `work` (earlier rewrites
/// changed the graph) and returns the model with it fused, or `None` (recorded as a near miss).
fn fuse_block(
    work: &ModelProto,
    sm_out: &str,
    options: &FusionOptions,
    report: &mut FusionReport,
) -> Result<Option<ModelProto>> {
    let g = work.graph.as_ref().context("no graph")?;
    let order = topo_order(g)?;
    let view = graph::GraphView::new(g, &order, opset::default_version(work).unwrap_or(1));
    let Some(sm) = g.node.iter().position(|n| {
        n.op_type == "Softmax" && n.output.first().map(String::as_str) == Some(sm_out)
    }) else {
        return Ok(None);
    };
    let sm_label = node_label(&g.node[sm]);
    let m = match rules::check(&view, sm, options.strict) {
        Ok(m) => m,
        Err(e) => {
            report.near_misses.push(NearMiss::new(sm_label, e));
            return Ok(None);
        }
    };
    let name = format!("attnrt/Attention_{}", report.blocks.len());
    let mut next = work.clone();
    let done = rewrite::rewrite(next.graph.as_mut().context("no graph")?, &m, &name)
        .with_context(|| format!("fusing the block of Softmax {sm_label}"))?;
    validate_model(&next).with_context(|| {
        format!("the model is invalid after fusing {name} (Softmax {sm_label})")
    })?;
    report.blocks.push(fused_block(m, done, sm_label));
    Ok(Some(next))
}

/// The report of one fused block.
fn fused_block(m: rules::AttentionMatch, done: rewrite::Rewritten, softmax: String) -> FusedBlock {
    let (layout, (q_heads, kv_heads)) = match m.layout {
        rules::Layout::ThreeD { q_heads, kv_heads } => ("3d", (Some(q_heads), Some(kv_heads))),
        _ => ("4d", m.heads),
    };
    FusedBlock {
        node: done.node,
        rule: format!("attention[{}]", m.tags.join(", ")),
        softmax,
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
    }
}

/// Checks that do not need the graph: Softmax before opset 13 defaults to axis 1 and flattens.
fn precheck(opset_version: i64, n: &NodeProto) -> Result<(), Mismatch> {
    let has_axis = n.attribute.iter().any(|a| a.name == "axis");
    if opset_version < 13 && !has_axis {
        return Err(Mismatch::new(
            node_label(n),
            Check::Opset,
            "an explicit `axis` before opset 13",
            format!("opset {opset_version} Softmax without `axis` (defaults to 1 and flattens)"),
        ));
    }
    Ok(())
}
