//! The activations on AVX-512F vectors, applied by the panel kernel's stores and by
//! [`super::apply_rows_raw`].

use std::arch::x86_64::*;

use super::{Activation, ERF_A as A};
use crate::flash::avx512::vexp2;

/// [`super::apply_rows_raw`] with AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F; the rows are the caller's, as `apply_rows_raw` says.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn apply_rows(
    act: Activation,
    y: *mut f32,
    stride: usize,
    rows: usize,
    width: usize,
) {
    for r in 0..rows {
        let row = y.add(r * stride);
        let mut c = 0;
        while c < width {
            let lanes = (width - c).min(16);
            let m: __mmask16 = if lanes == 16 {
                0xffff
            } else {
                (1u16 << lanes) - 1
            };
            let v = _mm512_maskz_loadu_ps(m, row.add(c));
            _mm512_mask_storeu_ps(row.add(c), m, apply(act, v));
            c += 16;
        }
    }
}

/// `act` on 16 values.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn apply(act: Activation, x: __m512) -> __m512 {
    match act {
        Activation::GeluErf => gelu_erf(x),
        Activation::GeluTanh => gelu_tanh(x),
    }
}

/// `(x·0.5)·(erf(x·(1/√2)) + 1)`, the operations of tract's f32 `Gelu` (exact form).
#[target_feature(enable = "avx512f")]
#[inline]
fn gelu_erf(x: __m512) -> __m512 {
    let scaled = _mm512_mul_ps(x, _mm512_set1_ps(2.0f32.sqrt().recip()));
    let e = erf(scaled);
    let one = _mm512_set1_ps(1.0);
    _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5)), _mm512_add_ps(e, one))
}

/// Abramowitz & Stegun 7.1.28, in the order of tract-linalg's AVX-512 `erf`.
#[target_feature(enable = "avx512f")]
#[inline]
fn erf(x: __m512) -> __m512 {
    let sign_bit = _mm512_set1_epi32(i32::MIN);
    let xi = _mm512_castps_si512(x);
    let sign = _mm512_and_si512(xi, sign_bit);
    let a = _mm512_castsi512_ps(_mm512_andnot_si512(sign_bit, xi));
    let mut y = _mm512_set1_ps(A[5]);
    for c in A[..5].iter().rev() {
        y = _mm512_fmadd_ps(y, a, _mm512_set1_ps(*c));
    }
    y = _mm512_mul_ps(y, a);
    let one = _mm512_set1_ps(1.0);
    y = _mm512_add_ps(y, one);
    for _ in 0..4 {
        y = _mm512_mul_ps(y, y);
    }
    let r = _mm512_sub_ps(one, _mm512_div_ps(one, y));
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign))
}

/// `0.5·x·(1 + tanh(u)) = x / (1 + e^{−2u})`, `u = √(2/π)·(x + 0.044715·x³)`: the second
/// form has no cancellation where `tanh(u)` is near −1 (large negative `x`).
#[target_feature(enable = "avx512f")]
#[inline]
fn gelu_tanh(x: __m512) -> __m512 {
    let x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    let inner = _mm512_fmadd_ps(_mm512_set1_ps(0.044715), x3, x);
    // −2u in base 2: e^{−2u} = 2^{−2u·log2 e} (the attention kernel's `2^x`), clamped where
    // 2^t is 0 or inf in f32 anyway.
    let t = _mm512_mul_ps(
        _mm512_set1_ps(-2.0 * 0.797_884_6 * std::f32::consts::LOG2_E),
        inner,
    );
    let t = _mm512_min_ps(
        _mm512_max_ps(t, _mm512_set1_ps(-127.0)),
        _mm512_set1_ps(128.0),
    );
    _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), vexp2(t)))
}
