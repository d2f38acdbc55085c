//! Up-front allocation checks: refuse a model whose run would create a tensor larger than
//! [`Limits::max_tensor_elements`] when that size is already fixed by the file itself.
//!
//! Loading checks every tensor stored in the file. This module looks at tensors the run would
//! *create*: ops whose output size comes from a constant (`ConstantOfShape`, `Expand`, `Tile`,
//! `Range`, `Resize`, `OneHot`, `RandomNormal`/`RandomUniform`) and shapes the file declares
//! fully static (graph inputs, outputs, `value_info`). A 40-byte model can ask for a 4 TB
//! `ConstantOfShape`; the runtime must say no before it builds a session, not die in the
//! allocator. Shapes known only at run time (from inputs) are the runtime's to check.

use std::collections::HashMap;

use anyhow::{bail, Result};

use crate::proto::{
    tensor_proto::DataType, tensor_shape_proto::dimension, type_proto, GraphProto, ModelProto,
    NodeProto, TensorProto, ValueInfoProto,
};
pub use crate::Limits;
use crate::{node_label, opset::is_default_domain};

/// Constant tensors holding more values than this are not read as shapes (a shape has a few
/// entries; reading a large initializer here would waste time for nothing).
const MAX_SHAPE_VALUES: u64 = 64;

/// Refuses `model` when running it would create a tensor of more than
/// `limits.max_tensor_elements` elements whose size the file fixes statically (see the
/// module documentation). The error names the node or tensor, the shape, and the limit.
///
/// [`crate::load_model`] runs it on every model it loads; call it again on a model built or
/// rewritten in memory before running it. It reads the model only and allocates nothing
/// proportional to the sizes it checks.
pub fn check_static_allocation(model: &ModelProto, limits: &Limits) -> Result<()> {
    let Some(graph) = model.graph.as_ref() else {
        bail!("the model has no graph");
    };
    let mut known = Known::default();
    collect(graph, &mut known, 0, limits)?;
    check_graph(graph, &known, 0, limits)
}

/// Constant values and static shapes of the whole model, by tensor name. ONNX names are
/// unique across a graph and its subgraphs, so one map serves every scope.
#[derive(Default)]
struct Known<'a> {
    /// Small constant tensors (initializers and `Constant` outputs), as numbers.
    values: HashMap<&'a str, Vec<f64>>,
    /// Fully static shapes: declared ones and those of constants.
    shapes: HashMap<&'a str, Vec<u64>>,
}

fn collect<'a>(
    g: &'a GraphProto,
    known: &mut Known<'a>,
    depth: usize,
    limits: &Limits,
) -> Result<()> {
    if depth > limits.max_subgraph_depth {
        bail!(
            "subgraphs nested more than the limit of {} deep",
            limits.max_subgraph_depth
        );
    }
    for t in &g.initializer {
        known_tensor(t.name.as_str(), t, known);
    }
    for vi in g.input.iter().chain(&g.value_info).chain(&g.output) {
        if let Some(shape) = declared_shape(vi) {
            known.shapes.insert(vi.name.as_str(), shape);
        }
    }
    for n in &g.node {
        if n.op_type == "Constant" && is_default_domain(&n.domain) {
            if let Some(out) = n.output.first() {
                constant_node(n, out, known);
            }
        }
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                collect(sub, known, depth + 1, limits)?;
            }
        }
    }
    Ok(())
}

fn known_tensor<'a>(name: &'a str, t: &'a TensorProto, known: &mut Known<'a>) {
    let Ok(dims) = t
        .dims
        .iter()
        .map(|&d| u64::try_from(d))
        .collect::<Result<Vec<u64>, _>>()
    else {
        return;
    };
    let count = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    known.shapes.insert(name, dims);
    if count.is_some_and(|c| c <= MAX_SHAPE_VALUES) {
        if let Some(v) = numbers(t) {
            known.values.insert(name, v);
        }
    }
}

