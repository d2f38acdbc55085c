//! Opset imports: which version of each operator domain a model uses.

use crate::proto::{ModelProto, OperatorSetIdProto};

/// The default ("" or "ai.onnx") domain name as it appears in `opset_import`.
pub fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// The imported version of `domain` (the default domain for "" or "ai.onnx"), if any.
pub fn version(model: &ModelProto, domain: &str) -> Option<i64> {
    model
        .opset_import
        .iter()
        .find(|o| {
            o.domain == domain || (is_default_domain(domain) && is_default_domain(&o.domain))
        })
        .map(|o| o.version)
}

/// The imported version of the default ONNX domain, if any.
pub fn default_version(model: &ModelProto) -> Option<i64> {
    version(model, "")
}

/// Sets the import of `domain` to `version`, adding the import when missing.
pub fn set_version(model: &mut ModelProto, domain: &str, version: i64) {
    match model.opset_import.iter_mut().find(|o| {
        o.domain == domain || (is_default_domain(domain) && is_default_domain(&o.domain))
    }) {
        Some(o) => o.version = version,
        None => model.opset_import.push(OperatorSetIdProto {
            domain: domain.to_string(),
            version,
        }),
    }
}

/// The lowest IR version that may import default-domain `opset` (from the ONNX versioning table).
pub fn min_ir_version_for_opset(opset: i64) -> i64 {
    match opset {
        ..=8 => 3,
        9 => 4,
        10 => 5,
        11 => 6,
        12..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        21..=22 => 10,
        23..=24 => 11,
        _ => 12,
    }
}

/// The newest default-domain opset whose operator set attnrt knows how to reason about.
pub const MAX_KNOWN_OPSET: i64 = 24;

/// The newest IR version attnrt reads and writes faithfully.
pub const MAX_KNOWN_IR_VERSION: i64 = 12;

/// What [`upgrade_to`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpgradeReport {
    /// The default-domain opset before.
    pub from: i64,
    /// The default-domain opset after.
    pub to: i64,
    /// One line per node whose signature was converted.
    pub converted: Vec<String>,
}

/// Reduce ops whose `axes` moved from an attribute to an input at opset 18
/// (ReduceSum moved at 13 already).
const REDUCE_AXES_AT_18: &[&str] = &[
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
];

/// Ops whose meaning or signature changed between 13 and 24 in ways attnrt does not convert:
/// (op, the opset where it changed, what changed).
const UNCONVERTED_CHANGES: &[(&str, i64, &str)] = &[
    ("GroupNormalization", 21, "scale and bias changed from per-group to per-channel"),
    ("DFT", 20, "axis moved from an attribute to an input"),
    ("GridSample", 20, "mode names changed and rank-N support was added"),
    ("Upsample", 10, "the op was removed"),
    ("Scatter", 11, "the op was removed"),
];

/// Raises the model's default-domain opset to `target`, converting every node (subgraphs
/// included) whose signature changed on the way: `axes` of Reduce* ops becomes an input at 18,
/// Split gains `num_outputs` at 18 when no `split` input is given. Raises `ir_version` to the
/// minimum the new opset needs. Fails, changing nothing, when the model is below opset 13 or
/// holds an op whose change attnrt does not convert; the error names the node.
pub fn upgrade_to(model: &mut ModelProto, target: i64) -> anyhow::Result<UpgradeReport> {
    use anyhow::bail;
    let from = default_version(model).unwrap_or(0);
    let mut report = UpgradeReport {
        from,
        to: from.max(target),
        converted: Vec::new(),
    };
    if from >= target {
        return Ok(report);
    }
    if from < 13 {
        bail!("the model's opset {from} is below 13; attnrt upgrades opsets from 13 on only");
    }
    if target > MAX_KNOWN_OPSET {
        bail!("opset {target} is newer than attnrt knows ({MAX_KNOWN_OPSET})");
    }
    let Some(graph) = model.graph.as_ref() else {
        bail!("the model has no graph");
    };
    // First a read-only pass, so that a refusal leaves the model untouched.
    check_convertible(graph, from, target)?;
    let mut names = std::collections::HashSet::new();
    collect_names(graph, &mut names);
    let graph = model.graph.as_mut().expect("checked above");
    convert_graph(graph, from, target, &mut names, &mut report.converted)?;
    set_version(model, "", target);
    model.ir_version = model.ir_version.max(min_ir_version_for_opset(target));
    Ok(report)
}

