//! The quantization of activations on AVX-512 (the range and the rounding of
//! `DynamicQuantizeLinear`, 16 floats at a time), run with the 512-bit VNNI build. Each function
//! gives the portable one's result exactly (the tests compare every build).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// [`super::portable::range`] on AVX-512.
///
/// # Safety
/// The CPU must have AVX512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn range(x: &[f32]) -> (f32, f32) {
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for c in chunks {
        // SAFETY: `c` holds 16 floats.
        let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        // `min(v, lo)` is `v < lo ? v : lo`: a NaN or a −0 keeps `lo`, as the portable fold.
        lo = _mm512_min_ps(v, lo);
        hi = _mm512_max_ps(v, hi);
    }
    let (mut los, mut his) = ([0f32; 16], [0f32; 16]);
    // SAFETY: 16 floats each.
    unsafe {
        _mm512_storeu_ps(los.as_mut_ptr(), lo);
        _mm512_storeu_ps(his.as_mut_ptr(), hi);
    }
    let (tlo, thi) = super::portable::range(tail);
    let lo = los.iter().fold(tlo, |a, &v| if v < a { v } else { a });
    let hi = his.iter().fold(thi, |a, &v| if v > a { v } else { a });
    (lo, hi)
}

/// [`super::portable::quantize`] on AVX-512.
///
/// # Safety
/// The CPU must have AVX512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn quantize(x: &[f32], scale: f32, zero_point: u8, out: &mut [i16]) {
    let n = x.len().min(out.len());
    let whole = n / 16 * 16;
    let s = _mm512_set1_ps(scale);
    let zp = _mm512_set1_ps(f32::from(zero_point));
    let (lo, hi) = (_mm512_setzero_ps(), _mm512_set1_ps(255.0));
    for i in (0..whole).step_by(16) {
        // SAFETY: `i + 16 <= n`, within both slices.
        unsafe {
            let v = _mm512_div_ps(_mm512_loadu_ps(x.as_ptr().add(i)), s);
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            // NaN → 0; ±∞ and values past 2²⁴ saturate below as the integer path does.
            let r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r), r);
            let q = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(r, zp), lo), hi);
            let c = _mm512_cvtps_epi32(_mm512_sub_ps(q, zp));
            _mm256_storeu_si256(out.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi16(c));
        }
    }
    super::portable::quantize(&x[whole..n], scale, zero_point, &mut out[whole..n]);
}

/// Never called: the AVX-512 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn range(_: &[f32]) -> (f32, f32) {
    unreachable!("the AVX-512 build runs on x86_64 only")
}

/// Never called: the AVX-512 build is chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn quantize(_: &[f32], _: f32, _: u8, _: &mut [i16]) {
    unreachable!("the AVX-512 build runs on x86_64 only")
}
