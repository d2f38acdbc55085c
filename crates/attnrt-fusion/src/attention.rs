//! The attention pass ([`FusionPass`]): every default-domain Softmax is a candidate, proven by
//! the rule ([`crate::rules::check`]) and rewritten one block at a time into one `Attention`
//! node ([`crate::rewrite`]); a Softmax that does not fuse is a near miss of rule `attention`.

use anyhow::{Context, Result};
use attnrt_onnx::{node_label, opset, validate::topo_order, ModelProto, NodeProto};

use crate::graph::GraphView;
use crate::mismatch::{Check, Mismatch};
use crate::pass::FusionPass;
use crate::report::{FusedBlock, FusionReport, NearMiss};
use crate::rewrite::{self, Rewritten};
use crate::rules::{self, AttentionMatch, Layout};

/// The opset the `Attention` op needs.
pub const ATTENTION_OPSET: i64 = 23;

/// The attention pass.
pub struct AttentionPass {
    /// Refuse blocks whose fusion has caveats (`FusionOptions::strict`).
    pub strict: bool,
}

/// A proven block, named by its Softmax.
pub struct Block {
    /// The Softmax's output tensor, which finds the Softmax again after earlier rewrites.
    softmax_out: String,
    /// The Softmax's label.
    softmax: String,
    /// The match.
    m: AttentionMatch,
}

impl FusionPass for AttentionPass {
    type Candidate = Block;

    const NAME: &'static str = "attention";
    const OPSET: i64 = ATTENTION_OPSET;
    const RAISE_FOR: &'static str = "";

    /// Which Softmax nodes fuse, on the input as it is; records the others as near misses.
    fn find(
        &self,
        model: &ModelProto,
        opset_version: i64,
        report: &mut FusionReport,
    ) -> Result<Vec<Block>> {
        let graph = model.graph.as_ref().context("the model has no graph")?;
        let order = topo_order(graph).context("the input graph has a cycle")?;
        let view = GraphView::new(graph, &order, opset_version);
        let mut blocks = Vec::new();
        for &i in &order {
            let n = &graph.node[i];
            if n.op_type != "Softmax" || !opset::is_default_domain(&n.domain) {
                continue;
            }
            let checked =
                precheck(opset_version, n).and_then(|()| rules::check(&view, i, self.strict));
            match checked {
                Ok(m) if self.strict && !m.mask.caveats.is_empty() => {
                    report.near_misses.push(NearMiss::new(
                        node_label(n),
                        Mismatch::new(
                            node_label(n),
                            Check::Strict,
                            "a fusion without caveats (--strict)",
                            format!("fusion would have caveats: {}", m.mask.caveats.join("; ")),
                        ),
                    ));
                }
                Ok(m) => blocks.push(Block {
                    softmax_out: n.output[0].clone(),
                    softmax: node_label(n),
                    m,
                }),
                Err(m) => report.near_misses.push(NearMiss::new(node_label(n), m)),
            }
        }
        Ok(blocks)
    }

    fn unraisable(&self, blocks: Vec<Block>, why: &anyhow::Error) -> Vec<NearMiss> {
        blocks
            .into_iter()
            .map(|b| {
                NearMiss::new(
                    b.softmax_out,
                    Mismatch::new(
                        "(model)",
                        Check::Opset,
                        format!("a model whose opset can be raised to {ATTENTION_OPSET}"),
                        format!("opset cannot be raised: {why:#}"),
                    ),
                )
            })
            .collect()
    }

    /// The block of the Softmax producing `b.softmax_out`, checked again on `work`.
    fn rematch(
        &self,
        work: &ModelProto,
        b: Block,
        report: &mut FusionReport,
    ) -> Result<Option<Block>> {
        let g = work.graph.as_ref().context("no graph")?;
        let order = topo_order(g)?;
        let view = GraphView::new(g, &order, opset::default_version(work).unwrap_or(1));
        let Some(sm) = g
            .node
            .iter()
            .position(|n| n.op_type == "Softmax" && n.output.first() == Some(&b.softmax_out))
        else {
            return Ok(None);
        };
        let softmax = node_label(&g.node[sm]);
        match rules::check(&view, sm, self.strict) {
            Ok(m) => Ok(Some(Block { softmax, m, ..b })),
            Err(e) => {
                report.near_misses.push(NearMiss::new(softmax, e));
                Ok(None)
            }
        }
    }

    fn rewrite(
        &self,
        work: &mut ModelProto,
        b: Block,
        report: &mut FusionReport,
    ) -> Result<String> {
        let name = format!("attnrt/Attention_{}", report.blocks.len());
        let graph = work.graph.as_mut().context("no graph")?;
        let done = rewrite::rewrite(graph, &b.m, &name)
            .with_context(|| format!("fusing the block of Softmax {}", b.softmax))?;
        let what = format!("{name} (Softmax {})", b.softmax);
        report.blocks.push(fused_block(b.m, done, b.softmax));
        Ok(what)
    }
}

/// The report of one fused block.
fn fused_block(m: AttentionMatch, done: Rewritten, softmax: String) -> FusedBlock {
    let p = m.placed;
    let (layout, (q_heads, kv_heads)) = match p.layout {
        Layout::ThreeD { q_heads, kv_heads } => ("3d", (Some(q_heads), Some(kv_heads))),
        _ => ("4d", p.heads),
    };
    FusedBlock {
        node: done.node,
        rule: format!("attention[{}]", p.core.tags.join(", ")),
        softmax,
        replaced: done.removed,
        layout: layout.into(),
        q_heads,
        kv_heads,
        scale: m.scale.value(),
        mask: done.mask,
        is_causal: m.mask.is_causal,
        causal_note: m.mask.causal_note,
        softcap: p.core.softcap,
        caveats: m.mask.caveats,
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
