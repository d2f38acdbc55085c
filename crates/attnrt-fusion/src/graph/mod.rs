//! A read-only view of one ONNX graph for matching: who produces and who consumes each
//! tensor, constant values (initializers and `Constant` nodes), graph inputs and outputs, and
//! the static facts about shapes, element types and small values that `infer` finds by a
//! symbolic forward pass.
//!
//! - [`dim`]: symbolic dimensions ([`Dim`]) and shape arithmetic;
//! - [`value`]: small values known before run time ([`Value`]);
//! - `infer`: the forward pass, one small function per op family;
//! - [`skip`]: the nodes that are the identity at inference, which the rules look through.

pub mod dim;
mod infer;
pub mod skip;
pub mod value;

use std::collections::{HashMap, HashSet};

use attnrt_onnx::{GraphProto, NodeProto, TensorProto};

pub use dim::{broadcast, product, shape_str, Dim};
pub use value::{tensor_value, tensor_value_limited, Value};

/// The view. Indices are positions in `graph.node`.
pub struct GraphView<'a> {
    /// The graph viewed.
    pub graph: &'a GraphProto,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    initializers: HashMap<&'a str, &'a TensorProto>,
    graph_outputs: HashSet<&'a str>,
    graph_inputs: HashSet<&'a str>,
    opset: i64,
    facts: infer::Facts,
}

impl<'a> GraphView<'a> {
    /// Builds the view of `graph` (of a model whose default-domain opset is `opset`) and runs
    /// the symbolic forward pass over `order` (a topological order).
    pub fn new(graph: &'a GraphProto, order: &[usize], opset: i64) -> GraphView<'a> {
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, n) in graph.node.iter().enumerate() {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                producer.insert(o.as_str(), i);
            }
            for inp in n.input.iter().filter(|o| !o.is_empty()) {
                let c = consumers.entry(inp.as_str()).or_default();
                if c.last() != Some(&i) {
                    c.push(i);
                }
            }
        }
        GraphView {
            graph,
            producer,
            consumers,
            initializers: graph
                .initializer
                .iter()
                .map(|t| (t.name.as_str(), t))
                .collect(),
            graph_outputs: graph.output.iter().map(|o| o.name.as_str()).collect(),
            graph_inputs: graph.input.iter().map(|o| o.name.as_str()).collect(),
            opset,
            facts: infer::infer(graph, order),
        }
    }

    /// The model's default-domain opset.
    pub fn opset(&self) -> i64 {
        self.opset
    }

    /// The node at `idx`.
    pub fn node(&self, idx: usize) -> &'a NodeProto {
        &self.graph.node[idx]
    }

    /// The index of the node producing `tensor`.
    pub fn producer(&self, tensor: &str) -> Option<usize> {
        self.producer.get(tensor).copied()
    }

    /// The nodes reading `tensor` (each once, in graph order).
    pub fn consumers(&self, tensor: &str) -> &[usize] {
        self.consumers.get(tensor).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether `tensor` is a graph output.
    pub fn is_graph_output(&self, tensor: &str) -> bool {
        self.graph_outputs.contains(tensor)
    }

    /// Whether `tensor` is a graph input that is not also an initializer.
    pub fn is_graph_input(&self, tensor: &str) -> bool {
        self.graph_inputs.contains(tensor) && !self.initializers.contains_key(tensor)
    }

    /// The initializer called `tensor`.
    pub fn initializer(&self, tensor: &str) -> Option<&'a TensorProto> {
        self.initializers.get(tensor).copied()
    }

    /// The static shape facts known for `tensor`.
    pub fn shape(&self, tensor: &str) -> Option<&[Dim]> {
        self.facts.shapes.get(tensor).map(Vec::as_slice)
    }

    /// The rank of `tensor`, when known.
    pub fn rank(&self, tensor: &str) -> Option<usize> {
        self.shape(tensor).map(<[Dim]>::len)
    }

    /// The value of `tensor` known before run time (constant or computed from shapes).
    pub fn value(&self, tensor: &str) -> Option<&Value> {
        self.facts.values.get(tensor)
    }

    /// The element type (`DataType` as i32) of `tensor`, when known.
    pub fn elem_type(&self, tensor: &str) -> Option<i32> {
        self.facts.elem_types.get(tensor).copied()
    }

    /// Whether `tensor`'s value is fixed in the model file (initializer or a `Constant` node),
    /// as opposed to computed from run-time shapes.
    pub fn is_constant(&self, tensor: &str) -> bool {
        if self.initializers.contains_key(tensor) && !self.graph_inputs.contains(tensor) {
            return true;
        }
        matches!(
            self.producer(tensor).map(|p| self.node(p).op_type.as_str()),
            Some("Constant")
        )
    }
}