fn subgraphs(node: &crate::proto::NodeProto) -> impl Iterator<Item = &crate::proto::GraphProto> {
    node.attribute.iter().flat_map(|a| a.g.iter().chain(a.graphs.iter()))
}

fn check_convertible(g: &crate::proto::GraphProto, from: i64, target: i64) -> anyhow::Result<()> {
    for n in &g.node {
        if is_default_domain(&n.domain) {
            for (op, at, what) in UNCONVERTED_CHANGES {
                if n.op_type == *op && from < *at && target >= *at {
                    anyhow::bail!(
                        "node {} ({op}) cannot be moved to opset {target}: at opset {at} {what}",
                        crate::node_label(n)
                    );
                }
            }
        }
        for sub in subgraphs(n) {
            check_convertible(sub, from, target)?;
        }
    }
    Ok(())
}

fn collect_names(g: &crate::proto::GraphProto, names: &mut std::collections::HashSet<String>) {
    names.extend(g.input.iter().map(|i| i.name.clone()));
    names.extend(g.initializer.iter().map(|t| t.name.clone()));
    for n in &g.node {
        names.extend(n.output.iter().cloned());
        names.insert(n.name.clone());
        for sub in subgraphs(n) {
            collect_names(sub, names);
        }
    }
}

/// A name not used anywhere in the model yet, derived from `base`.
pub fn fresh_name(base: &str, names: &mut std::collections::HashSet<String>) -> String {
    let mut candidate = base.to_string();
    let mut i = 1;
    while names.contains(&candidate) {
        candidate = format!("{base}_{i}");
        i += 1;
    }
    names.insert(candidate.clone());
    candidate
}

fn convert_graph(
    g: &mut crate::proto::GraphProto,
    from: i64,
    target: i64,
    names: &mut std::collections::HashSet<String>,
    converted: &mut Vec<String>,
) -> anyhow::Result<()> {
    let mut new_initializers = Vec::new();
    for n in &mut g.node {
        for a in &mut n.attribute {
            for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                convert_graph(sub, from, target, names, converted)?;
            }
        }
        if !is_default_domain(&n.domain) || from >= 18 || target < 18 {
            continue;
        }
        let label = crate::node_label(n);
        if REDUCE_AXES_AT_18.contains(&n.op_type.as_str()) {
            let axes = crate::attr::ints(n, "axes")?.map(|a| a.to_vec());
            n.attribute.retain(|a| a.name != "axes");
            if let Some(axes) = axes {
                let base = format!("{}_axes", n.output.first().map(String::as_str).unwrap_or("reduce"));
                let name = fresh_name(&base, names);
                new_initializers.push(crate::tensor::from_i64(&name, &[axes.len() as i64], &axes));
                n.input.truncate(1);
                n.input.push(name);
                converted.push(format!("{label} ({}): axes {axes:?} moved to an input", n.op_type));
            }
        } else if n.op_type == "Split" {
            let has_split_input = n.input.get(1).is_some_and(|s| !s.is_empty());
            if !has_split_input && crate::attr::int(n, "num_outputs")?.is_none() {
                let k = n.output.len() as i64;
                n.input.truncate(1);
                n.attribute.push(crate::attr::make_int("num_outputs", k));
                converted.push(format!("{label} (Split): num_outputs = {k} added"));
            }
        }
    }
    g.initializer.extend(new_initializers);
    Ok(())
}
