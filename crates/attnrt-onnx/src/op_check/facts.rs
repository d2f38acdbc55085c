//! What the file itself states about tensors: shapes declared by graph inputs, `value_info`
//! and graph outputs, the dims of initializers and `Constant` nodes, and the values of small
//! integer constants. Nothing is inferred through nodes: a check that needs more than the
//! file states is skipped, never guessed.

use std::collections::{HashMap, HashSet};

use crate::proto::{
    tensor_proto::DataLocation, tensor_shape_proto::dimension, type_proto, AttributeProto,
    GraphProto, NodeProto, TensorProto, TensorShapeProto,
};

/// A tensor's dims: `Some(n)` where the file fixes the extent, `None` where it is symbolic.
pub(super) type Shape = Vec<Option<i64>>;

/// Constants with more elements than this are not read (an index tensor is small; reading a
/// large integer weight would only slow validation down).
const MAX_CONSTANT_VALUES: u64 = 1 << 20;

#[derive(Clone, Copy)]
enum Source<'a> {
    /// Produced in this (sub)graph with nothing stated: hides an outer tensor's facts.
    Unstated,
    /// A declared type with a shape (graph input, value_info, graph output).
    Declared(&'a TensorShapeProto),
    /// An initializer that no graph input overrides: fixed dims and values.
    Initializer(&'a TensorProto),
    /// A `Constant` node's output.
    Constant(&'a NodeProto),
}

/// The facts of one graph, falling back to those of the enclosing graphs.
pub(super) struct Facts<'a> {
    known: HashMap<&'a str, Source<'a>>,
    outer: Option<&'a Facts<'a>>,
}

impl<'a> Facts<'a> {
    /// Collects what `g` states; `outer` is the enclosing graph's facts for a subgraph.
    pub(super) fn of_graph(g: &'a GraphProto, outer: Option<&'a Facts<'a>>) -> Facts<'a> {
        let mut known = HashMap::new();
        if outer.is_some() {
            // A name produced here is this graph's tensor, whatever an outer one says.
            let produced = g.node.iter().flat_map(|n| n.output.iter());
            for name in produced.chain(g.input.iter().map(|i| &i.name)) {
                known.insert(name.as_str(), Source::Unstated);
            }
        }
        let declared = g.value_info.iter().chain(&g.output).chain(&g.input);
        for v in declared {
            if let Some(shape) = declared_shape(v.r#type.as_ref()) {
                known.insert(v.name.as_str(), Source::Declared(shape));
            }
        }
        for n in g.node.iter().filter(|n| is_constant(n)) {
            if let Some(out) = n.output.first() {
                known.insert(out.as_str(), Source::Constant(n));
            }
        }
        // An initializer listed among the inputs is only a default a feed may replace (IR < 4
        // lists them all there): its declared input shape stands, not its values.
        let inputs: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
        for t in &g.initializer {
            if !inputs.contains(t.name.as_str()) {
                known.insert(t.name.as_str(), Source::Initializer(t));
            }
        }
        Facts { known, outer }
    }

    fn source(&self, name: &str) -> Option<Source<'a>> {
        match self.known.get(name) {
            Some(s) => Some(*s),
            None => self.outer.and_then(|o| o.source(name)),
        }
    }

    /// The shape the file states for `name`, if any.
    pub(super) fn shape(&self, name: &str) -> Option<Shape> {
        match self.source(name)? {
            Source::Unstated => None,
            Source::Declared(s) => Some(s.dim.iter().map(dim_value).collect()),
            Source::Initializer(t) => Some(fixed(&t.dims)),
            Source::Constant(n) => constant_shape(n),
        }
    }

    /// The rank the file states for `name`, if any.
    pub(super) fn rank(&self, name: &str) -> Option<usize> {
        self.shape(name).map(|s| s.len())
    }

    /// The values of `name` when it is a small integer constant of the file.
    pub(super) fn ints(&self, name: &str) -> Option<Vec<i64>> {
        match self.source(name)? {
            Source::Initializer(t) => tensor_ints(t),
            Source::Constant(n) => constant_ints(n),
            Source::Unstated | Source::Declared(_) => None,
        }
    }
}

fn is_constant(n: &NodeProto) -> bool {
    n.op_type == "Constant" && crate::opset::is_default_domain(&n.domain)
}

fn declared_shape(t: Option<&crate::proto::TypeProto>) -> Option<&TensorShapeProto> {
    match t?.value.as_ref()? {
        type_proto::Value::TensorType(tt) => tt.shape.as_ref(),
        _ => None,
    }
}

fn dim_value(d: &crate::proto::tensor_shape_proto::Dimension) -> Option<i64> {
    match d.value {
        Some(dimension::Value::DimValue(v)) if v >= 0 => Some(v),
        _ => None,
    }
}

/// Tensor dims as a shape; a negative one (refused when loading, possible in a model built in
/// memory) counts as unknown.
fn fixed(dims: &[i64]) -> Shape {
    dims.iter().map(|&d| (d >= 0).then_some(d)).collect()
}

/// The dims of a `Constant` node's output, from whichever `value*` attribute it has.
fn constant_shape(n: &NodeProto) -> Option<Shape> {
    let a = constant_value(n)?;
    match a.name.as_str() {
        "value" => a.t.as_ref().map(|t| fixed(&t.dims)),
        "sparse_value" => a.sparse_tensor.as_ref().map(|s| fixed(&s.dims)),
        "value_int" | "value_float" | "value_string" => Some(Vec::new()),
        "value_ints" => Some(vec![Some(a.ints.len() as i64)]),
        "value_floats" => Some(vec![Some(a.floats.len() as i64)]),
        "value_strings" => Some(vec![Some(a.strings.len() as i64)]),
        _ => None,
    }
}

fn constant_ints(n: &NodeProto) -> Option<Vec<i64>> {
    let a = constant_value(n)?;
    match a.name.as_str() {
        "value" => tensor_ints(a.t.as_ref()?),
        "value_int" => Some(vec![a.i]),
        "value_ints" => Some(a.ints.clone()),
        _ => None,
    }
}

/// The attribute holding a `Constant` node's value (ONNX allows exactly one of them).
fn constant_value(n: &NodeProto) -> Option<&AttributeProto> {
    n.attribute
        .iter()
        .find(|a| a.name.starts_with("value") || a.name == "sparse_value")
}

/// The values of an integer tensor, unless it is large or its data does not fit its dims
/// (loading refuses that; a model built in memory is checked for it elsewhere).
fn tensor_ints(t: &TensorProto) -> Option<Vec<i64>> {
    if t.data_location == DataLocation::External as i32 {
        return None; // not read yet: nothing is known of its values
    }
    crate::tensor::element_count(&t.dims, MAX_CONSTANT_VALUES).ok()?;
    crate::tensor::to_i64(t).ok()
}

/// A shape as messages show it: `[2, ?, 64]`, `?` for a symbolic extent.
pub(super) fn show_shape(shape: &[Option<i64>]) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|d| d.map_or("?".to_string(), |v| v.to_string()))
        .collect();
    format!("[{}]", dims.join(", "))
}
