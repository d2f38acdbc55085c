//! A model's inputs and outputs as onnxruntime's `NodeArg` shows them: name, shape (ints for
//! fixed axes, strings for symbolic ones, `None` where nothing is declared) and a type string
//! such as `tensor(float)`.

use attnrt::onnx::proto::{tensor_shape_proto::dimension, type_proto, ValueInfoProto};
use attnrt::ModelProto;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

/// One axis as onnxruntime reports it.
#[derive(Clone, Debug)]
pub(crate) enum Axis {
    Fixed(i64),
    Symbol(String),
    Unknown,
}

/// One graph input or output.
#[derive(Clone, Debug)]
pub(crate) struct Arg {
    pub name: String,
    pub shape: Option<Vec<Axis>>,
    pub type_name: String,
}

impl Arg {
    /// `(name, shape, type)` for the Python side, which makes a `NodeArg` of it.
    pub fn to_py(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let shape: Option<Vec<Py<PyAny>>> = self
            .shape
            .as_ref()
            .map(|axes| {
                axes.iter()
                    .map(|a| match a {
                        Axis::Fixed(v) => v.into_py_any(py),
                        Axis::Symbol(s) => s.into_py_any(py),
                        Axis::Unknown => Ok(py.None()),
                    })
                    .collect::<PyResult<_>>()
            })
            .transpose()?;
        (self.name.clone(), shape, self.type_name.clone()).into_py_any(py)
    }
}

/// onnxruntime's type string for an ONNX element type.
fn type_string(elem: i32) -> String {
    let t = match elem {
        1 => "float",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "double",
        12 => "uint32",
        13 => "uint64",
        16 => "bfloat16",
        _ => "unknown",
    };
    format!("tensor({t})")
}

fn arg(v: &ValueInfoProto) -> Arg {
    let tensor = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => Some(t),
        _ => None,
    };
    let shape = tensor.and_then(|t| t.shape.as_ref()).map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(dimension::Value::DimValue(v)) => Axis::Fixed(*v),
                Some(dimension::Value::DimParam(p)) if !p.is_empty() => Axis::Symbol(p.clone()),
                _ => Axis::Unknown,
            })
            .collect()
    });
    Arg {
        name: v.name.clone(),
        shape,
        type_name: tensor.map_or("unknown".into(), |t| type_string(t.elem_type)),
    }
}

/// The graph inputs that take values (initializers excluded), and the graph outputs.
pub(crate) fn signature(model: &ModelProto) -> (Vec<Arg>, Vec<Arg>) {
    let Some(g) = model.graph.as_ref() else {
        return (vec![], vec![]);
    };
    let inits: std::collections::HashSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    let inputs = g
        .input
        .iter()
        .filter(|i| !inits.contains(i.name.as_str()))
        .map(arg)
        .collect();
    (inputs, g.output.iter().map(arg).collect())
}
