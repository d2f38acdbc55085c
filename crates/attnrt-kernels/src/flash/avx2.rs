//! AVX2+FMA path: 8-lane vectors, tiles of 6 keys (or value columns) × 16 queries, i.e. 12 ymm
//! accumulators + 2 operand registers + 1 broadcast (of 16).

use std::arch::x86_64::*;

use super::simd::FlashSimd;
use super::{task, Job, Scratch};
use crate::lanes::EXP2_C;

/// The AVX2+FMA build of the kernel.
pub(crate) struct Avx2;

// SAFETY: the methods use AVX2 and FMA only (the trait's contract: called from `task` below,
// compiled for them, on a CPU that has them); the tiles are within `check_tiles`' bounds.
unsafe impl FlashSimd for Avx2 {
    type V = __m256;
    type Tile = [__m256; 8];
    const LANES: usize = 8;
    const NR: usize = 2;
    const MR: usize = 6;
    const BK: usize = 96;
    const QSUB_MAX: usize = 8;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn zero_tile() -> [__m256; 8] {
        [_mm256_setzero_ps(); 8]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn exp2(x: __m256) -> __m256 {
        vexp2(x)
    }
    #[inline(always)]
    unsafe fn all_one(v: __m256) -> bool {
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, _mm256_set1_ps(1.0))) == 0xff
    }
    #[inline(always)]
    unsafe fn zero_if_neg_inf(v: __m256) -> __m256 {
        let is_neg_inf = _mm256_cmp_ps::<_CMP_EQ_OQ>(v, _mm256_set1_ps(f32::NEG_INFINITY));
        _mm256_andnot_ps(is_neg_inf, v)
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        // A prefetch is a hint and never dereferences the pointer architecturally.
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn gather(base: *const f32, idx: *const i32, live: usize) -> __m256 {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(live as i32), lane));
        let offsets = _mm256_loadu_si256(idx as *const __m256i);
        _mm256_mask_i32gather_ps::<4>(_mm256_setzero_ps(), base, offsets, on)
    }
    #[inline(always)]
    unsafe fn transpose(t: &mut [__m256; 8]) {
        vtranspose(t)
    }
}

/// One task of the kernel, compiled for AVX2+FMA (the generic body and [`Avx2`]'s methods
/// inline into it).
///
/// # Safety
/// The CPU must have AVX2 and FMA; see [`task::run_task`].
#[target_feature(enable = "avx2,fma")]
unsafe fn run_task(job: &Job, t: usize, sc: &mut Scratch) {
    task::run_task::<Avx2, { Avx2::NR }>(job, t, sc)
}

/// Runs every task of `job` on the current rayon pool.
///
/// # Safety
/// The CPU must have AVX2 and FMA, and `job` must come from views validated by
/// `Problem::check`.
pub(crate) unsafe fn run(job: &Job) {
    task::run::<Avx2>(job, run_task)
}

/// `2^x` (the softmax takes `(s − max)·log2 e`): `x = n + f`, `n = round(x)`, a degree-6 polynomial
/// for `2^f` (relative error < 1e-7) and `2^n` built in the exponent bits. Arguments below −126
/// (including −inf) give exactly 0 — no denormals reach the FMAs; NaN stays NaN.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn vexp2(x: __m256) -> __m256 {
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

/// Transposes an 8×8 tile in registers: afterwards `t[c][r]` is the old `t[r][c]` (unpacks and
/// shuffles within 128-bit lanes, then one lane permute per output row).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn vtranspose(t: &mut [__m256; 8]) {
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
