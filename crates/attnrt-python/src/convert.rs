//! numpy arrays ↔ attnrt tensors, element type by element type (no reinterpretation: a feed
//! of another type than the model declares is refused by the session, not cast).

use attnrt::{f16, Datum, NamedTensor, Tensor};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::IntoPyObjectExt;

use crate::AttnrtError;

/// Calls `$body` with `$t` bound to the Rust element type of every type attnrt feeds.
macro_rules! for_each_element {
    ($m:ident) => {
        $m!(f32, f64, f16, i64, i32, i16, i8, u8, u16, u32, u64, bool)
    };
}

/// A feed: a numpy array of any supported element type, copied into a tensor.
pub(crate) fn to_tensor(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let Ok(untyped) = value.cast::<PyUntypedArray>() else {
        return Err(AttnrtError::new_err(format!(
            "feed '{name}' is a {}, not a numpy array",
            value.get_type().name()?
        )));
    };
    macro_rules! try_types {
        ($($t:ty),*) => {
            $(
                if let Ok(a) = untyped.cast::<PyArrayDyn<$t>>() {
                    return Ok(Tensor::from(a.readonly().as_array().to_owned()));
                }
            )*
        };
    }
    for_each_element!(try_types);
    Err(AttnrtError::new_err(format!(
        "feed '{name}' has numpy dtype {}, which attnrt cannot feed",
        untyped.dtype()
    )))
}

/// Feeds by name (a dict of name → numpy array), each copied into a tensor.
pub(crate) fn to_named_tensors(feeds: &Bound<'_, PyDict>) -> PyResult<Vec<NamedTensor>> {
    let mut tensors = Vec::with_capacity(feeds.len());
    for (k, v) in feeds.iter() {
        let name: String = k
            .extract()
            .map_err(|_| AttnrtError::new_err("feed names must be strings"))?;
        let tensor = to_tensor(&name, &v)?;
        tensors.push(NamedTensor { name, tensor });
    }
    Ok(tensors)
}

/// An output tensor as a new numpy array of the same element type.
pub(crate) fn to_numpy(py: Python<'_>, name: &str, t: Tensor) -> PyResult<Py<PyAny>> {
    let dt = t.datum_type();
    macro_rules! try_types {
        ($($t:ty),*) => {
            $(
                if dt == <$t as Datum>::datum_type() {
                    let a = t.into_plain_array::<$t>().map_err(|e| crate::py_err(e.into()))?;
                    return numpy::PyArray::from_owned_array(py, a).into_py_any(py);
                }
            )*
        };
    }
    for_each_element!(try_types);
    Err(AttnrtError::new_err(format!(
        "output '{name}' has element type {dt:?}, which has no numpy equivalent here"
    )))
}
