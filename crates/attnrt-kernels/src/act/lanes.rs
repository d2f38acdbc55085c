//! The activations over lane arrays (`crate::lanes`): the AVX2+FMA and portable builds, the same
//! formulas as `avx512.rs` operation for operation (fused only with `FMA`).

use super::{Activation, ERF_A as A};
use crate::lanes::{exp2_lanes, madd};

/// Values per lane array.
const L: usize = 16;

/// `act` on `N` values.
#[inline(always)]
pub(crate) fn apply<const FMA: bool, const N: usize>(act: Activation, x: [f32; N]) -> [f32; N] {
    match act {
        Activation::GeluErf => std::array::from_fn(|e| gelu_erf::<FMA>(x[e])),
        Activation::GeluTanh => gelu_tanh::<FMA, N>(x),
    }
}

/// `(x·0.5)·(erf(x·(1/√2)) + 1)`, as `avx512::gelu_erf`.
#[inline(always)]
fn gelu_erf<const FMA: bool>(x: f32) -> f32 {
    let e = erf::<FMA>(x * 2.0f32.sqrt().recip());
    (x * 0.5) * (e + 1.0)
}

/// Abramowitz & Stegun 7.1.28, as `avx512::erf`.
#[inline(always)]
fn erf<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    let mut y = A[5];
    for c in A[..5].iter().rev() {
        y = madd::<FMA>(y, a, *c);
    }
    y = y * a + 1.0;
    for _ in 0..4 {
        y *= y;
    }
    (1.0 - 1.0 / y).copysign(x)
}

/// `x / (1 + e^{−2u})`, `u = √(2/π)·(x + 0.044715·x³)`, as `avx512::gelu_tanh`.
#[inline(always)]
fn gelu_tanh<const FMA: bool, const N: usize>(x: [f32; N]) -> [f32; N] {
    let t = std::array::from_fn(|e| {
        let inner = madd::<FMA>(0.044715, x[e] * x[e] * x[e], x[e]);
        (-2.0 * 0.797_884_6 * std::f32::consts::LOG2_E * inner).clamp(-127.0, 128.0)
    });
    let p = exp2_lanes::<FMA, N>(t);
    std::array::from_fn(|e| x[e] / (1.0 + p[e]))
}

/// `act` in place over `rows` rows of `width` values, `stride` apart.
///
/// # Safety
/// As `super::apply_rows_raw`.
#[inline(always)]
unsafe fn apply_rows<const FMA: bool>(
    act: Activation,
    y: *mut f32,
    stride: usize,
    rows: usize,
    width: usize,
) {
    for r in 0..rows {
        // SAFETY: row r is the caller's.
        let row = unsafe { std::slice::from_raw_parts_mut(y.add(r * stride), width) };
        for chunk in row.chunks_mut(L) {
            let mut v = [0.0f32; L];
            v[..chunk.len()].copy_from_slice(chunk);
            let out = apply::<FMA, L>(act, v);
            chunk.copy_from_slice(&out[..chunk.len()]);
        }
    }
}

/// [`super::apply_rows_raw`] compiled for AVX2+FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA; the rows are the caller's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn apply_rows_avx2(
    act: Activation,
    y: *mut f32,
    stride: usize,
    rows: usize,
    width: usize,
) {
    // SAFETY: as the caller vouches.
    unsafe { apply_rows::<true>(act, y, stride, rows, width) }
}

/// [`super::apply_rows_raw`] for the baseline target.
///
/// # Safety
/// The rows are the caller's.
pub(super) unsafe fn apply_rows_portable(
    act: Activation,
    y: *mut f32,
    stride: usize,
    rows: usize,
    width: usize,
) {
    // SAFETY: as the caller vouches.
    unsafe { apply_rows::<false>(act, y, stride, rows, width) }
}
