//! The AVX2 build: the range and quantization of `DynamicQuantizeLinear` over 8 floats at a
//! time, and the integer micro-kernels (`MR` rows × `NR` columns, and one row × `NR` columns
//! for a decode step; `vpmaddwd` into i32, on i8 or i16 weights).
//! Each function gives the portable one's result exactly (the tests compare them).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{MR, NR};

/// [`super::portable::range`] on AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn range(x: &[f32]) -> (f32, f32) {
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for c in chunks {
        // SAFETY: `c` holds 8 floats.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        // `min(v, lo)` is `v < lo ? v : lo`: a NaN or a −0 keeps `lo`, as the portable fold.
        lo = _mm256_min_ps(v, lo);
        hi = _mm256_max_ps(v, hi);
    }
    let (mut los, mut his) = ([0f32; 8], [0f32; 8]);
    // SAFETY: 8 floats each.
    unsafe {
        _mm256_storeu_ps(los.as_mut_ptr(), lo);
        _mm256_storeu_ps(his.as_mut_ptr(), hi);
    }
    let (tlo, thi) = super::portable::range(tail);
    let lo = los.iter().fold(tlo, |a, &v| if v < a { v } else { a });
    let hi = his.iter().fold(thi, |a, &v| if v > a { v } else { a });
    (lo, hi)
}

