//! AVX2+FMA path: 8-lane vectors, tiles of 6 keys (or value columns) × 16 queries, i.e. 12 ymm
//! accumulators + 2 operand registers + 1 broadcast (of 16).

use std::arch::x86_64::*;

type V = __m256;
const LANES: usize = 8;
const NR: usize = 2;
const MR: usize = 6;
pub(crate) const BQ: usize = LANES * NR;
pub(crate) const BK: usize = 96;

#[target_feature(enable = "avx2,fma")]
#[inline]
fn vzero() -> V {
    _mm256_setzero_ps()
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vsplat(x: f32) -> V {
    _mm256_set1_ps(x)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn vload(p: *const f32) -> V {
    _mm256_loadu_ps(p)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn vstore(p: *mut f32, v: V) {
    _mm256_storeu_ps(p, v)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vfma(a: V, b: V, c: V) -> V {
    _mm256_fmadd_ps(a, b, c)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vmul(a: V, b: V) -> V {
    _mm256_mul_ps(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vadd(a: V, b: V) -> V {
    _mm256_add_ps(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vsub(a: V, b: V) -> V {
    _mm256_sub_ps(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vmax(a: V, b: V) -> V {
    _mm256_max_ps(a, b)
}

/// `e^x` as in the AVX-512 path, with `2^n` built in the exponent bits (`n ∈ [−126, 127]` after
/// clamping, so always a normal number). Arguments below −87 give exactly 0; NaN stays NaN.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vexp(x: V) -> V {
    let lo = _mm256_set1_ps(-87.0);
    let keep = _mm256_cmp_ps::<_CMP_NLT_UQ>(x, lo);
    let x = _mm256_min_ps(_mm256_set1_ps(88.0), _mm256_max_ps(lo, x));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.000_000_1e-1));
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    let res = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    _mm256_and_ps(res, keep)
}

/// `v` with `−inf` lanes replaced by 0 (the safe softmax reference of a still-empty row).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vzero_if_neg_inf(v: V) -> V {
    let is_neg_inf = _mm256_cmp_ps::<_CMP_EQ_OQ>(v, _mm256_set1_ps(f32::NEG_INFINITY));
    _mm256_andnot_ps(is_neg_inf, v)
}

flash_core!(#[target_feature(enable = "avx2,fma")]);
