//! A read-only view of one ONNX graph for matching: who produces and who consumes each
//! tensor, constant values (initializers and `Constant` nodes), graph inputs and outputs, and
//! the static facts about shapes, element types and small values that `infer` finds by a
//! symbolic forward pass.
//!
//! - [`index`]: producers, consumers and constants ([`GraphIndex`]), with no inference;
//! - [`dim`]: symbolic dimensions ([`Dim`]) and shape arithmetic;
//! - [`value`]: small values known before run time ([`Value`]);
//! - `infer`: the forward pass, one small function per op family;
//! - [`skip`]: the nodes that are the identity at inference, which the rules look through.

pub mod dim;
pub mod index;
mod infer;
pub mod skip;
pub mod value;

use attnrt_onnx::{GraphProto, NodeProto, TensorProto};

pub use dim::{broadcast, product, shape_str, Dim};
pub use index::GraphIndex;
pub use value::{tensor_value, tensor_value_limited, Value};

/// The view: a [`GraphIndex`] and the forward pass's facts. Indices are positions in
/// `graph.node`, and after them the nodes of its subgraphs (`If`, `Loop`, `Scan` bodies), which
/// are readers of the tensors they read by name: a tensor read there is read outside any block
/// of the graph (so is never only the block's), and such a reader is never part of a match
/// ([`GraphView::in_subgraph`]).
pub struct GraphView<'a> {
    /// The graph viewed.
    pub graph: &'a GraphProto,
    index: GraphIndex<'a>,
    opset: i64,
    facts: infer::Facts,
}

impl<'a> GraphView<'a> {
    /// Builds the view of `graph` (of a model whose default-domain opset is `opset`), its
    /// subgraphs' nodes among the readers ([`GraphIndex::with_subgraphs`]), and runs the
    /// symbolic forward pass over `order` (a topological order of `graph.node`).
    pub fn new(graph: &'a GraphProto, order: &[usize], opset: i64) -> GraphView<'a> {
        GraphView::from_index(GraphIndex::with_subgraphs(graph), order, opset)
    }

    /// The view of the graph of `index`: the forward pass over `order`, as
    /// [`GraphView::new`]. Matching needs an index [`with_subgraphs`](GraphIndex::with_subgraphs)
    /// (a [`GraphIndex::new`] one does not see the tensors a subgraph reads).
    pub fn from_index(index: GraphIndex<'a>, order: &[usize], opset: i64) -> GraphView<'a> {
        GraphView {
            graph: index.graph,
            facts: infer::infer(index.graph, order),
            index,
            opset,
        }
    }

    /// The model's default-domain opset.
    pub fn opset(&self) -> i64 {
        self.opset
    }

    /// The node at `idx`.
    pub fn node(&self, idx: usize) -> &'a NodeProto {
        self.index.node(idx)
    }

    /// Whether the node at `idx` is a node of a subgraph (it reads a tensor of the graph by
    /// name, and cannot be matched or removed with the graph's nodes).
    pub fn in_subgraph(&self, idx: usize) -> bool {
        self.index.holder(idx).is_some()
    }

    /// The node at `idx` as messages name it ([`GraphIndex::label`]).
    pub fn label(&self, idx: usize) -> String {
        self.index.label(idx)
    }

    /// The index of the node producing `tensor`.
    pub fn producer(&self, tensor: &str) -> Option<usize> {
        self.index.producer(tensor)
    }

    /// The nodes reading `tensor` (each once, in graph order; a subgraph's nodes right after
    /// the node holding them).
    pub fn consumers(&self, tensor: &str) -> &[usize] {
        self.index.consumers(tensor)
    }

    /// Whether `tensor` is a graph output.
    pub fn is_graph_output(&self, tensor: &str) -> bool {
        self.index.is_graph_output(tensor)
    }

    /// Whether `tensor` is a graph input that is not also an initializer.
    pub fn is_graph_input(&self, tensor: &str) -> bool {
        self.index.is_graph_input(tensor)
    }

    /// The initializer called `tensor`.
    pub fn initializer(&self, tensor: &str) -> Option<&'a TensorProto> {
        self.index.initializer(tensor)
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
        self.index.is_constant(tensor)
    }
}