fn constant_node<'a>(n: &'a NodeProto, out: &'a str, known: &mut Known<'a>) {
    for a in &n.attribute {
        match a.name.as_str() {
            "value" => {
                if let Some(t) = &a.t {
                    known_tensor(out, t, known);
                }
            }
            "value_int" => {
                known.shapes.insert(out, vec![]);
                known.values.insert(out, vec![a.i as f64]);
            }
            "value_ints" if a.ints.len() as u64 <= MAX_SHAPE_VALUES => {
                known.shapes.insert(out, vec![a.ints.len() as u64]);
                known
                    .values
                    .insert(out, a.ints.iter().map(|&v| v as f64).collect());
            }
            "value_float" => {
                known.shapes.insert(out, vec![]);
                known.values.insert(out, vec![a.f as f64]);
            }
            _ => {}
        }
    }
}

/// A small tensor's values as `f64`, whatever its numeric type; `None` for other types or
/// data that does not match the dims (loading reports those).
fn numbers(t: &TensorProto) -> Option<Vec<f64>> {
    let dt = DataType::try_from(t.data_type).ok()?;
    match dt {
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16 => {
            crate::tensor::to_f32(t)
                .ok()
                .map(|v| v.into_iter().map(f64::from).collect())
        }
        _ => crate::tensor::to_i64(t)
            .ok()
            .map(|v| v.into_iter().map(|x| x as f64).collect()),
    }
}

fn declared_shape(vi: &ValueInfoProto) -> Option<Vec<u64>> {
    let Some(type_proto::Value::TensorType(tt)) = vi.r#type.as_ref()?.value.as_ref() else {
        return None;
    };
    tt.shape
        .as_ref()?
        .dim
        .iter()
        .map(|d| match d.value {
            Some(dimension::Value::DimValue(v)) => u64::try_from(v).ok(),
            _ => None,
        })
        .collect()
}

/// The product of `dims`, saturating (a product past `u64` is over any limit anyway).
fn product(dims: impl IntoIterator<Item = u64>) -> u64 {
    dims.into_iter().fold(1u64, |acc, d| acc.saturating_mul(d))
}

/// Non-negative integer entries of a constant shape; an error names a negative entry.
fn shape_values(node: &NodeProto, what: &str, values: &[f64]) -> Result<Vec<u64>> {
    values
        .iter()
        .map(|&v| {
            if v < 0.0 {
                bail!(
                    "node {} ({}): {what} holds the negative entry {v}",
                    node_label(node),
                    node.op_type
                )
            }
            Ok(v as u64)
        })
        .collect()
}

fn refuse(node: &NodeProto, why: String, elements: u64, limits: &Limits) -> Result<()> {
    if elements > limits.max_tensor_elements {
        let out = node.output.first().map(String::as_str).unwrap_or("?");
        bail!(
            "node {} ({}) would create tensor '{out}' of {elements} elements ({why}), over the \
             limit of {} elements (raise it with --max-tensor-elements)",
            node_label(node),
            node.op_type,
            limits.max_tensor_elements
        );
    }
    Ok(())
}

fn check_graph(g: &GraphProto, known: &Known, depth: usize, limits: &Limits) -> Result<()> {
    if depth > limits.max_subgraph_depth {
        bail!(
            "subgraphs nested more than the limit of {} deep",
            limits.max_subgraph_depth
        );
    }
    for vi in g.input.iter().chain(&g.value_info).chain(&g.output) {
        if let Some(shape) = declared_shape(vi) {
            let n = product(shape.iter().copied());
            if n > limits.max_tensor_elements {
                bail!(
                    "tensor '{}' is declared with shape {shape:?} = {n} elements, over the limit of \
                     {} elements (raise it with --max-tensor-elements)",
                    vi.name,
                    limits.max_tensor_elements
                );
            }
        }
    }
    for n in &g.node {
        if is_default_domain(&n.domain) {
            check_node(n, known, limits)?;
        }
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                check_graph(sub, known, depth + 1, limits)?;
            }
        }
    }
    Ok(())
}

fn check_node(n: &NodeProto, known: &Known, limits: &Limits) -> Result<()> {
    let inputs = NodeInputs { n, known };
    let output = match n.op_type.as_str() {
        "ConstantOfShape" => constant_of_shape(&inputs)?,
        "Expand" => expand(&inputs)?,
        "Tile" => tile(&inputs)?,
        "Range" => range(&inputs)?,
        "Resize" | "Upsample" => resize(&inputs)?,
        "OneHot" => one_hot(&inputs),
        "RandomNormal" | "RandomUniform" => random(n)?,
        _ => None,
    };
    match output {
        Some((what, elements)) => refuse(n, what, elements, limits),
        None => Ok(()),
    }
}

