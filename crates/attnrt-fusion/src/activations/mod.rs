//! Activation fusions, after the attention blocks: GELU ([`gelu`]) in its exported forms
//! becomes one ONNX `Gelu` (opset 20), which runs as one vectorised pass instead of five to
//! eight elementwise ones (`Pow(x, 3)` alone is a scalar `powf` per element on tract).
//!
//! Every `Tanh`/`Erf` whose input is scaled by the form's constant is a candidate; one that
//! does not complete the pattern is a near miss of rule `gelu`. The matches do not overlap, so
//! the pass ([`GeluPass`], driven by [`crate::pass::run`]) proves and rewrites them all as one
//! candidate ([`Gelus`]).

pub mod gelu;

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use attnrt_onnx::{
    attr, node_label, opset, validate::topo_order, GraphProto, ModelProto, NodeProto,
};

use crate::graph::GraphView;
use crate::mismatch::Mismatch;
use crate::pass::FusionPass;
use crate::report::{FusedActivation, FusionReport, NearMiss};

/// The opset ONNX `Gelu` needs.
pub const GELU_OPSET: i64 = 20;

/// The GELU pass.
pub struct GeluPass;

/// The GELUs of one graph, proven and rewritten together (they never overlap).
pub struct Gelus(Vec<gelu::GeluMatch>);

impl FusionPass for GeluPass {
    type Candidate = Gelus;

    const NAME: &'static str = "GELU";
    const OPSET: i64 = GELU_OPSET;
    const RAISE_FOR: &'static str = " (Gelu)";

    fn find(
        &self,
        model: &ModelProto,
        opset: i64,
        report: &mut FusionReport,
    ) -> Result<Vec<Gelus>> {
        let found = find(
            model.graph.as_ref().context("the model has no graph")?,
            opset,
        )?;
        for (anchor, m) in found.misses {
            report
                .near_misses
                .push(NearMiss::of_rule("gelu", anchor, m));
        }
        if found.matches.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![Gelus(found.matches)])
    }

    /// The GELUs of `work` (after a raise, node indices may differ).
    fn rematch(&self, work: &ModelProto, _: Gelus, _: &mut FusionReport) -> Result<Option<Gelus>> {
        let g = work.graph.as_ref().context("no graph")?;
        let matches = find(g, opset::default_version(work).unwrap_or(1))?.matches;
        Ok((!matches.is_empty()).then_some(Gelus(matches)))
    }

    fn rewrite(
        &self,
        work: &mut ModelProto,
        gelus: Gelus,
        report: &mut FusionReport,
    ) -> Result<String> {
        let fused = rewrite(work, &gelus.0, report.activations.len())?;
        report.activations.extend(fused);
        Ok("its GELUs".into())
    }
}

/// What the pass found on one graph: the matches, and the anchors that did not match.
struct Found {
    /// Proven GELUs.
    matches: Vec<gelu::GeluMatch>,
    /// `(anchor label, why)` of candidates that did not match.
    misses: Vec<(String, Mismatch)>,
}

/// Finds the GELUs of `graph` (of default-domain opset `opset`).
fn find(graph: &GraphProto, opset: i64) -> Result<Found> {
    let order = topo_order(graph).context("the graph has a cycle")?;
    let view = GraphView::new(graph, &order, opset);
    let mut found = Found {
        matches: Vec::new(),
        misses: Vec::new(),
    };
    let mut taken = BTreeSet::new();
    for &i in &order {
        let Some(form) = gelu::anchor(&view, i) else {
            continue;
        };
        match gelu::check(&view, i, form) {
            Ok(m) if m.nodes.iter().all(|n| !taken.contains(n)) => {
                taken.extend(m.nodes.iter().copied());
                found.matches.push(m);
            }
            Ok(_) => {}
            Err(e) => found.misses.push((node_label(view.node(i)), e)),
        }
    }
    Ok(found)
}

/// Replaces every match in `model` by one `Gelu` node (`attnrt/Gelu_<first + i>`); the model
/// must already be at opset ≥ [`GELU_OPSET`]. Returns the report entries.
fn rewrite(
    model: &mut ModelProto,
    matches: &[gelu::GeluMatch],
    first: usize,
) -> Result<Vec<FusedActivation>> {
    let graph = model.graph.as_mut().context("no graph")?;
    let mut fused = Vec::with_capacity(matches.len());
    let mut removed = BTreeSet::new();
    let mut inserted = Vec::new();
    let anchor_op = |f: gelu::Form| match f {
        gelu::Form::Tanh => "Tanh",
        gelu::Form::Erf => "Erf",
    };
    for (i, m) in matches.iter().enumerate() {
        let name = format!("attnrt/Gelu_{}", first + i);
        let anchor = m
            .nodes
            .iter()
            .map(|&n| &graph.node[n])
            .find(|n| n.op_type == anchor_op(m.form))
            .map(node_label)
            .unwrap_or_default();
        fused.push(FusedActivation {
            node: name.clone(),
            rule: format!("gelu[{}]", anchor_op(m.form).to_lowercase()),
            anchor,
            replaced: m
                .nodes
                .iter()
                .map(|&n| node_label(&graph.node[n]))
                .collect(),
        });
        removed.extend(m.nodes.iter().copied());
        inserted.push(NodeProto {
            name,
            op_type: "Gelu".into(),
            input: vec![m.input.clone()],
            output: vec![m.output.clone()],
            attribute: vec![attr::make_string("approximate", m.form.approximate())],
            ..Default::default()
        });
    }
    crate::rewrite::replace_nodes(graph, &removed, inserted)?;
    Ok(fused)
}
