//! Element types known before run time, for rewrites that are exact for some types only.
//!
//! A TorchScript export declares types for graph inputs, outputs and initializers but rarely
//! for intermediate values, so the type of a tensor is followed back through its producers:
//! ops whose output has the type of one of their inputs (elementwise math, MatMul/Gemm, shape
//! ops, Gather's data, Where's values) lead to that input, and `Cast`, `Constant`, `Shape`
//! give a type outright. Any other op ends the walk with "unknown", and a rewrite that needs
//! the type is not made.

use std::collections::HashMap;

use attnrt_onnx::proto::{GraphProto, NodeProto};
use attnrt_onnx::{attr, opset, DataType};

/// Ops whose outputs all have the element type of input 0.
const SAME_AS_FIRST: &[&str] = &[
    "Abs",
    "Add",
    "Ceil",
    "Clip",
    "Concat",
    "Cos",
    "Div",
    "Einsum",
    "Elu",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "Gather",
    "GatherElements",
    "Gelu",
    "Gemm",
    "HardSigmoid",
    "Identity",
    "LeakyRelu",
    "Log",
    "LogSoftmax",
    "MatMul",
    "Max",
    "Min",
    "Mod",
    "Mul",
    "Neg",
    "PRelu",
    "Pad",
    "Pow",
    "Reciprocal",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceSum",
    "Relu",
    "Reshape",
    "Round",
    "Sigmoid",
    "Sin",
    "Slice",
    "Softmax",
    "Softplus",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Tanh",
    "Tile",
    "Transpose",
    "Unsqueeze",
];

/// Ops whose first output only has the element type of input 0.
const FIRST_OUTPUT_AS_FIRST: &[&str] = &["BatchNormalization", "Dropout", "LayerNormalization"];

/// Where a tensor's element type comes from.
enum TypeSource<'a> {
    Known(i32),
    Tensor(&'a str),
    Unknown,
}

/// The element types of a graph's tensors, resolved on demand and remembered.
pub(crate) struct ElemTypes<'a> {
    known: HashMap<&'a str, Option<i32>>,
    producers: HashMap<&'a str, &'a NodeProto>,
}

impl<'a> ElemTypes<'a> {
    /// What `g` declares; everything else is found by [`ElemTypes::of`].
    pub(crate) fn new(g: &'a GraphProto) -> ElemTypes<'a> {
        let known = super::declared_types(g)
            .into_iter()
            .map(|(name, t)| (name, Some(t)))
            .collect();
        let mut producers = HashMap::with_capacity(g.node.len());
        for n in &g.node {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                producers.insert(o.as_str(), n);
            }
        }
        ElemTypes { known, producers }
    }

    /// The element type (`DataType` number) of `tensor`, when it is known before run time.
    pub(crate) fn of(&mut self, tensor: &'a str) -> Option<i32> {
        let mut walked: Vec<&'a str> = Vec::new();
        let mut at = tensor;
        let found = loop {
            if let Some(t) = self.known.get(at) {
                break *t;
            }
            // A malformed graph may have a cycle: no walk is longer than the graph.
            if walked.len() > self.producers.len() {
                break None;
            }
            walked.push(at);
            let Some(node) = self.producers.get(at) else {
                break None;
            };
            match source(node, at) {
                TypeSource::Known(t) => break Some(t),
                TypeSource::Tensor(next) => at = next,
                TypeSource::Unknown => break None,
            }
        };
        for t in walked {
            self.known.insert(t, found);
        }
        found
    }
}

/// Where the type of `output` of `node` comes from.
fn source<'a>(node: &'a NodeProto, output: &str) -> TypeSource<'a> {
    if !opset::is_default_domain(&node.domain) {
        return TypeSource::Unknown;
    }
    let input = |ix: usize| match node.input.get(ix) {
        Some(i) if !i.is_empty() => TypeSource::Tensor(i.as_str()),
        _ => TypeSource::Unknown,
    };
    let op = node.op_type.as_str();
    match op {
        "Cast" => match attr::int(node, "to") {
            Ok(Some(to)) => TypeSource::Known(to as i32),
            _ => TypeSource::Unknown,
        },
        "Constant" => constant_type(node),
        "Shape" | "Size" => TypeSource::Known(DataType::Int64 as i32),
        "CastLike" | "Where" => input(1),
        _ if SAME_AS_FIRST.contains(&op) => input(0),
        _ if FIRST_OUTPUT_AS_FIRST.contains(&op)
            && node.output.first().is_some_and(|o| o == output) =>
        {
            input(0)
        }
        _ => TypeSource::Unknown,
    }
}

/// The element type of a `Constant` node's value (`value`, `value_float(s)`, `value_int(s)`).
fn constant_type(node: &NodeProto) -> TypeSource<'_> {
    for a in &node.attribute {
        match a.name.as_str() {
            "value" => {
                if let Some(t) = &a.t {
                    return TypeSource::Known(t.data_type);
                }
            }
            "value_float" | "value_floats" => return TypeSource::Known(DataType::Float as i32),
            "value_int" | "value_ints" => return TypeSource::Known(DataType::Int64 as i32),
            _ => {}
        }
    }
    TypeSource::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_onnx::attr::make_int;
    use attnrt_testkit::{float_value, node, node_with_attrs, tensor_i64, GraphBuilder};

    #[test]
    fn types_follow_producers_back_to_what_is_declared() {
        let mut g = GraphBuilder::new("g");
        g.input(float_value("x", &[2, 3]));
        g.initializer(tensor_i64("shape", &[1], &[6]));
        g.node(node("r", "Reshape", &["x", "shape"], &["flat"]));
        g.node(node("t", "Tanh", &["flat"], &["t"]));
        g.node(node("s", "Shape", &["t"], &["dims"]));
        g.node(node_with_attrs(
            "c",
            "Cast",
            &["dims"],
            &["f"],
            vec![make_int("to", 11)],
        ));
        g.node(node("n", "NonZero", &["t"], &["nz"]));
        g.node(node("m", "Mul", &["nz", "nz"], &["nz2"]));
        g.node(node("d", "Dropout", &["t"], &["dropped", "mask"]));
        let graph = g.finish();
        let mut types = ElemTypes::new(&graph);
        assert_eq!(types.of("t"), Some(DataType::Float as i32));
        assert_eq!(types.of("dims"), Some(DataType::Int64 as i32));
        assert_eq!(types.of("f"), Some(DataType::Double as i32));
        assert_eq!(types.of("dropped"), Some(DataType::Float as i32));
        // NonZero is not in the tables: unknown, and so is what follows it; a Dropout's mask
        // is not of its input's type.
        assert_eq!(types.of("nz2"), None);
        assert_eq!(types.of("mask"), None);
        assert_eq!(types.of("nowhere"), None);
    }

    #[test]
    fn a_cycle_ends_the_walk() {
        let mut g = GraphBuilder::new("g");
        g.node(node("a", "Relu", &["b"], &["a"]));
        g.node(node("b", "Relu", &["a"], &["b"]));
        let graph = g.finish();
        assert_eq!(ElemTypes::new(&graph).of("a"), None);
    }
}
