//! attnrt: run ONNX models exported from PyTorch on CPUs with their attention fused.
//!
//! attnrt finds every multi-head-attention subgraph an exporter wrote, replaces each with one
//! standard ONNX `Attention` node, runs the model on tract with that node on attnrt's own
//! kernel, and proves the result by diffing it against the unfused graph. It also explains,
//! for every candidate, why it was or was not fused.
//!
//! The common job is four calls: [`load`] → [`fuse`] (with its [`FusionReport`]) →
//! [`session`] → [`Session::run`]. A [`Session`] serves every input shape it is given (plans
//! are made per shape and kept), and is `Sync`: share it between threads.
//!
//! ```
//! # fn main() -> anyhow::Result<()> {
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/bert_eager.ts.onnx");
//! let model = attnrt::load(path)?;
//! let fused = attnrt::fuse(&model)?;
//! for line in fused.report.summary_lines() {
//!     println!("{line}");
//! }
//! let session = attnrt::session(&fused.model)?;
//! // Seeded random inputs for every declared input (or read them: `harness::read_npz_tensors`).
//! let inputs = attnrt::random_inputs(&model, 0)?;
//! let outputs = session.run(&inputs)?;
//! assert_eq!(outputs.len(), session.output_names().len());
//!
//! // The same inputs on the unfused graph agree within the default tolerance of each dtype.
//! let reference = attnrt::session(&model)?.run(&inputs)?;
//! let diffs = attnrt::harness::diff_outputs(&outputs, &reference, attnrt::harness::ToleranceChoice::ByDtype);
//! assert!(diffs.iter().all(|d| d.ok));
//! # Ok(())
//! # }
//! ```
//!
//! The parts, re-exported whole: [`onnx`] (load, validate and save models), [`fusion`] (find
//! and fuse attention blocks, explain every candidate), [`runtime`] (sessions on tract with
//! attnrt's attention kernel); what a program on attnrt (the `attnrt` command, the Python
//! package) uses of them is re-exported at the top of this crate too. This crate adds [`harness`] (inputs from files or random data,
//! diffs, timing, and [`harness::compare()`], the fuse → run fused → run unfused → diff pipeline
//! behind `attnrt run`) and [`generate`] (decoders with a key/value cache, token by token).
//! `examples/fuse_and_run.rs` and `examples/explain.rs` show both jobs end to end.

#![warn(missing_docs)]

pub mod generate;
pub mod harness;

use std::path::Path;

use anyhow::Result;

pub use attnrt_fusion as fusion;
pub use attnrt_onnx as onnx;
pub use attnrt_runtime as runtime;

// Models: load (with limits, from a file or bytes), validate, save.
pub use attnrt_onnx::save::write_atomic;
pub use attnrt_onnx::{
    load_model, load_model_from_bytes, save_model, Limits, LoadedModel, MemoryBudget, Message,
    ModelProto, SaveOptions,
};
// Fusion: the fused model, its report, and a block's graph for Graphviz.
pub use attnrt_fusion::{block_dot, Fused, FusionOptions, FusionReport};
// Sessions: options, threads, tensors, what ran and where the time went.
pub use attnrt_runtime::{
    declared_inputs, dtype_name, f16, half_as_float_report, kernel_isa, panic_is_guarded, Datum,
    DatumType, DeclaredDim, DeclaredInput, HalfAsFloat, NamedTensor, OpCounts, Profile,
    ProfileReport, Session, SessionOptions, ShapePolicy, Tensor, Threads,
};

/// Loads an ONNX model (external data read from the model's folder), under the default
/// [`Limits`], and validates it (structure and operator rules); every error names the file.
pub fn load(path: impl AsRef<Path>) -> Result<ModelProto> {
    Ok(attnrt_onnx::load_model(path.as_ref(), &Limits::default())?.model)
}

/// Fuses every attention block of `model` that is provably exact; [`Fused::report`] lists the
/// blocks fused and every near miss with the check that failed.
pub fn fuse(model: &ModelProto) -> Result<Fused> {
    fuse_with(model, &FusionOptions::default())
}

/// [`fuse`] with these options (strict blocks only, GELUs left as exported...).
pub fn fuse_with(model: &ModelProto, options: &FusionOptions) -> Result<Fused> {
    attnrt_fusion::fuse(model, options)
}

/// A session for `model` on all cores, with the default [`SessionOptions`] (plans per input
/// shape, kept in a bounded cache).
pub fn session(model: &ModelProto) -> Result<Session> {
    let threads = Threads::new(None)?;
    Session::new(
        model,
        &threads,
        model_name(model),
        &SessionOptions::default(),
    )
}

/// Seeded random values for every declared input of `model` (symbolic dims at their defaults:
/// 1 for batch-like names, 16 otherwise; integer inputs below the smallest embedding table they
/// index; inputs named like masks set to ones). See [`harness::prepare_inputs`] for more
/// control.
pub fn random_inputs(model: &ModelProto, seed: u64) -> Result<Vec<NamedTensor>> {
    let options = harness::InputOptions {
        seed,
        ..Default::default()
    };
    Ok(harness::prepare_inputs(model, &options)?.tensors)
}

fn model_name(model: &ModelProto) -> &str {
    match model.graph.as_ref().map(|g| g.name.as_str()) {
        Some(n) if !n.is_empty() => n,
        _ => "model",
    }
}
