//! Small tensor values known before run time: constants and the results of shape arithmetic.

use attnrt_onnx::proto::tensor_proto::DataType;
use attnrt_onnx::{tensor, TensorProto};

use super::dim::Dim;

/// A small tensor value known before run time (constants and shape computations).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Integers (possibly symbolic, e.g. the output of `Shape`), with the tensor's dims.
    Ints(Vec<i64>, Vec<Dim>),
    /// Floating point numbers, with the tensor's dims.
    Floats(Vec<i64>, Vec<f64>),
    /// Booleans, with the tensor's dims.
    Bools(Vec<i64>, Vec<bool>),
}

impl Value {
    /// The tensor's dims.
    pub fn dims(&self) -> &[i64] {
        match self {
            Value::Ints(d, _) | Value::Floats(d, _) | Value::Bools(d, _) => d,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Value::Ints(_, v) => v.len(),
            Value::Floats(_, v) => v.len(),
            Value::Bools(_, v) => v.len(),
        }
    }

    /// Whether the value has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same elements with other dims.
    pub fn with_dims(&self, dims: Vec<i64>) -> Value {
        match self {
            Value::Ints(_, v) => Value::Ints(dims, v.clone()),
            Value::Floats(_, v) => Value::Floats(dims, v.clone()),
            Value::Bools(_, v) => Value::Bools(dims, v.clone()),
        }
    }

    /// The single float this value holds (any rank with one element).
    pub fn scalar_f64(&self) -> Option<f64> {
        match self {
            Value::Floats(_, v) if v.len() == 1 => Some(v[0]),
            Value::Ints(_, v) if v.len() == 1 => v[0].as_known().map(|x| x as f64),
            _ => None,
        }
    }

    /// The integers, when all of them are known.
    pub fn known_ints(&self) -> Option<Vec<i64>> {
        match self {
            Value::Ints(_, v) => v.iter().map(Dim::as_known).collect(),
            _ => None,
        }
    }
}

/// Largest constant (in elements) whose values the view keeps for reasoning.
pub const MAX_VALUE_ELEMENTS: usize = 1 << 16;

/// The value of a small constant tensor.
pub fn tensor_value(t: &TensorProto) -> Option<Value> {
    tensor_value_limited(t, MAX_VALUE_ELEMENTS)
}

/// The value of a constant tensor of at most `limit` elements (stored in the file, not as
/// external data).
pub fn tensor_value_limited(t: &TensorProto, limit: usize) -> Option<Value> {
    let n = tensor::element_count(&t.dims, limit as u64).ok()? as usize;
    if n > limit || !t.external_data.is_empty() {
        return None;
    }
    let dims = t.dims.clone();
    let dt = DataType::try_from(t.data_type).ok()?;
    let v = match dt {
        DataType::Bool => Value::Bools(
            dims,
            tensor::to_i64(t)
                .ok()?
                .into_iter()
                .map(|x| x != 0)
                .collect(),
        ),
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16 => {
            Value::Floats(
                dims,
                tensor::to_f32(t)
                    .ok()?
                    .into_iter()
                    .map(|x| x as f64)
                    .collect(),
            )
        }
        _ => Value::Ints(
            dims,
            tensor::to_i64(t)
                .ok()?
                .into_iter()
                .map(Dim::known)
                .collect(),
        ),
    };
    (v.len() == n).then_some(v)
}

/// The value of `v` after `Cast(to)`, rounded to the target type where that matters.
pub fn cast_value(v: &Value, to: i32) -> Option<Value> {
    let to = DataType::try_from(to).ok()?;
    let is_float = matches!(
        to,
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16
    );
    let is_int = matches!(
        to,
        DataType::Int64
            | DataType::Int32
            | DataType::Int16
            | DataType::Int8
            | DataType::Uint8
            | DataType::Uint16
            | DataType::Uint32
            | DataType::Uint64
    );
    match v {
        Value::Ints(d, x) if is_int => Some(Value::Ints(d.clone(), x.clone())),
        Value::Ints(d, x) if is_float => {
            let k: Option<Vec<f64>> = x.iter().map(|d| d.as_known().map(|v| v as f64)).collect();
            // Rounding to the target float type matters for exactness of later arithmetic.
            let k = k?
                .into_iter()
                .map(|v| {
                    if to == DataType::Float {
                        v as f32 as f64
                    } else {
                        v
                    }
                })
                .collect();
            Some(Value::Floats(d.clone(), k))
        }
        Value::Floats(d, x) if is_float => Some(Value::Floats(
            d.clone(),
            x.iter()
                .map(|&v| {
                    if to == DataType::Float {
                        v as f32 as f64
                    } else {
                        v
                    }
                })
                .collect(),
        )),
        Value::Floats(d, x) if is_int => Some(Value::Ints(
            d.clone(),
            x.iter().map(|&v| Dim::known(v.trunc() as i64)).collect(),
        )),
        Value::Bools(d, x) if to == DataType::Bool => Some(Value::Bools(d.clone(), x.clone())),
        _ => None,
    }
}