/// [`super::portable::quantize`] on AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize(x: &[f32], scale: f32, zero_point: u8, out: &mut [i16]) {
    let n = x.len().min(out.len());
    let whole = n / 8 * 8;
    let s = _mm256_set1_ps(scale);
    let zp = _mm256_set1_ps(f32::from(zero_point));
    let (lo, hi) = (_mm256_setzero_ps(), _mm256_set1_ps(255.0));
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= n`, within both slices.
        unsafe {
            let v = _mm256_div_ps(_mm256_loadu_ps(x.as_ptr().add(i)), s);
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            // NaN → 0; ±∞ and values past 2²⁴ saturate below as the integer path does.
            let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
            let q = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, zp), lo), hi);
            let c = _mm256_cvtps_epi32(_mm256_sub_ps(q, zp));
            let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packs_epi32(c, c));
            _mm_storeu_si128(
                out.as_mut_ptr().add(i).cast(),
                _mm256_castsi256_si128(packed),
            );
        }
    }
    super::portable::quantize(&x[whole..n], scale, zero_point, &mut out[whole..n]);
}

/// [`super::portable::widen`] on AVX2: 16 values at a time by `vpmovsxbw`.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn widen(p: &[i8], out: &mut [i16]) {
    let n = p.len().min(out.len());
    let whole = n / 16 * 16;
    for i in (0..whole).step_by(16) {
        // SAFETY: `i + 16 <= n`, within both slices.
        unsafe {
            let v = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.as_ptr().add(i).cast()));
            _mm256_storeu_si256(out.as_mut_ptr().add(i).cast(), v);
        }
    }
    super::portable::widen(&p[whole..n], &mut out[whole..n]);
}

/// Never called: the AVX2 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn widen(_: &[i8], _: &mut [i16]) {
    unreachable!("the AVX2 build runs on x86_64 only")
}

/// Loads `NR` values at value offset `at` of a panel of i8 (`NARROW`, widened by `vpmovsxbw`)
/// or of i16, as `NR` i16 lanes.
///
/// # Safety
/// The CPU must have AVX2; `panel + at` must hold `NR` values of the panel's type.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn load<const NARROW: bool>(panel: *const u8, at: usize) -> __m256i {
    // SAFETY: as the caller vouches.
    unsafe {
        if NARROW {
            _mm256_cvtepi8_epi16(_mm_loadu_si128(panel.add(at).cast()))
        } else {
            _mm256_loadu_si256(panel.add(2 * at).cast())
        }
    }
}

/// `acc[r][j] = Σ_p a[r·stride + p] · panel[p][j]` (wrapping i32) for `MR` rows of widened
/// activations and one packed i16 panel of `k_pairs` row pairs.
///
/// # Safety
/// The CPU must have AVX2; `a` must hold `MR` rows of `2·k_pairs` values `stride` apart, and
/// `panel` `k_pairs·NR·2` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn tile(
    a: *const i16,
    stride: usize,
    panel: *const i16,
    k_pairs: usize,
) -> [[i32; NR]; MR] {
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    for p in 0..k_pairs {
        // SAFETY: within the panel and the rows, as the caller vouches.
        unsafe {
            let w0 = _mm256_loadu_si256(panel.add(p * 2 * NR).cast());
            let w1 = _mm256_loadu_si256(panel.add(p * 2 * NR + NR).cast());
            for (r, acc) in acc.iter_mut().enumerate() {
                let pair = a.add(r * stride + 2 * p).cast::<i32>().read_unaligned();
                let pair = _mm256_set1_epi32(pair);
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(pair, w0));
                acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(pair, w1));
            }
        }
    }
    let mut out = [[0i32; NR]; MR];
    for (o, acc) in out.iter_mut().zip(&acc) {
        // SAFETY: each row of `out` holds 16 i32.
        unsafe { store(o, acc[0], acc[1]) };
    }
    out
}

/// [`tile`] for one row of activations (a decode step): `acc[j] = Σ_p a[p] · panel[p][j]`. The
/// pairs alternate between two sets of accumulators, so that an add need not wait for the one
/// before; the wrapping i32 sums are the same in any order.
///
/// # Safety
/// The CPU must have AVX2; `a` must hold `2·k_pairs` values and `panel` `k_pairs·NR·2` values
/// of its type.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn row<const NARROW: bool>(
    a: *const i16,
    panel: *const u8,
    k_pairs: usize,
) -> [i32; NR] {
    let mut acc = [[_mm256_setzero_si256(); 2]; 2];
    for p in 0..k_pairs {
        // SAFETY: within the panel and the row, as the caller vouches.
        unsafe {
            let pair = _mm256_set1_epi32(a.add(2 * p).cast::<i32>().read_unaligned());
            let acc = &mut acc[p % 2];
            let w0 = load::<NARROW>(panel, p * 2 * NR);
            let w1 = load::<NARROW>(panel, p * 2 * NR + NR);
            acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(pair, w0));
            acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(pair, w1));
        }
    }
    let mut out = [0i32; NR];
    let lo = _mm256_add_epi32(acc[0][0], acc[1][0]);
    let hi = _mm256_add_epi32(acc[0][1], acc[1][1]);
    // SAFETY: `out` holds 16 i32.
    unsafe { store(&mut out, lo, hi) };
    out
}

/// Stores two vectors of 8 i32 into `out`.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn store(out: &mut [i32; NR], lo: __m256i, hi: __m256i) {
    // SAFETY: `out` holds 16 i32.
    unsafe {
        _mm256_storeu_si256(out.as_mut_ptr().cast(), lo);
        _mm256_storeu_si256(out.as_mut_ptr().add(8).cast(), hi);
    }
}

/// Never called: the AVX2 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn range(_: &[f32]) -> (f32, f32) {
    unreachable!("the AVX2 build runs on x86_64 only")
}

/// Never called: the AVX2 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn quantize(_: &[f32], _: f32, _: u8, _: &mut [i16]) {
    unreachable!("the AVX2 build runs on x86_64 only")
}

/// Never called: the AVX2 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn tile(_: *const i16, _: usize, _: *const i16, _: usize) -> [[i32; NR]; MR] {
    unreachable!("the AVX2 build runs on x86_64 only")
}

/// Never called: the AVX2 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn row<const NARROW: bool>(_: *const i16, _: *const u8, _: usize) -> [i32; NR] {
    unreachable!("the AVX2 build runs on x86_64 only")
}

/// `QuantizeLinear` of 8 values to the range `[lo, hi]`, as floats (integers of the range):
/// `min(max(round(x / s) + zp, lo), hi)`, rounding half to even, NaN as 0 (so as the zero
/// point); infinities saturate.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn quantize8(x: __m256, s: __m256, zp: __m256, lo: __m256, hi: __m256) -> __m256 {
    let r =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_div_ps(x, s));
    let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
    _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, zp), lo), hi)
}

/// [`super::portable::quantize_linear`] on AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_linear(
    x: &[f32],
    scale: f32,
    zero_point: f32,
    to: super::Quantized,
    out: &mut [u8],
) {
    let n = x.len().min(out.len());
    let whole = n / 8 * 8;
    let (lo, hi) = to.bounds();
    let s = _mm256_set1_ps(scale);
    let zp = _mm256_set1_ps(zero_point);
    let (lo_v, hi_v) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= n`, within both slices.
        unsafe {
            let q = quantize8(_mm256_loadu_ps(x.as_ptr().add(i)), s, zp, lo_v, hi_v);
            let c = _mm256_cvtps_epi32(q);
            // i32 → i16 (in range, so no saturation), in order in the low 128 bits.
            let words = _mm256_permute4x64_epi64::<0b1000>(_mm256_packs_epi32(c, c));
            let words = _mm256_castsi256_si128(words);
            let bytes = match to {
                super::Quantized::U8 => _mm_packus_epi16(words, words),
                super::Quantized::I8 => _mm_packs_epi16(words, words),
            };
            _mm_storel_epi64(out.as_mut_ptr().add(i).cast(), bytes);
        }
    }
    super::portable::quantize_linear(&x[whole..n], scale, zero_point, to, &mut out[whole..n]);
}

