//! The body of attnrt's model fuzzer, shared by the cargo-fuzz target (`fuzz/`) and the
//! stable, time-bounded harness (`tests/tests/hostile_fuzz.rs`).
//!
//! One input is the bytes of a model file. It goes through what `attnrt fuse` does with an
//! untrusted file: decode with limits, resolve tensors (no external data: the fuzzer's folder
//! is empty, so every external reference must fail cleanly), validate, check static
//! allocations, fuse, validate the fused model and encode it. Any panic, or a fused model
//! that fails validation, is a finding. Errors are the expected outcome for most inputs.

#![allow(dead_code)] // each includer uses part of it

use std::path::Path;

use attnrt_onnx::{
    check_static_allocation, load_model_from_bytes, Limits, Message, ValidationError,
};

/// Limits small enough that one fuzz input stays fast, large enough for the shipped models.
pub fn fuzz_limits() -> Limits {
    Limits {
        max_model_bytes: 8 << 20,
        max_tensor_elements: 1 << 22,
        max_nodes: 20_000,
        max_subgraph_depth: 16,
        max_external_bytes: 1 << 20,
    }
}

/// How far one input got; used by the stable harness to show the fuzzer reaches fusion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reached {
    /// Refused by decoding / loading.
    Load,
    /// Refused by the validator (which loading runs).
    Validate,
    /// Refused by the static allocation check.
    Allocation,
    /// Fusion returned an error.
    FuseError,
    /// Fusion succeeded (fused or not) and its output is valid.
    Fused,
    /// Fusion fused at least one block and its output is valid.
    FusedBlocks,
}

/// Runs one fuzz input. Panics (the finding) when fusion produces an invalid model.
pub fn fuzz_one(data: &[u8], dir: &Path) -> Reached {
    let limits = fuzz_limits();
    let model = match load_model_from_bytes(data, "fuzz-input.onnx", dir, &limits) {
        Ok((model, _)) => model,
        // Loading validates (structure and operator rules) once the tensors are read.
        Err(e) if e.downcast_ref::<ValidationError>().is_some() => return Reached::Validate,
        Err(_) => return Reached::Load,
    };
    if check_static_allocation(&model, &limits).is_err() {
        return Reached::Allocation;
    }
    let fused = match attnrt_fusion::fuse(&model, &Default::default()) {
        Ok(f) => f,
        Err(_) => return Reached::FuseError,
    };
    // What `attnrt fuse` would write must be a valid model, and survive a round trip.
    if let Err(e) = attnrt_onnx::validate_model(&fused.model) {
        panic!("fusion produced an invalid model: {e}");
    }
    let bytes = fused.model.encode_to_vec();
    let again =
        attnrt_onnx::ModelProto::decode(bytes.as_slice()).expect("re-decoding the fused model");
    // Compared as bytes: a NaN attribute makes the models unequal to themselves.
    assert!(
        again.encode_to_vec() == bytes,
        "the fused model does not round-trip"
    );
    let _ = fused.report.summary_lines();
    let _ = fused.report.explain_lines();
    if fused.report.blocks.is_empty() {
        Reached::Fused
    } else {
        Reached::FusedBlocks
    }
}
