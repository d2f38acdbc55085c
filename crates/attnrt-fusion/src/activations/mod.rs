//! Activation fusions, after the attention blocks: GELU ([`gelu`]) in its exported forms
//! becomes one ONNX `Gelu` (opset 20), which runs as one vectorised pass instead of five to
//! eight elementwise ones (`Pow(x, 3)` alone is a scalar `powf` per element on tract).
//!
//! Every `Tanh`/`Erf` whose input is scaled by the form's constant is a candidate; one that
//! does not complete the pattern is a near miss of rule `gelu`. The matches do not overlap, so
//! the pass rewrites them all at once.

pub mod gelu;

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use attnrt_onnx::{attr, node_label, validate::topo_order, GraphProto, ModelProto, NodeProto};
use serde::Serialize;

use crate::graph::GraphView;
use crate::mismatch::Mismatch;

/// The opset ONNX `Gelu` needs.
pub const GELU_OPSET: i64 = 20;

/// One fused activation.
#[derive(Serialize, Clone, Debug)]
pub struct FusedActivation {
    /// The fused node's name (`attnrt/Gelu_<i>`).
    pub node: String,
    /// The rule and form (`gelu[tanh]`, `gelu[erf]`).
    pub rule: String,
    /// The anchor node (the `Tanh` or `Erf`).
    pub anchor: String,
    /// Labels of the nodes removed.
    pub replaced: Vec<String>,
}

/// What the pass found on one graph: the matches, and the anchors that did not match.
pub struct Found {
    /// Proven GELUs.
    pub matches: Vec<gelu::GeluMatch>,
    /// `(anchor label, why)` of candidates that did not match.
    pub misses: Vec<(String, Mismatch)>,
}

/// Finds the GELUs of `graph` (of default-domain opset `opset`).
pub fn find(graph: &GraphProto, opset: i64) -> Result<Found> {
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
pub fn rewrite(
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
