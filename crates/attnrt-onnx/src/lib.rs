//! ONNX models for attnrt: the schema (prost types generated from `proto/onnx.proto`),
//! loading with external data confined to the model's folder, atomic saving, structural and
//! operator-level validation (run by loading, fusing, saving and every session), and helpers
//! to read tensors and attributes.
//!
//! A model file is untrusted input. Every size is checked against [`Limits`] before anything
//! is allocated for it, and every error names the file, node or tensor it is about.

pub mod attr;
pub mod branch;
pub mod budget;
pub mod limits;
pub mod load;
pub mod mapped;
pub mod op_check;
pub mod opset;
pub mod passthrough;
pub mod save;
pub mod stream;
pub mod tensor;
pub mod validate;

/// The generated ONNX schema types (`ModelProto`, `GraphProto`, `NodeProto`, ...).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

pub use budget::{format_bytes, MemoryBudget};
pub use limits::check_static_allocation;
pub use load::{decode_model, decode_model_shared, load_model, load_model_from_bytes, LoadedModel};
pub use op_check::OpError;
/// prost's `Message` trait, so users can encode and decode the schema types
/// (`model.encode_to_vec()`, `ModelProto::decode(bytes)`) without depending on prost themselves.
pub use prost::Message;
pub use proto::{
    attribute_proto::AttributeType, tensor_proto::DataType, AttributeProto, FunctionProto,
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, ValueInfoProto,
};
pub use save::{save_model, SaveOptions};
pub use validate::{validate_model, ValidationError};

/// Bounds on what a model may make attnrt do. Defaults are generous for real models and
/// small enough that a hostile file cannot exhaust the machine; every one can be raised.
///
/// The default ([`Limits::within`] the machine's default [`MemoryBudget`]) lowers the fixed
/// ceilings to what that budget holds, so that a tensor within the element limit fits in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest model file (protobuf part) accepted, in bytes.
    pub max_model_bytes: u64,
    /// Largest number of elements of any one tensor (initializer, constant, external data).
    pub max_tensor_elements: u64,
    /// Largest number of nodes, counted over the main graph, all subgraphs and functions.
    pub max_nodes: usize,
    /// Deepest nesting of subgraphs (If/Loop/Scan bodies) accepted.
    pub max_subgraph_depth: usize,
    /// Largest total of external data read, in bytes.
    pub max_external_bytes: u64,
}

impl Limits {
    /// The ceiling of [`Limits::max_model_bytes`]: protobuf's own limit, 2 GiB.
    pub const MODEL_BYTES: u64 = 2 << 30;
    /// The ceiling of [`Limits::max_tensor_elements`]: 2^32.
    pub const TENSOR_ELEMENTS: u64 = 1 << 32;
    /// The ceiling of [`Limits::max_external_bytes`]: 16 GiB.
    pub const EXTERNAL_BYTES: u64 = 16 << 30;

    /// The default limits lowered to what `budget` holds: files and external data no larger than
    /// the budget, and no more tensor elements than it holds at 8 bytes each (int64, float64),
    /// so that any tensor within the limit fits whatever its element type.
    pub fn within(budget: &MemoryBudget) -> Limits {
        let bytes = budget.bytes();
        Limits {
            max_model_bytes: Self::MODEL_BYTES.min(bytes),
            max_tensor_elements: Self::TENSOR_ELEMENTS.min(bytes / 8),
            max_nodes: 1_000_000,
            max_subgraph_depth: 32,
            max_external_bytes: Self::EXTERNAL_BYTES.min(bytes),
        }
    }
}

impl Default for Limits {
    /// [`Limits::within`] the machine's default [`MemoryBudget`].
    fn default() -> Self {
        Limits::within(&MemoryBudget::machine_default())
    }
}

/// The number of nodes of a graph and of all its subgraphs.
pub fn count_nodes(graph: &GraphProto) -> usize {
    graph
        .node
        .iter()
        .map(|n| {
            1 + n
                .attribute
                .iter()
                .map(|a| {
                    a.g.iter()
                        .chain(a.graphs.iter())
                        .map(count_nodes)
                        .sum::<usize>()
                })
                .sum::<usize>()
        })
        .sum()
}

/// A display name for a node: its name, or `op_type` and first output when it has none.
pub fn node_label(node: &NodeProto) -> String {
    if node.name.is_empty() {
        format!(
            "<{} -> {}>",
            node.op_type,
            node.output.first().map(String::as_str).unwrap_or("?")
        )
    } else {
        node.name.clone()
    }
}
