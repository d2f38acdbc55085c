//! AVX-512F path: 16-lane vectors, tiles of 6 keys (or value columns) × 64 queries, i.e. 24 zmm
//! accumulators + 4 operand registers + 1 broadcast.

use std::arch::x86_64::*;

use super::simd::FlashSimd;
use super::{task, Job, Scratch};
use crate::lanes::EXP2_C;

/// The AVX-512F build of the kernel.
pub(crate) struct Avx512;

// SAFETY: the methods use AVX-512F only (the trait's contract: called from `task` below,
// compiled for it, on a CPU that has it); the tiles are within `check_tiles`' bounds.
unsafe impl FlashSimd for Avx512 {
    type V = __m512;
    type Tile = [__m512; 16];
    const LANES: usize = 16;
    const NR: usize = 4;
    const MR: usize = 6;
    const BK: usize = 64;
    const QSUB_MAX: usize = 16;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn zero_tile() -> [__m512; 16] {
        [_mm512_setzero_ps(); 16]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn exp2(x: __m512) -> __m512 {
        vexp2(x)
    }
    #[inline(always)]
    unsafe fn all_one(v: __m512) -> bool {
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, _mm512_set1_ps(1.0)) == 0xffff
    }
    #[inline(always)]
    unsafe fn zero_if_neg_inf(v: __m512) -> __m512 {
        let is_neg_inf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, _mm512_set1_ps(f32::NEG_INFINITY));
        _mm512_mask_mov_ps(v, is_neg_inf, _mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        // A prefetch is a hint and never dereferences the pointer architecturally.
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn gather(base: *const f32, idx: *const i32, live: usize) -> __m512 {
        let k: __mmask16 = if live >= 16 {
            0xffff
        } else {
            (1u16 << live) - 1
        };
        let offsets = _mm512_loadu_si512(idx as *const __m512i);
        _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), k, offsets, base)
    }
    #[inline(always)]
    unsafe fn transpose(t: &mut [__m512; 16]) {
        vtranspose(t)
    }
}

/// One task of the kernel, compiled for AVX-512F (the generic body and [`Avx512`]'s methods
/// inline into it).
///
/// # Safety
/// The CPU must have AVX-512F; see [`task::run_task`].
#[target_feature(enable = "avx512f")]
unsafe fn run_task(job: &Job, t: usize, sc: &mut Scratch) {
    task::run_task::<Avx512, { Avx512::NR }>(job, t, sc)
}

/// Runs every task of `job` on the current rayon pool.
///
/// # Safety
/// The CPU must have AVX-512F, and `job` must come from views validated by `Problem::check`.
pub(crate) unsafe fn run(job: &Job) {
    task::run::<Avx512>(job, run_task)
}

/// `2^x` for the softmax, which takes `(s − max)·log2 e`: `x = n + f` with `n = round(x)`, `|f| ≤ 1/2`, a degree-6
/// polynomial for `2^f` (relative error < 1e-7 in f32), `scalef` for `2^n`. Ten vector
/// operations, against thirteen for `e^x` with a Cody–Waite reduction.
/// Arguments below −126 (including −inf, whose reduction is NaN) give exactly 0: masked keys
/// contribute nothing and no denormal reaches the FMAs (denormal operands are slow on x86). A
/// NaN argument stays NaN.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn vexp2(x: __m512) -> __m512 {
    let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(-126.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(EXP2_C[5]);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C[4]));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C[3]));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C[2]));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C[1]));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C[0]));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    _mm512_maskz_scalef_ps(keep, p, n)
}

/// Transposes a 16×16 tile in registers: afterwards `t[c][r]` is the old `t[r][c]`. Four rounds
/// of shuffles (unpack within 128-bit lanes at 32 and 64 bits, then two lane shuffles).
#[target_feature(enable = "avx512f")]
#[inline]
fn vtranspose(t: &mut [__m512; 16]) {
    let mut a = [_mm512_setzero_ps(); 16];
    for k in 0..8 {
        a[2 * k] = _mm512_unpacklo_ps(t[2 * k], t[2 * k + 1]);
        a[2 * k + 1] = _mm512_unpackhi_ps(t[2 * k], t[2 * k + 1]);
    }
    // u[4g + k]: column 4L + k of rows 4g..4g+3, in 128-bit lane L.
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (lo0, hi0) = (_mm512_castps_pd(a[4 * g]), _mm512_castps_pd(a[4 * g + 2]));
        let (lo1, hi1) = (
            _mm512_castps_pd(a[4 * g + 1]),
            _mm512_castps_pd(a[4 * g + 3]),
        );
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, hi0));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, hi0));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo1, hi1));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo1, hi1));
    }
    for k in 0..4 {
        let a0 = _mm512_shuffle_f32x4::<0x88>(u[k], u[4 + k]);
        let b0 = _mm512_shuffle_f32x4::<0xDD>(u[k], u[4 + k]);
        let c0 = _mm512_shuffle_f32x4::<0x88>(u[8 + k], u[12 + k]);
        let d0 = _mm512_shuffle_f32x4::<0xDD>(u[8 + k], u[12 + k]);
        t[k] = _mm512_shuffle_f32x4::<0x88>(a0, c0);
        t[8 + k] = _mm512_shuffle_f32x4::<0xDD>(a0, c0);
        t[4 + k] = _mm512_shuffle_f32x4::<0x88>(b0, d0);
        t[12 + k] = _mm512_shuffle_f32x4::<0xDD>(b0, d0);
    }
}
