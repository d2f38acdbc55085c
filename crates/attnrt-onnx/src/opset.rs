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
        .find(|o| o.domain == domain || (is_default_domain(domain) && is_default_domain(&o.domain)))
        .map(|o| o.version)
}

/// The imported version of the default ONNX domain, if any.
pub fn default_version(model: &ModelProto) -> Option<i64> {
    version(model, "")
}

/// Sets the import of `domain` to `version`, adding the import when missing.
pub fn set_version(model: &mut ModelProto, domain: &str, version: i64) {
    match model
        .opset_import
        .iter_mut()
        .find(|o| o.domain == domain || (is_default_domain(domain) && is_default_domain(&o.domain)))
    {
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

/// Every operator of the default ONNX domain up to opset [`MAX_KNOWN_OPSET`], with the opset
/// that introduced it (from `onnx/defs/operator_sets.h`, onnx main as of 2026-08). Deprecated
/// ops (Upsample, Scatter) are listed: they are still valid names under their old opsets.
pub const DEFAULT_DOMAIN_OPS: &[(&str, i64)] = &[
    ("Abs", 1),
    ("Acos", 7),
    ("Acosh", 9),
    ("Add", 1),
    ("AffineGrid", 20),
    ("And", 1),
    ("ArgMax", 1),
    ("ArgMin", 1),
    ("Asin", 7),
    ("Asinh", 9),
    ("Atan", 7),
    ("Atanh", 9),
    ("Attention", 23),
    ("AveragePool", 1),
    ("BatchNormalization", 1),
    ("Bernoulli", 15),
    ("BitShift", 11),
    ("BitwiseAnd", 18),
    ("BitwiseNot", 18),
    ("BitwiseOr", 18),
    ("BitwiseXor", 18),
    ("BlackmanWindow", 17),
    ("Cast", 1),
    ("CastLike", 15),
    ("Ceil", 1),
    ("Celu", 12),
    ("CenterCropPad", 18),
    ("Clip", 1),
    ("Col2Im", 18),
    ("Compress", 9),
    ("Concat", 1),
    ("ConcatFromSequence", 11),
    ("Constant", 1),
    ("ConstantOfShape", 9),
    ("Conv", 1),
    ("ConvInteger", 10),
    ("ConvTranspose", 1),
    ("Cos", 7),
    ("Cosh", 9),
    ("CumSum", 11),
    ("DFT", 17),
    ("DeformConv", 19),
    ("DepthToSpace", 1),
    ("DequantizeLinear", 10),
    ("Det", 11),
    ("Div", 1),
    ("Dropout", 1),
    ("DynamicQuantizeLinear", 11),
    ("Einsum", 12),
    ("Elu", 1),
    ("Equal", 1),
    ("Erf", 9),
    ("Exp", 1),
    ("Expand", 8),
    ("EyeLike", 9),
    ("Flatten", 1),
    ("Floor", 1),
    ("GRU", 1),
    ("Gather", 1),
    ("GatherElements", 11),
    ("GatherND", 11),
    ("Gelu", 20),
    ("Gemm", 1),
    ("GlobalAveragePool", 1),
    ("GlobalLpPool", 1),
    ("GlobalMaxPool", 1),
    ("Greater", 1),
    ("GreaterOrEqual", 12),
    ("GridSample", 16),
    ("GroupNormalization", 18),
    ("HammingWindow", 17),
    ("HannWindow", 17),
    ("HardSigmoid", 1),
    ("HardSwish", 14),
    ("Hardmax", 1),
    ("Identity", 1),
    ("If", 1),
    ("ImageDecoder", 20),
    ("InstanceNormalization", 1),
    ("IsInf", 10),
    ("IsNaN", 9),
    ("LRN", 1),
    ("LSTM", 1),
    ("LayerNormalization", 17),
    ("LeakyRelu", 1),
    ("Less", 1),
    ("LessOrEqual", 12),
    ("Log", 1),
    ("LogSoftmax", 1),
    ("Loop", 1),
    ("LpNormalization", 1),
    ("LpPool", 1),
    ("MatMul", 1),
    ("MatMulInteger", 10),
    ("Max", 1),
    ("MaxPool", 1),
    ("MaxRoiPool", 1),
    ("MaxUnpool", 9),
    ("Mean", 1),
    ("MeanVarianceNormalization", 9),
    ("MelWeightMatrix", 17),
    ("Min", 1),
    ("Mish", 18),
    ("Mod", 10),
    ("Mul", 1),
    ("Multinomial", 7),
    ("Neg", 1),
    ("NegativeLogLikelihoodLoss", 12),
    ("NonMaxSuppression", 10),
    ("NonZero", 9),
    ("Not", 1),
    ("OneHot", 9),
    ("Optional", 15),
    ("OptionalGetElement", 15),
    ("OptionalHasElement", 15),
    ("Or", 1),
    ("PRelu", 1),
    ("Pad", 1),
    ("Pow", 1),
    ("QLinearConv", 10),
    ("QLinearMatMul", 10),
    ("QuantizeLinear", 10),
    ("RMSNormalization", 23),
    ("RNN", 1),
    ("RandomNormal", 1),
    ("RandomNormalLike", 1),
    ("RandomUniform", 1),
    ("RandomUniformLike", 1),
    ("Range", 11),
    ("Reciprocal", 1),
    ("ReduceL1", 1),
    ("ReduceL2", 1),
    ("ReduceLogSum", 1),
    ("ReduceLogSumExp", 1),
    ("ReduceMax", 1),
    ("ReduceMean", 1),
    ("ReduceMin", 1),
    ("ReduceProd", 1),
    ("ReduceSum", 1),
    ("ReduceSumSquare", 1),
    ("RegexFullMatch", 20),
    ("Relu", 1),
    ("Reshape", 1),
    ("Resize", 10),
    ("ReverseSequence", 10),
    ("RoiAlign", 10),
    ("RotaryEmbedding", 23),
    ("Round", 11),
    ("STFT", 17),
    ("Scan", 8),
    ("Scatter", 9),
    ("ScatterElements", 11),
    ("ScatterND", 11),
    ("Selu", 1),
    ("SequenceAt", 11),
    ("SequenceConstruct", 11),
    ("SequenceEmpty", 11),
    ("SequenceErase", 11),
    ("SequenceInsert", 11),
    ("SequenceLength", 11),
    ("SequenceMap", 17),
    ("Shape", 1),
    ("Shrink", 9),
    ("Sigmoid", 1),
    ("Sign", 9),
    ("Sin", 7),
    ("Sinh", 9),
    ("Size", 1),
    ("Slice", 1),
    ("Softmax", 1),
    ("SoftmaxCrossEntropyLoss", 12),
    ("Softplus", 1),
    ("Softsign", 1),
    ("SpaceToDepth", 1),
    ("Split", 1),
    ("SplitToSequence", 11),
    ("Sqrt", 1),
    ("Squeeze", 1),
    ("StringConcat", 20),
    ("StringNormalizer", 10),
    ("StringSplit", 20),
    ("Sub", 1),
    ("Sum", 1),
    ("Swish", 24),
    ("Tan", 7),
    ("Tanh", 1),
    ("TensorScatter", 24),
    ("TfIdfVectorizer", 9),
    ("ThresholdedRelu", 10),
    ("Tile", 1),
    ("TopK", 1),
    ("Transpose", 1),
    ("Trilu", 14),
    ("Unique", 11),
    ("Unsqueeze", 1),
    ("Upsample", 1),
    ("Where", 9),
    ("Xor", 1),
];

/// The opset that introduced default-domain op `op_type`, or `None` when ONNX (up to
/// [`MAX_KNOWN_OPSET`]) has no such op.
pub fn op_since(op_type: &str) -> Option<i64> {
    DEFAULT_DOMAIN_OPS
        .binary_search_by(|(name, _)| name.cmp(&op_type))
        .ok()
        .map(|i| DEFAULT_DOMAIN_OPS[i].1)
}

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
    (
        "GroupNormalization",
        21,
        "scale and bias changed from per-group to per-channel",
    ),
    ("DFT", 20, "axis moved from an attribute to an input"),
    (
        "GridSample",
        20,
        "mode names changed and rank-N support was added",
    ),
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
    node.attribute
        .iter()
        .flat_map(|a| a.g.iter().chain(a.graphs.iter()))
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
                let base = format!(
                    "{}_axes",
                    n.output.first().map(String::as_str).unwrap_or("reduce")
                );
                let name = fresh_name(&base, names);
                new_initializers.push(crate::tensor::from_i64(&name, &[axes.len() as i64], &axes));
                n.input.truncate(1);
                n.input.push(name);
                converted.push(format!(
                    "{label} ({}): axes {axes:?} moved to an input",
                    n.op_type
                ));
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