/// What the file states of one node's inputs.
struct NodeInputs<'a> {
    n: &'a NodeProto,
    known: &'a Known<'a>,
}

/// An output's size: how it is given (for the error) and its element count.
type OutputSize = Option<(String, u64)>;

impl NodeInputs<'_> {
    /// The values of input `i`, when it is a known constant.
    fn value(&self, i: usize) -> Option<&Vec<f64>> {
        self.name(i).and_then(|s| self.known.values.get(s))
    }

    /// The shape of input `i`, when the file states it.
    fn shape(&self, i: usize) -> Option<&Vec<u64>> {
        self.name(i).and_then(|s| self.known.shapes.get(s))
    }

    fn name(&self, i: usize) -> Option<&str> {
        self.n
            .input
            .get(i)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
}

fn constant_of_shape(inputs: &NodeInputs) -> Result<OutputSize> {
    let Some(v) = inputs.value(0) else {
        return Ok(None);
    };
    let shape = shape_values(inputs.n, "the shape input", v)?;
    Ok(Some((
        format!("shape {shape:?}"),
        product(shape.iter().copied()),
    )))
}

/// Broadcasting makes every output dim at least the shape's entry (0 stays 0).
fn expand(inputs: &NodeInputs) -> Result<OutputSize> {
    let Some(v) = inputs.value(1) else {
        return Ok(None);
    };
    let shape = shape_values(inputs.n, "the shape input", v)?;
    let out = match inputs.shape(0) {
        Some(input) => broadcast_lower_bound(input, &shape),
        None => shape,
    };
    Ok(Some((
        format!("broadcast to {out:?}"),
        product(out.iter().copied()),
    )))
}

/// The smallest shape `input` broadcast with `shape` can have (an unknown 1 taken as 1).
fn broadcast_lower_bound(input: &[u64], shape: &[u64]) -> Vec<u64> {
    let rank = shape.len().max(input.len());
    let at = |dims: &[u64], i: usize| {
        (i + dims.len())
            .checked_sub(rank)
            .map(|j| dims[j])
            .unwrap_or(1)
    };
    (0..rank)
        .map(|i| match (at(input, i), at(shape, i)) {
            (1, b) => b,
            (a, 1) => a,
            (a, b) => a.min(b),
        })
        .collect()
}

fn tile(inputs: &NodeInputs) -> Result<OutputSize> {
    let Some(v) = inputs.value(1) else {
        return Ok(None);
    };
    let repeats = shape_values(inputs.n, "the repeats input", v)?;
    let base = inputs
        .shape(0)
        .map(|s| product(s.iter().copied()))
        .unwrap_or(1);
    let elements = base.saturating_mul(product(repeats.iter().copied()));
    Ok(Some((format!("repeats {repeats:?}"), elements)))
}

fn range(inputs: &NodeInputs) -> Result<OutputSize> {
    let (Some(start), Some(limit), Some(delta)) =
        (inputs.value(0), inputs.value(1), inputs.value(2))
    else {
        return Ok(None);
    };
    let ([s], [l], [d]) = (start.as_slice(), limit.as_slice(), delta.as_slice()) else {
        return Ok(None);
    };
    if *d == 0.0 {
        bail!("node {} (Range): delta is 0", node_label(inputs.n));
    }
    let count = saturating_u64(((l - s) / d).ceil());
    Ok(Some((format!("range {s}..{l} step {d}"), count)))
}

/// `v` as a count: negative and NaN as 0, past `u64::MAX` as `u64::MAX`.
fn saturating_u64(v: f64) -> u64 {
    if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v.max(0.0) as u64
    }
}

fn resize(inputs: &NodeInputs) -> Result<OutputSize> {
    let resize = inputs.n.op_type == "Resize";
    let sizes_input = if resize { 3 } else { usize::MAX };
    let scales_input = if resize { 2 } else { 1 };
    if let Some(v) = inputs.value(sizes_input) {
        let sizes = shape_values(inputs.n, "the sizes input", v)?;
        return Ok(Some((
            format!("sizes {sizes:?}"),
            product(sizes.iter().copied()),
        )));
    }
    let (Some(scales), Some(input)) = (inputs.value(scales_input), inputs.shape(0)) else {
        return Ok(None);
    };
    if scales.len() != input.len() {
        return Ok(None);
    }
    let out: Vec<u64> = input
        .iter()
        .zip(scales)
        .map(|(&d, &s)| saturating_u64((d as f64 * s).floor()))
        .collect();
    Ok(Some((
        format!("scaled to {out:?}"),
        product(out.iter().copied()),
    )))
}

