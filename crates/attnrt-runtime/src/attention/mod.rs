//! The ONNX `Attention` operator (opsets 23 and 24, with the post-release errata) on attnrt's
//! kernel.
//!
//! tract-onnx's op register is keyed by `op_type` only (the domain is ignored) and a later insert
//! replaces the built-in builder, so registering this module's parser (the op registry does)
//! makes every `Attention` node — the ones attnrt's fusion emits and the ones exporters already
//! wrote — run here.
//!
//! What this module owns is the ONNX-level part of the op: 3-D ↔ 4-D layouts (as strided views,
//! no transpose is materialised), attribute defaults, `past_key`/`past_value` concatenation into
//! `present_key`/`present_value`, mask broadcasting, the opset-24 `nonpad_kv_seqlen` padding
//! input, f16 ↔ f32, and `qk_matmul_output`. The arithmetic itself is
//! `attnrt_kernels::attention` (flash-style; its decode path for `Lq ≤ 4`, reading the keys and
//! values from `present_*` in place) and, only for the optional `qk_matmul_output`,
//! `attnrt_kernels::reference::scores`.
//!
//! Memory: f32 inputs are read in place from tract's tensors (no copy), the kernel writes `Y`
//! straight into the output tensor, and `present_*` are built directly in their output tensors;
//! the only other buffers are the f32 conversions of f16 inputs/outputs and the kernel's own
//! per-thread scratch. `nonpad_kv_seqlen` costs nothing: each batch runs on its first
//! `nonpad_kv_seqlen[b]` keys (views cut short), never an `Lq×Lk` mask.
//!
//! Everything the op cannot do exactly is refused with an error naming the node, never
//! approximated: unknown attributes (e.g. the opset-25 window sizes), element types other than
//!
//! The module is split by job: [`semantics`] is the op as ONNX defines it (inputs, attributes,
//! defaults, shape rules, type inference), [`typed`] the runnable op tract plans, `layout`
//! the buffers and strided views (3-D ↔ 4-D, `present_*`, mask broadcasting, f16 ↔ f32),
//! `problem` the bridge to the kernel (per-batch calls, causal offsets, `qk_matmul_output`)
//! and `eval` one evaluation from tract's values to the outputs.

mod eval;
mod layout;
mod problem;
pub mod semantics;
pub mod typed;

use crate::tract_parser::OnnxParser;

pub use semantics::AttentionOp;
pub use typed::{AttentionKernelOp, OP_NAME};

/// attnrt's builder for `Attention`, in place of tract's own (registered by the op registry).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("Attention", semantics::build_attention);

#[cfg(test)]
mod tests;
