//! The session class behind `attnrt.InferenceSession`: built once from a model (fused unless
//! told not to), it serves every input shape it is given; `run` checks the feeds against the
//! model's declared inputs (names, element types, ranks, fixed axes) before anything runs, and
//! releases the GIL while the model runs, so several Python threads can run one session.

use std::ffi::CString;

use attnrt::{
    declared_inputs, dtype_name, DeclaredDim, DeclaredInput, MemoryBudget, ModelProto, NamedTensor,
    SessionOptions, Threads,
};
use pyo3::exceptions::PyUserWarning;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{to_named_tensors, to_numpy};
use crate::signature::{signature, Arg};
use crate::{load_model, py_err, AttnrtError};

/// A model ready to run (see the module docs).
#[pyclass(module = "attnrt._attnrt", frozen)]
pub struct Session {
    session: attnrt::Session,
    declared: Vec<DeclaredInput>,
    inputs: Vec<Arg>,
    outputs: Vec<Arg>,
    report: Option<String>,
}

#[pymethods]
impl Session {
    /// `model`: a path or the bytes of an ONNX file; `fuse`: fuse attention first; `threads`:
    /// threads for the matmuls and the attention kernel (default: all cores); `max_memory`:
    /// the memory budget of a run, bytes or a size such as `8G` (default: 75% of the memory
    /// available), a run over it raising before it starts.
    #[new]
    #[pyo3(signature = (model, fuse = true, threads = None, max_memory = None))]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        fuse: bool,
        threads: Option<usize>,
        max_memory: Option<String>,
    ) -> PyResult<Session> {
        let budget = crate::memory_budget(max_memory)?;
        let (proto, what) = load_model(model)?;
        py.detach(|| build(proto, &what, fuse, threads, budget))
            .map_err(py_err)
    }

    /// The inputs that take values, as `(name, shape, type)`.
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.inputs.iter().map(|a| a.to_py(py)).collect()
    }

    /// The outputs, as `(name, shape, type)`.
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.outputs.iter().map(|a| a.to_py(py)).collect()
    }

    /// The fusion report as JSON (`None` when the session was built with `fuse=False`).
    fn fusion_report(&self) -> Option<String> {
        self.report.clone()
    }

    /// Runs the model on `feeds` (input name → numpy array); returns `(name, array)` for every
    /// output, in the graph's order.
    fn run(&self, py: Python<'_>, feeds: &Bound<'_, PyDict>) -> PyResult<Vec<(String, Py<PyAny>)>> {
        let tensors = to_named_tensors(feeds)?;
        check_feeds(&self.declared, &tensors).map_err(AttnrtError::new_err)?;
        for note in dim_name_notes(&self.declared, &tensors) {
            PyErr::warn(py, &py.get_type::<PyUserWarning>(), &CString::new(note)?, 1)?;
        }
        let outputs = py
            .detach(|| self.session.run_owned(tensors))
            .map_err(py_err)?;
        outputs
            .into_iter()
            .map(|o| Ok((o.name.clone(), to_numpy(py, &o.name, o.tensor)?)))
            .collect()
    }
}

fn build(
    model: ModelProto,
    what: &str,
    fuse: bool,
    threads: Option<usize>,
    max_memory: MemoryBudget,
) -> anyhow::Result<Session> {
    let threads = Threads::new(threads)?;
    let (model, report) = crate::fused_if(model, what, fuse)?;
    let declared = declared_inputs(&model)?;
    let (inputs, outputs) = signature(&model);
    let options = SessionOptions {
        max_memory,
        ..SessionOptions::default()
    };
    let session = attnrt::Session::new(&model, &threads, what, &options)?;
    Ok(Session {
        session,
        declared,
        inputs,
        outputs,
        report,
    })
}

/// Every declared input fed once, with its element type, rank and fixed axes; no unknown name.
/// Symbolic axes (e.g. `sequence`) are only compared for a warning ([`dim_name_notes`]).
fn check_feeds(declared: &[DeclaredInput], feeds: &[NamedTensor]) -> Result<(), String> {
    check_names_types_ranks(declared, feeds)
}

/// Feeds whose sizes differ on an axis the model gives the same name: dim names are hints (a
/// quantizer's `unk__N`, optimum's mask axis named like `input_ids'`), so the run goes on, as
/// in ONNX Runtime, with a warning; feeds that really disagree fail in the node that combines
/// them, named by the error.
fn dim_name_notes(declared: &[DeclaredInput], feeds: &[NamedTensor]) -> Vec<String> {
    let mut bound: std::collections::HashMap<&str, (usize, &str)> = Default::default();
    let mut notes = Vec::new();
    for d in declared {
        let Some(f) = feeds.iter().find(|f| f.name == d.name) else {
            continue;
        };
        for (axis, (dim, &n)) in d.dims.iter().zip(f.tensor.shape()).enumerate() {
            let DeclaredDim::Symbol(s) = dim else {
                continue;
            };
            let (m, other) = *bound.entry(s).or_insert((n, &d.name));
            if m != n {
                notes.push(format!(
                    "feed '{}' has {n} on axis {axis}, where '{s}' = {m} from feed '{other}' (dim names are hints; running with the shapes given)",
                    d.name
                ));
            }
        }
    }
    notes
}

fn check_names_types_ranks(
    declared: &[DeclaredInput],
    feeds: &[NamedTensor],
) -> Result<(), String> {
    let names: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
    if let Some(f) = feeds.iter().find(|f| !names.contains(&f.name.as_str())) {
        return Err(format!(
            "feed '{}' is not an input of the model (inputs: {})",
            f.name,
            names.join(", ")
        ));
    }
    for d in declared {
        let Some(f) = feeds.iter().find(|f| f.name == d.name) else {
            return Err(format!("input '{}' is not fed", d.name));
        };
        let (dt, shape) = (f.tensor.datum_type(), f.tensor.shape());
        if dt != d.dtype {
            return Err(format!(
                "feed '{}' is {}, the model declares {}",
                d.name,
                dtype_name(dt),
                dtype_name(d.dtype)
            ));
        }
        let fixed_ok = d.dims.iter().zip(shape).all(|(dim, &n)| match dim {
            DeclaredDim::Fixed(v) => *v == n,
            DeclaredDim::Symbol(_) => true,
        });
        if shape.len() != d.dims.len() || !fixed_ok {
            let want: Vec<String> = d
                .dims
                .iter()
                .map(|dim| match dim {
                    DeclaredDim::Fixed(v) => v.to_string(),
                    DeclaredDim::Symbol(s) => s.clone(),
                })
                .collect();
            return Err(format!(
                "feed '{}' has shape {shape:?}, the model declares [{}]",
                d.name,
                want.join(", ")
            ));
        }
    }
    Ok(())
}