fn one_hot(inputs: &NodeInputs) -> OutputSize {
    let Some([depth]) = inputs.value(1).map(Vec::as_slice) else {
        return None;
    };
    let base = inputs
        .shape(0)
        .map(|s| product(s.iter().copied()))
        .unwrap_or(1);
    let depth = if *depth < 0.0 { 0 } else { *depth as u64 };
    Some((format!("depth {depth}"), base.saturating_mul(depth)))
}

fn random(n: &NodeProto) -> Result<OutputSize> {
    let Some(a) = n.attribute.iter().find(|a| a.name == "shape") else {
        return Ok(None);
    };
    let values: Vec<f64> = a.ints.iter().map(|&v| v as f64).collect();
    let shape = shape_values(n, "the shape attribute", &values)?;
    Ok(Some((
        format!("shape {shape:?}"),
        product(shape.iter().copied()),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::from_i64;

    fn model(nodes: Vec<NodeProto>, initializers: Vec<TensorProto>) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![crate::OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(GraphProto {
                node: nodes,
                initializer: initializers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: format!("{op}_0"),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            ..Default::default()
        }
    }

    #[test]
    fn constant_of_shape_past_the_limit_is_refused() {
        let m = model(
            vec![node("ConstantOfShape", &["s"], "y")],
            vec![from_i64("s", &[2], &[1_000_000, 1_000_000])],
        );
        let err = check_static_allocation(&m, &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ConstantOfShape_0") && err.contains("1000000000000 elements"),
            "{err}"
        );
        // Raising the limit lets it through: the check is a limit, not a ban.
        let big = Limits {
            max_tensor_elements: 1 << 40,
            ..Limits::default()
        };
        check_static_allocation(&m, &big).unwrap();
        // A small shape is fine.
        let m = model(
            vec![node("ConstantOfShape", &["s"], "y")],
            vec![from_i64("s", &[2], &[4, 4])],
        );
        check_static_allocation(&m, &Limits::default()).unwrap();
    }

    #[test]
    fn expand_tile_range_and_constant_nodes() {
        let shape_const = NodeProto {
            op_type: "Constant".into(),
            output: vec!["s".into()],
            attribute: vec![crate::attr::make_ints(
                "value_ints",
                &[1_000_000, 1, 1_000_000],
            )],
            ..Default::default()
        };
        let m = model(vec![shape_const, node("Expand", &["x", "s"], "y")], vec![]);
        let err = check_static_allocation(&m, &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("Expand_0") && err.contains("'y'"), "{err}");

        let m = model(
            vec![node("Tile", &["x", "r"], "y")],
            vec![
                crate::tensor::from_f32("x", &[2], &[1.0, 2.0]),
                from_i64("r", &[1], &[3_000_000_000]),
            ],
        );
        let err = check_static_allocation(&m, &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("6000000000 elements"), "{err}");

        let m = model(
            vec![node("Range", &["a", "b", "c"], "y")],
            vec![
                from_i64("a", &[], &[0]),
                from_i64("b", &[], &[1 << 40]),
                from_i64("c", &[], &[1]),
            ],
        );
        assert!(check_static_allocation(&m, &Limits::default()).is_err());
        let m = model(
            vec![node("Range", &["a", "b", "c"], "y")],
            vec![
                from_i64("a", &[], &[0]),
                from_i64("b", &[], &[10]),
                from_i64("c", &[], &[0]),
            ],
        );
        let err = check_static_allocation(&m, &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("delta is 0"), "{err}");
    }

    #[test]
    fn negative_shape_entries_are_named() {
        let m = model(
            vec![node("ConstantOfShape", &["s"], "y")],
            vec![from_i64("s", &[2], &[4, -3])],
        );
        let err = check_static_allocation(&m, &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("negative entry -3"), "{err}");
    }
}
