//! AVX2+FMA path: 8-lane vectors, tiles of 6 keys (or value columns) × 16 queries, i.e. 12 ymm
//! accumulators + 2 operand registers + 1 broadcast (of 16).

// The shared kernel passes raw tile pointers and strides; bundling them would obscure it.
#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;

type V = __m256;
const LANES: usize = 8;
const NR: usize = 2;
const MR: usize = 6;
pub(crate) const BQ: usize = LANES * NR;
/// Query blocks per task (they share each packed K/V block).
pub(crate) const QSUB: usize = 8;
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
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
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

/// Prefetch hint (into all cache levels); never faults.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vprefetch(p: *const f32) {
    // A prefetch is a hint and never dereferences the pointer architecturally (safe intrinsic).
    _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
}

/// The first `live` lanes gather `base[idx[lane]]`, the others are 0 (and read nothing).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn vgather(base: *const f32, idx: *const i32, live: usize) -> V {
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(live as i32), lane));
    let offsets = _mm256_loadu_si256(idx as *const __m256i);
    _mm256_mask_i32gather_ps::<4>(_mm256_setzero_ps(), base, offsets, on)
}

flash_core!(#[target_feature(enable = "avx2,fma")]);