/// Never called: the AVX2 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn quantize_linear(_: &[f32], _: f32, _: f32, _: super::Quantized, _: &mut [u8]) {
    unreachable!("the AVX2 build runs on x86_64 only")
}

/// [`super::portable::requantize`] on AVX2: the quantization as [`quantize_linear`]'s
/// (the value, rounded and clamped, stays a float: an integer of the type's range), then
/// `(q − zero_point) · scale`, the difference exact in float.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn requantize_linear(x: &[f32], rq: super::Requantize, out: &mut [f32]) {
    let n = x.len().min(out.len());
    // SAFETY: `n` values of each.
    let whole = unsafe { requantize8(x.as_ptr(), out.as_mut_ptr(), n, rq) };
    super::portable::requantize(&x[whole..n], rq, &mut out[whole..n]);
}

/// The round trip of [`requantize_linear`] from `x` to `out` (which may be `x`), 8 values at a
/// time over the first `n / 8 · 8` of `n` values; returns how many it did.
///
/// # Safety
/// The CPU must have AVX2; `x` and `out` must hold `n` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn requantize8(x: *const f32, out: *mut f32, n: usize, rq: super::Requantize) -> usize {
    let whole = n / 8 * 8;
    let (lo, hi) = rq.to.bounds();
    let s = _mm256_set1_ps(rq.scale);
    let zp = _mm256_set1_ps(rq.zero_point as f32);
    let (lo_v, hi_v) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= n`, as the caller vouches.
        unsafe {
            let q = quantize8(_mm256_loadu_ps(x.add(i)), s, zp, lo_v, hi_v);
            _mm256_storeu_ps(out.add(i), _mm256_mul_ps(_mm256_sub_ps(q, zp), s));
        }
    }
    whole
}

/// Never called: the AVX2 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn requantize_linear(_: &[f32], _: super::Requantize, _: &mut [f32]) {
    unreachable!("the AVX2 build runs on x86_64 only")
}

/// [`super::portable::requantize_in_place`] on AVX2, as [`requantize_linear`].
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn requantize_in_place(y: &mut [f32], rq: super::Requantize) {
    let p = y.as_mut_ptr();
    // SAFETY: `y.len()` values, read and written in place.
    let whole = unsafe { requantize8(p, p, y.len(), rq) };
    // SAFETY: plain Rust.
    unsafe { super::portable::requantize_in_place(&mut y[whole..], rq) };
}

/// Never called: the AVX2 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn requantize_in_place(_: &mut [f32], _: super::Requantize) {
    unreachable!("the AVX2 build runs on x86_64 only")
}
