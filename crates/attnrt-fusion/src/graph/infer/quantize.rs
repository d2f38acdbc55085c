//! The ops of quantized models (ONNX Runtime's quantizer writes them around every projection and
//! embedding): `QuantizeLinear`, `DequantizeLinear`, `DynamicQuantizeLinear`, `MatMulInteger`.
//! Inferring them keeps the shape proofs on the values' own shapes; without them the pass would
//! fall back to the shapes the quantizer declared, whose dims it names `unk__N`, and no mask or
//! head split could be proven.

use attnrt_onnx::{attr, DataType, NodeProto};

use super::facts::Facts;
use super::linalg::matmul_shape;
use crate::graph::dim::Dim;

/// `DequantizeLinear(x, scale, zero_point)`: `x`'s shape, in the scale's element type (or the
/// `output_dtype` attribute's, opset 23).
pub(super) fn dequantize_linear(f: &mut Facts, n: &NodeProto) {
    let ty = output_dtype(n).or_else(|| input_type(f, n, 1));
    if let Some(t) = ty {
        f.set_type(n, 0, t);
    }
    let s = f.in_shape(n, 0);
    f.set(n, 0, s, None);
}

/// `QuantizeLinear(x, scale, zero_point)`: `x`'s shape, in the zero point's element type (or
/// `output_dtype`'s; uint8 when neither is given).
pub(super) fn quantize_linear(f: &mut Facts, n: &NodeProto) {
    let ty = input_type(f, n, 2)
        .or_else(|| output_dtype(n))
        .unwrap_or(DataType::Uint8 as i32);
    f.set_type(n, 0, ty);
    let s = f.in_shape(n, 0);
    f.set(n, 0, s, None);
}

/// `DynamicQuantizeLinear(x) -> (y, y_scale, y_zero_point)`: `y` of `x`'s shape in uint8, and
/// two scalars.
pub(super) fn dynamic_quantize_linear(f: &mut Facts, n: &NodeProto) {
    f.set_type(n, 0, DataType::Uint8 as i32);
    f.set_type(n, 1, DataType::Float as i32);
    f.set_type(n, 2, DataType::Uint8 as i32);
    let s = f.in_shape(n, 0);
    f.set(n, 0, s, None);
    f.set(n, 1, Some(Vec::<Dim>::new()), None);
    f.set(n, 2, Some(Vec::<Dim>::new()), None);
}

/// `MatMulInteger(a, b, a_zero_point, b_zero_point)`: `MatMul`'s shape, in int32.
pub(super) fn matmul_integer(f: &mut Facts, n: &NodeProto) {
    f.set_type(n, 0, DataType::Int32 as i32);
    if let Some(s) = matmul_shape(f, n) {
        f.set(n, 0, Some(s), None);
    }
}

fn input_type(f: &Facts, n: &NodeProto, i: usize) -> Option<i32> {
    n.input
        .get(i)
        .filter(|s| !s.is_empty())
        .and_then(|t| f.elem_types.get(t))
        .copied()
}

/// The `output_dtype` attribute, when set (0 means "from the other inputs").
fn output_dtype(n: &NodeProto) -> Option<i32> {
    attr::int(n, "output_dtype")
        .ok()
        .flatten()
        .filter(|&t| t != 0)
        .map(|t| t as i32)
}
