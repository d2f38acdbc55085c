//! Raising a model's default-domain opset so it may hold the `Attention` op (opset 23).
//!
//! The lead's `attnrt_onnx::opset::upgrade_to(model, 23)` is meant to own this; until it
//! exists this module is the single place fusion calls, with a conservative converter: from
//! opset 13 upwards it converts the operators whose signatures changed (Reduce* `axes`
//! attribute → input at 18, Split `num_outputs` at 18) and refuses, naming the node, the few
//! whose meaning changed (GroupNormalization at 21, DFT at 20, GridSample modes at 20).

use anyhow::{bail, Result};
use attnrt_onnx::opset::{default_version, is_default_domain, min_ir_version_for_opset, set_version};
use attnrt_onnx::{attr, node_label, tensor, AttributeProto, GraphProto, ModelProto, NodeProto};

/// What the upgrade changed.
#[derive(Debug, Clone, Default)]
pub struct UpgradeReport {
    /// Default-domain opset before.
    pub from: i64,
    /// Default-domain opset after.
    pub to: i64,
    /// One line per converted node.
    pub converted: Vec<String>,
}

const REDUCE_AXES_AT_18: &[&str] = &[
    "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare",
];

/// Raises the default-domain opset of `model` to at least `target`, converting nodes whose
/// signature changed; errors name the node that cannot be converted (the model is then
/// unchanged).
pub fn raise_opset(model: &ModelProto, target: i64) -> Result<(ModelProto, UpgradeReport)> {
    let from = default_version(model).unwrap_or(1);
    let mut out = model.clone();
    let mut report = UpgradeReport { from, to: from.max(target), converted: vec![] };
    if from >= target {
        return Ok((out, report));
    }
    if from < 13 {
        bail!("default-domain opset {from} is below 13: raising it to {target} needs conversions (Squeeze/Unsqueeze/Split axes, Softmax semantics) attnrt does not do");
    }
    if let Some(g) = out.graph.as_mut() {
        convert_graph(g, from, &mut report.converted, &mut 0)?;
    }
    set_version(&mut out, "", target);
    out.ir_version = out.ir_version.max(min_ir_version_for_opset(target));
    Ok((out, report))
}

fn convert_graph(g: &mut GraphProto, from: i64, log: &mut Vec<String>, counter: &mut usize) -> Result<()> {
    let mut nodes = Vec::with_capacity(g.node.len());
    for mut n in std::mem::take(&mut g.node) {
        for a in n.attribute.iter_mut() {
            for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                convert_graph(sub, from, log, counter)?;
            }
        }
        if !is_default_domain(&n.domain) {
            nodes.push(n);
            continue;
        }
        let op = n.op_type.as_str();
        if from < 18 && REDUCE_AXES_AT_18.contains(&op) {
            if let Some(axes) = attr::ints(&n, "axes")?.map(<[i64]>::to_vec) {
                *counter += 1;
                let name = format!("attnrt/upgrade/axes_{counter}");
                nodes.push(constant_i64(&name, &axes));
                n.attribute.retain(|a| a.name != "axes");
                n.input.truncate(1);
                n.input.push(name);
                log.push(format!("{}: axes attribute → input (opset 18)", node_label(&n)));
            }
        } else if from < 18 && op == "Split" && n.input.get(1).map_or(true, String::is_empty) {
            n.input.truncate(1);
            n.attribute.push(attr::make_int("num_outputs", n.output.len() as i64));
            log.push(format!("{}: num_outputs={} (opset 18)", node_label(&n), n.output.len()));
        } else if from < 21 && op == "GroupNormalization" {
            bail!("node {}: GroupNormalization changed meaning at opset 21 (scale/bias per channel); not converted", node_label(&n));
        } else if from < 20 && op == "DFT" {
            bail!("node {}: DFT moved `axis` to an input at opset 20; not converted", node_label(&n));
        } else if from < 20 && op == "GridSample" {
            bail!("node {}: GridSample renamed its modes at opset 20; not converted", node_label(&n));
        }
        nodes.push(n);
    }
    g.node = nodes;
    Ok(())
}

fn constant_i64(name: &str, values: &[i64]) -> NodeProto {
    NodeProto {
        name: name.to_string(),
        op_type: "Constant".into(),
        output: vec![name.to_string()],
        attribute: vec![AttributeProto { ..attr::make_tensor("value", tensor::from_i64("", &[values.len() as i64], values)) }],
        ..Default::default()
    }
}
