//! attnrt's execution layer.
//!
//! - [`session`]: a tract-onnx session built from an in-memory `ModelProto`, with input facts
//!   taken from the actual input tensors (which binds symbolic dims), optimized and planned, on a
//!   thread pool shared by tract's matmuls and attnrt's kernel ([`Threads`]), built as
//!   [`SessionOptions`] say.
//! - `registry.rs`: every execution op attnrt adds to tract or runs in place of tract's, in one
//!   list (how it is parsed, its name, what it counts as in [`OpCounts`], its switch);
//!   `lower/`: the graph rewrites made before tract parses a model, in one ordered list.
//! - [`attention`]: attnrt's parser for the ONNX `Attention` op (opsets 23 and 24), replacing
//!   tract's, so every `Attention` node runs on `attnrt_kernels`.
//! - [`projection`]: `MatMul` by a constant weight (the projections) on attnrt's projection
//!   kernels.
//! - [`quant_projection`]: the projections of dynamically quantized models (int8 weights) as
//!   one op on attnrt's exact integer kernels.
//! - [`matmul_integer`]: `MatMulInteger` by a constant weight on the same integer kernels.
//! - `projection_core.rs`: what those three ops (and `packed.rs`'s) share: the shape rules of
//!   `x: [..., K]` by a constant `W: [K, N]`, the output fact, the row-major eval.
//! - [`layer_norm`]: `LayerNormalization` as one op over rows.
//! - [`gelu`]: `Gelu` split over the session's threads.
//! - [`broadcast_binary`]: float32 `Add`/`Sub`/`Mul`/`Div` that tract's optimized plan leaves on
//!   its generic broadcast, on attnrt's broadcast kernel.
//! - [`gather`]: `Gather` with its indices checked (tract's indexes without a bounds check).
//! - [`tensor`]: named tensors, and the inputs a model declares.
//! - [`plan`]: plans per input shape, kept in a bounded cache.
//! - [`memory`]: the memory a planned run needs, checked against the session's
//!   [`MemoryBudget`] before it runs.
//! - [`profile`]: where a run's time goes, per op kind and per node
//!   ([`Session::run_profiled`]).
//!
//! The harness around a run (input files, random inputs, diffs, timing, the fused-vs-unfused
//! comparison) is `attnrt::harness`, in the facade crate: this crate is graph → session →
//! outputs.

#![warn(missing_docs)]

pub mod attention;
pub mod broadcast_binary;
pub mod divide;
mod embedding;
mod flatten;
pub mod gather;
pub mod gelu;
mod guard;
mod integer_to_float;
mod kernels;
pub mod kv_store;
pub mod layer_norm;
mod lower;
pub mod matmul_integer;
pub mod memory;
mod ops;
pub mod options;
mod packed;
pub mod plan;
pub mod profile;
pub mod projection;
mod projection_core;
pub mod quant_pins;
pub mod quant_projection;
mod quantize_linear;
mod registry;
pub mod session;
mod shape_check;
mod symbolic_mul;
pub mod tensor;
pub mod threads;
mod tract_parser;
mod weights;

pub use attnrt_onnx::MemoryBudget;
pub use guard::panic_is_guarded;
pub use kv_store::KvStore;
pub use lower::{half_as_float_report, HalfAsFloat};
pub use memory::MemoryEstimate;
pub use options::{SessionOptions, ShapePolicy};
pub use plan::PlanStats;
pub use profile::{NodeTime, OpTime, Profile, ProfileReport};
pub use registry::{onnx_frontend, onnx_frontend_with, OpCounts};
pub use session::Session;
pub use tensor::{declared_inputs, dtype_name, DeclaredDim, DeclaredInput, NamedTensor};
pub use threads::Threads;
/// tract's tensor type, used for every input and output value.
pub use tract_onnx::prelude::{f16, Datum, DatumType, Tensor};

use std::time::Instant;

use anyhow::Result;
use attnrt_onnx::ModelProto;

/// The outputs of one run, with how long building and running took.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Outputs in graph order.
    pub outputs: Vec<NamedTensor>,
    /// Time to parse, type, optimize and plan the graph, in milliseconds.
    pub build_ms: f64,
    /// Time of the one run, in milliseconds.
    pub run_ms: f64,
    /// What the planned graph ran, by implementation.
    pub ops: OpCounts,
    /// Where the run's time went, when it was profiled ([`run_once_with_options`]).
    pub profile: Option<Profile>,
}

/// The name of the ISA attnrt's kernels run on in sessions of this process (`ATTNRT_KERNEL_ISA`,
/// else the best the CPU has), or `None` when that choice is unusable (then a session fails to
/// build, with the reason).
pub fn kernel_isa() -> Option<String> {
    kernels::of_process().map(|k| k.isa().to_string())
}

/// Builds a session for `model` planned for the shapes of `inputs`, with the default options
/// otherwise ([`SessionOptions::per_shape`]), and runs it once on `inputs`.
pub fn run_once(
    model: &ModelProto,
    inputs: &[NamedTensor],
    threads: &Threads,
    what: &str,
) -> Result<RunResult> {
    run_once_with_options(
        model,
        inputs,
        threads,
        what,
        &SessionOptions::per_shape(),
        false,
    )
}

/// [`run_once`] (every node timed with `profile`: [`RunResult::profile`]) on a session with
/// these `options` (e.g. tract's ops, another memory budget); [`ShapePolicy::PerShape`] plans
/// for exactly these inputs.
pub fn run_once_with_options(
    model: &ModelProto,
    inputs: &[NamedTensor],
    threads: &Threads,
    what: &str,
    options: &SessionOptions,
    profile: bool,
) -> Result<RunResult> {
    run_once_in_session(model, inputs, threads, what, options, profile).map(|(_, run)| run)
}

/// [`run_once_with_options`], returning the session too: while it lives, another session
/// built from the same model bytes (the unfused path beside the fused one, which shares its
/// initializers) takes its packed weights and constants instead of making them again.
pub fn run_once_in_session(
    model: &ModelProto,
    inputs: &[NamedTensor],
    threads: &Threads,
    what: &str,
    options: &SessionOptions,
    profile: bool,
) -> Result<(Session, RunResult)> {
    let t = Instant::now();
    let session = Session::build_with_options(model, inputs, threads, what, options)?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let (outputs, profile) = if profile {
        let (outputs, profile) = session.run_profiled(inputs)?;
        (outputs, Some(profile))
    } else {
        (session.run(inputs)?, None)
    };
    let run_ms = t.elapsed().as_secs_f64() * 1e3;
    let run = RunResult {
        outputs,
        build_ms,
        run_ms,
        ops: session.op_counts(),
        profile,
    };
    Ok((session, run))
}
