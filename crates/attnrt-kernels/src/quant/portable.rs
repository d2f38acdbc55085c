//! The portable build of the integer steps (the AVX2 build's reference, and its tails): the
//! range, scale and zero point of `DynamicQuantizeLinear`, the quantization of a row, the
//! `QuantizeLinear` → `DequantizeLinear` round trip, the widening of narrow panels.

use super::Requantize;

/// `(min(0, min x), max(0, max x))`, NaNs ignored: a value replaces the minimum only when it is
/// below it (so −0 never does), as tract-onnx folds it.
pub(crate) fn range(x: &[f32]) -> (f32, f32) {
    x.iter().fold((0.0, 0.0), |(lo, hi), &v| {
        if v < lo {
            (v, hi)
        } else if v > hi {
            (lo, v)
        } else {
            (lo, hi)
        }
    })
}

/// The scale and zero point of `DynamicQuantizeLinear` for the range `[min, max]` (which holds
/// 0): in f32, as ONNX and tract-onnx compute them (a NaN zero point, from a zero range, is 0).
pub(crate) fn scale_and_zero_point(min: f32, max: f32) -> (f32, u8) {
    let scale = (max - min) / 255.0;
    // A NaN stays NaN through `clamp` and casts to 0, the zero point ONNX gives a zero range.
    let zero_point = (-min / scale).round_ties_even().clamp(0.0, 255.0);
    (scale, zero_point as u8)
}

/// One row of `DynamicQuantizeLinear`, each value minus the zero point: `out[p] =
/// saturate(round(x[p] / scale) + zp) − zp`.
pub(crate) fn quantize(x: &[f32], scale: f32, zero_point: u8, out: &mut [i16]) {
    let zp = i32::from(zero_point);
    for (o, &v) in out.iter_mut().zip(x) {
        // `as` saturates, and a NaN becomes 0.
        let q = ((v / scale).round_ties_even() as i32).saturating_add(zp);
        *o = (q.clamp(0, 255) - zp) as i16;
    }
}

/// ONNX `QuantizeLinear` to `to` with one scale and zero point (`linear.rs`), one value at a
/// time: the AVX2 build's reference and its tail.
pub(crate) fn quantize_linear(
    x: &[f32],
    scale: f32,
    zero_point: f32,
    to: super::Quantized,
    out: &mut [u8],
) {
    for (o, &v) in out.iter_mut().zip(x) {
        let q = quantize_value(v, scale, zero_point, to);
        *o = match to {
            super::Quantized::U8 => q as u8,
            super::Quantized::I8 => q as i8 as u8,
        };
    }
}

/// One value of ONNX `QuantizeLinear` to `to`, as an integer in `to`'s range.
#[inline(always)]
pub(crate) fn quantize_value(v: f32, scale: f32, zero_point: f32, to: super::Quantized) -> i32 {
    let (lo, hi) = to.bounds();
    let r = (v / scale).round_ties_even();
    let r = if r.is_nan() { 0.0 } else { r };
    (r + zero_point).max(lo).min(hi) as i32
}

/// [`super::requantize_linear`] one value at a time: the AVX2 build's reference and its tail.
pub(super) fn requantize(x: &[f32], requantize: Requantize, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = requantize.apply(v);
    }
}

/// `out[i] = p[i]` as i16 (the AVX2 build's reference).
pub(super) fn widen(p: &[i8], out: &mut [i16]) {
    for (o, &v) in out.iter_mut().zip(p) {
        *o = i16::from(v);
    }
}

/// [`super::Requantize::apply`] to each of `y` in place (the AVX2 build's reference and tail).
///
/// # Safety
/// None (`unsafe` for the type it shares with the AVX2 build).
pub(super) unsafe fn requantize_in_place(y: &mut [f32], requantize: Requantize) {
    for y in y {
        *y = requantize.apply(*y);
    }
}
