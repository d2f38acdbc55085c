//! AVX-512F path: 16-lane vectors, tiles of 6 keys (or value columns) × 64 queries, i.e. 24 zmm
//! accumulators + 4 operand registers + 1 broadcast.

use std::arch::x86_64::*;

type V = __m512;
const LANES: usize = 16;
const NR: usize = 4;
const MR: usize = 6;
pub(crate) const BQ: usize = LANES * NR;
pub(crate) const BK: usize = 96;

#[target_feature(enable = "avx512f")]
#[inline]
fn vzero() -> V {
    _mm512_setzero_ps()
}
#[target_feature(enable = "avx512f")]
#[inline]
fn vsplat(x: f32) -> V {
    _mm512_set1_ps(x)
}
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn vload(p: *const f32) -> V {
    _mm512_loadu_ps(p)
}
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn vstore(p: *mut f32, v: V) {
    _mm512_storeu_ps(p, v)
}
#[target_feature(enable = "avx512f")]
#[inline]
fn vfma(a: V, b: V, c: V) -> V {
    _mm512_fmadd_ps(a, b, c)
}
#[target_feature(enable = "avx512f")]
#[inline]
fn vmul(a: V, b: V) -> V {
    _mm512_mul_ps(a, b)
}
#[target_feature(enable = "avx512f")]
#[inline]
fn vadd(a: V, b: V) -> V {
    _mm512_add_ps(a, b)
}
#[target_feature(enable = "avx512f")]
#[inline]
fn vsub(a: V, b: V) -> V {
    _mm512_sub_ps(a, b)
}
#[target_feature(enable = "avx512f")]
#[inline]
fn vmax(a: V, b: V) -> V {
    _mm512_max_ps(a, b)
}

/// `e^x` for the softmax (arguments ≤ 0 in practice): Cody–Waite reduction `x = n·ln2 + r`,
/// Cephes' degree-6 polynomial for `e^r` (≈1 ulp), `scalef` for `2^n`. Arguments below −87
/// (including −inf) give exactly 0, so masked keys contribute nothing; NaN stays NaN.
#[target_feature(enable = "avx512f")]
#[inline]
fn vexp(x: V) -> V {
    let lo = _mm512_set1_ps(-87.0);
    let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, lo);
    // max(lo, x)/min(hi, x) return x when x is NaN (second operand), so NaN propagates.
    let x = _mm512_min_ps(_mm512_set1_ps(88.0), _mm512_max_ps(lo, x));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_199_9e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.000_000_1e-1));
    let r2 = _mm512_mul_ps(r, r);
    let y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
    _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(y, n))
}

/// `v` with `−inf` lanes replaced by 0 (the safe softmax reference of a still-empty row).
#[target_feature(enable = "avx512f")]
#[inline]
fn vzero_if_neg_inf(v: V) -> V {
    let is_neg_inf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, _mm512_set1_ps(f32::NEG_INFINITY));
    _mm512_mask_mov_ps(v, is_neg_inf, _mm512_setzero_ps())
}

flash_core!(#[target_feature(enable = "avx512f")]);
