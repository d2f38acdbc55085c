//! attnrt's Python extension module (`attnrt._attnrt`), wrapped by the `attnrt` package in
//! `python/attnrt/__init__.py`, which gives it onnxruntime's shape.
//!
//! - `fuse_model`: a model (path or bytes) → the fused model's bytes and the fusion report as
//!   JSON (the `report` of `attnrt fuse --json`);
//! - `session::Session`: a session on the fused (or original) model, serving every input
//!   shape; `run` takes numpy arrays by name and releases the GIL while the model runs;
//! - `generator::DecoderModel`, `generator::Generation`: a decoder with a KV cache (with its
//!   encoder, for an encoder–decoder) and generations on it, one step at a time (behind
//!   `attnrt.Model` and `attnrt.Generator`);
//! - every error is an `attnrt.AttnrtError` carrying attnrt's one-line message (a panic inside
//!   attnrt is caught by the runtime and reported the same way; none crosses into Python).

mod convert;
mod generator;
mod session;
mod signature;

/// mimalloc, as the CLI: it keeps freed blocks for reuse, so a decode loop's `present_*` tensors
/// are not page-faulted in afresh every step. Built with its `local_dynamic_tls` feature: this
/// module is loaded with `dlopen`, where mimalloc's default initial-exec TLS does not fit
/// ("cannot allocate memory in static TLS block").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;

use attnrt::{FusionOptions, Limits, Message, ModelProto};
use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

create_exception!(
    _attnrt,
    AttnrtError,
    PyRuntimeError,
    "An error from attnrt: a model, input or feed it cannot take, with the file, node or tensor named."
);

/// Converts an attnrt error to the Python exception, keeping its whole chain on one line.
pub(crate) fn py_err(e: anyhow::Error) -> PyErr {
    AttnrtError::new_err(format!("{e:#}"))
}

/// `model` fused when `fuse` (its report as JSON beside it), else as given; `what` names it in
/// the error.
pub(crate) fn fused_if(
    model: ModelProto,
    what: &str,
    fuse: bool,
) -> anyhow::Result<(ModelProto, Option<String>)> {
    if !fuse {
        return Ok((model, None));
    }
    let fused = attnrt::fuse(&model).map_err(|e| e.context(format!("{what}: fusion failed")))?;
    Ok((fused.model, Some(serde_json::to_string(&fused.report)?)))
}

/// The memory budget of `max_memory=` (bytes, or a size such as `8G`), else the machine's
/// default; its error tells the user to raise `max_memory=`.
pub(crate) fn memory_budget(max_memory: Option<String>) -> PyResult<attnrt::MemoryBudget> {
    let budget = match max_memory {
        Some(size) => {
            attnrt::MemoryBudget::parse(&size).map_err(|e| py_err(e.context("max_memory")))?
        }
        None => attnrt::MemoryBudget::machine_default(),
    };
    Ok(budget.raised_with("max_memory="))
}

/// A model given as a path (`str`/`os.PathLike`) or as the bytes of an ONNX file.
pub(crate) fn load_model(model: &Bound<'_, PyAny>) -> PyResult<(ModelProto, String)> {
    let limits = Limits::default();
    if let Ok(bytes) = model.cast::<PyBytes>() {
        let what = "<bytes>".to_string();
        let loaded =
            attnrt::load_model_from_bytes(bytes.as_bytes(), &what, Path::new("."), &limits)
                .map_err(py_err)?;
        return Ok((loaded.0, what));
    }
    let path: std::path::PathBuf = model.extract().map_err(|_| {
        AttnrtError::new_err(
            "model must be a path (str or os.PathLike) or the bytes of an ONNX file",
        )
    })?;
    let loaded = attnrt::load_model(&path, &limits).map_err(py_err)?;
    Ok((loaded.model, path.display().to_string()))
}

/// Fuses `model` (a path or bytes); returns the fused model's bytes and the report as JSON.
#[pyfunction]
#[pyo3(signature = (model, strict = false, gelu = true))]
fn fuse_model<'py>(
    py: Python<'py>,
    model: &Bound<'py, PyAny>,
    strict: bool,
    gelu: bool,
) -> PyResult<(Bound<'py, PyBytes>, String)> {
    let (proto, what) = load_model(model)?;
    let options = FusionOptions { strict, gelu };
    let fused = py
        .detach(|| attnrt::fuse_with(&proto, &options))
        .map_err(|e| py_err(e.context(format!("{what}: fusion failed"))))?;
    let report = serde_json::to_string(&fused.report).map_err(|e| py_err(e.into()))?;
    Ok((PyBytes::new(py, &fused.model.encode_to_vec()), report))
}

/// Writes `data` to `path` atomically (a temporary file renamed into place: no partial file).
#[pyfunction]
fn write_atomic(path: std::path::PathBuf, data: &[u8]) -> PyResult<()> {
    attnrt::write_atomic(&path, data).map_err(py_err)
}

#[pymodule]
fn _attnrt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("AttnrtError", m.py().get_type::<AttnrtError>())?;
    m.add_function(wrap_pyfunction!(fuse_model, m)?)?;
    m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
    m.add_class::<session::Session>()?;
    m.add_class::<generator::DecoderModel>()?;
    m.add_class::<generator::Generation>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
