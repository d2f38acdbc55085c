//! AVX2+FMA path: 8-lane vectors, tiles of 6 keys (or value columns) × 16 queries, i.e. 12 ymm
//! accumulators + 2 operand registers + 1 broadcast (of 16).

// The shared kernel passes raw tile pointers and strides; bundling them would obscure it.
#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;

use super::EXP2_C;

type V = __m256;
const LANES: usize = 8;
const NR: usize = 2;
const MR: usize = 6;
pub(crate) const BQ: usize = LANES * NR;
/// At most this many query blocks per task (they share each packed K/V block; see
/// `flash::choose_qsub`).
pub(crate) const QSUB_MAX: usize = 8;
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

/// `2^x` (the softmax takes `(s − max)·log2 e`): `x = n + f`, `n = round(x)`, a degree-6 polynomial
/// for `2^f` (relative error < 1e-7) and `2^n` built in the exponent bits. Arguments below −126
/// (including −inf) give exactly 0 — no denormals reach the FMAs; NaN stays NaN.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn vexp2(x: V) -> V {
    let lo = _mm256_set1_ps(-126.0);
    let keep = _mm256_cmp_ps::<_CMP_NLT_UQ>(x, lo);
    // Clamped so that `n + 127` stays a valid biased exponent. `max`/`min` return their second
    // operand when one is NaN, so a NaN `x` passes through and makes the result NaN.
    let xc = _mm256_min_ps(_mm256_set1_ps(127.0), _mm256_max_ps(lo, x));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(xc);
    let f = _mm256_sub_ps(xc, n);
    let mut p = _mm256_set1_ps(EXP2_C[5]);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C[4]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C[3]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C[2]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C[1]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C[0]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0));
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let res = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    _mm256_and_ps(res, keep)
}

/// Whether every lane of `v` is exactly 1 (a softmax rescale factor that changes nothing).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vall_one(v: V) -> bool {
    _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, _mm256_set1_ps(1.0))) == 0xff
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

/// Transposes an 8×8 tile in registers: afterwards `t[c][r]` is the old `t[r][c]` (unpacks and
/// shuffles within 128-bit lanes, then one lane permute per output row).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vtranspose(t: &mut [V; LANES]) {
    let mut a = [_mm256_setzero_ps(); 8];
    for k in 0..4 {
        a[2 * k] = _mm256_unpacklo_ps(t[2 * k], t[2 * k + 1]);
        a[2 * k + 1] = _mm256_unpackhi_ps(t[2 * k], t[2 * k + 1]);
    }
    // u[4g + k]: column 4L + k of rows 4g..4g+3, in 128-bit lane L.
    let mut u = [_mm256_setzero_ps(); 8];
    for g in 0..2 {
        u[4 * g] = _mm256_shuffle_ps::<0x44>(a[4 * g], a[4 * g + 2]);
        u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(a[4 * g], a[4 * g + 2]);
        u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(a[4 * g + 1], a[4 * g + 3]);
        u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(a[4 * g + 1], a[4 * g + 3]);
    }
    for k in 0..4 {
        t[k] = _mm256_permute2f128_ps::<0x20>(u[k], u[4 + k]);
        t[4 + k] = _mm256_permute2f128_ps::<0x31>(u[k], u[4 + k]);
    }
}

flash_core!(#[target_feature(enable = "avx2,fma")]);
