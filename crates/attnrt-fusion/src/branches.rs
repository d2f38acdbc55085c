//! Fusion inside the branches of the main graph's `If` nodes: optimum's merged decoders hold
//! every attention block in the two branches of one `If` on `use_cache_branch`.
//!
//! Each branch is fused as a model of its own (the branch's nodes, reading the outer graph's
//! inputs and initializers as its own), with every check and report of a top-level fusion; the
//! fused nodes and the initializers fusion added go back into the branch, the model's opset is
//! raised to what the fused branches need, and the whole model is validated. A branch that
//! reads values computed by other outer nodes is left alone (their shapes are not the
//! branch's to prove), and said so in the notes.

use std::collections::HashSet;

use anyhow::Result;
use attnrt_onnx::proto::attribute_proto::AttributeType;
use attnrt_onnx::{opset, validate_model, GraphProto, ModelProto};

use crate::report::FusionReport;
use crate::FusionOptions;

/// `model` with the attention blocks (and GELUs) of its `If` branches fused, and their report
/// entries added to `report` (named by the `If` node and the branch); `None` when no branch
/// changed.
pub(crate) fn fuse_branches(
    model: &ModelProto,
    options: &FusionOptions,
    report: &mut FusionReport,
) -> Result<Option<ModelProto>> {
    let Some(g) = model.graph.as_ref() else {
        return Ok(None);
    };
    let mut out = model.clone();
    let mut target = opset::default_version(model).unwrap_or(1);
    let mut changed = false;
    for (at, node) in g.node.iter().enumerate() {
        if node.op_type != "If" || !opset::is_default_domain(&node.domain) {
            continue;
        }
        for (k, attr) in node.attribute.iter().enumerate() {
            let Some(branch) = attr
                .g
                .as_ref()
                .filter(|_| attr.r#type == AttributeType::Graph as i32)
            else {
                continue;
            };
            let place = format!("{}/{}", node.name, attr.name);
            let Some(fused) = fuse_branch(model, branch, &place, options, report)? else {
                continue;
            };
            target = target.max(opset::default_version(&fused.0).unwrap_or(1));
            out.graph.as_mut().expect("cloned graph").node[at].attribute[k].g = Some(fused.1);
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    let (raised, _) = crate::upgrade::raise_opset(&out, target)?;
    match validate_model(&raised) {
        Ok(()) => {
            report.opset_after = report.opset_after.max(target);
            Ok(Some(raised))
        }
        Err(e) => {
            report.notes.push(format!(
                "the blocks fused inside If branches are dropped: the model with them is not valid ({e:#})"
            ));
            Ok(None)
        }
    }
}

/// `branch` fused as a model of its own: that model and the branch to put back; `None` when
/// nothing in it fused or it reads values computed outside it.
fn fuse_branch(
    model: &ModelProto,
    branch: &GraphProto,
    place: &str,
    options: &FusionOptions,
    report: &mut FusionReport,
) -> Result<Option<(ModelProto, GraphProto)>> {
    if !branch
        .node
        .iter()
        .any(|n| n.op_type == "Softmax" || n.op_type == "Erf" || n.op_type == "Tanh")
    {
        return Ok(None);
    }
    let outer = model.graph.as_ref().expect("checked by the caller");
    let outer_names: HashSet<&str> = outer
        .input
        .iter()
        .map(|i| i.name.as_str())
        .chain(outer.initializer.iter().map(|t| t.name.as_str()))
        .collect();
    if let Some(name) = read_from_outer_nodes(branch, &outer_names) {
        report.notes.push(format!(
            "{place}: not fused: it reads '{name}', computed outside the branch"
        ));
        return Ok(None);
    }
    let alone = ModelProto {
        graph: Some(GraphProto {
            name: branch.name.clone(),
            node: branch.node.clone(),
            input: outer.input.clone(),
            initializer: [outer.initializer.clone(), branch.initializer.clone()].concat(),
            output: branch.output.clone(),
            value_info: branch.value_info.clone(),
            ..GraphProto::default()
        }),
        ..model.clone()
    };
    let fused = match crate::fuse(&alone, options) {
        Ok(f) if f.report.changed() => f,
        Ok(f) => {
            // nothing fused: the branch's near misses still say why
            merge_report(report, f.report, place);
            return Ok(None);
        }
        Err(e) => {
            report.notes.push(format!("{place}: not fused: {e:#}"));
            return Ok(None);
        }
    };
    merge_report(report, fused.report, place);
    let fg = fused.model.graph.clone().unwrap_or_default();
    let produced: HashSet<&str> = fg
        .node
        .iter()
        .flat_map(|n| n.output.iter())
        .map(String::as_str)
        .collect();
    let back = GraphProto {
        name: branch.name.clone(),
        node: fg.node.clone(),
        initializer: fg
            .initializer
            .iter()
            .filter(|t| !outer_names.contains(t.name.as_str()))
            .cloned()
            .collect(),
        output: fg.output.clone(),
        value_info: fg
            .value_info
            .iter()
            .filter(|v| produced.contains(v.name.as_str()))
            .cloned()
            .collect(),
        ..branch.clone()
    };
    Ok(Some((fused.model, back)))
}

/// A name the branch reads that neither it nor the outer graph's inputs and initializers
/// define (a value an outer node computes).
fn read_from_outer_nodes(branch: &GraphProto, outer: &HashSet<&str>) -> Option<String> {
    let mut defined: HashSet<&str> = branch.initializer.iter().map(|t| t.name.as_str()).collect();
    defined.extend(branch.input.iter().map(|i| i.name.as_str()));
    for n in &branch.node {
        defined.extend(n.output.iter().map(String::as_str));
    }
    branch
        .node
        .iter()
        .flat_map(|n| n.input.iter())
        .find(|i| !i.is_empty() && !defined.contains(i.as_str()) && !outer.contains(i.as_str()))
        .cloned()
}

/// Adds a branch's fusion report to the model's, each entry named by the branch.
fn merge_report(report: &mut FusionReport, branch: FusionReport, place: &str) {
    for mut b in branch.blocks {
        b.softmax = format!("{place}: {}", b.softmax);
        report.blocks.push(b);
    }
    for a in branch.activations {
        report.activations.push(a);
    }
    for mut m in branch.near_misses {
        m.softmax = format!("{place}: {}", m.softmax);
        report.near_misses.push(m);
    }
    report
        .notes
        .extend(branch.notes.into_iter().map(|n| format!("{place}: {n}")));
}
