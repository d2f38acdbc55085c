//! ONNX `QuantizeLinear` with one scale and zero point, float32 to uint8 or int8:
//! `y = saturate(round(x / scale) + zero_point)`, rounding half to even, saturating to the
//! type's range (an infinity or a value past it gives the bound), NaN quantized as the zero
//! point. One pass over `x`, 8 values at a time on AVX2, split over the pool for large tensors.

use rayon::prelude::*;

use super::{avx2, portable, Build, QuantKernel, Quantized};
use crate::threads::ThreadPolicy;

/// `out[i] = saturate(round(x[i] / scale) + zero_point)` as `to` (int8 values as their bytes);
/// `zero_point` must lie in `to`'s range.
///
/// # Panics
/// If `out` is not as long as `x`.
pub fn quantize_linear(
    kernel: &QuantKernel,
    threads: &ThreadPolicy,
    x: &[f32],
    scale: f32,
    zero_point: i32,
    to: Quantized,
    out: &mut [u8],
) {
    let zp = zero_point as f32;
    elementwise(threads, x, out, |x, out| match kernel.build {
        // SAFETY: the AVX2 build is chosen only on CPUs with AVX2.
        Build::Avx2 => unsafe { avx2::quantize_linear(x, scale, zp, to, out) },
        Build::Portable => portable::quantize_linear(x, scale, zp, to, out),
    });
}

/// `one` over `x` and `out` whole, or over chunks of them on the pool when `threads` spreads
/// that many values.
///
/// # Panics
/// If `out` is not as long as `x`.
fn elementwise<T: Send>(
    threads: &ThreadPolicy,
    x: &[f32],
    out: &mut [T],
    one: impl Fn(&[f32], &mut [T]) + Sync,
) {
    assert_eq!(x.len(), out.len(), "x and out differ in length");
    if threads.spreads_values(x.len()) {
        let chunk = threads.elementwise_chunk().max(8);
        x.par_chunks(chunk)
            .zip(out.par_chunks_mut(chunk))
            .for_each(|(x, out)| one(x, out));
    } else {
        one(x, out);
    }
}

/// `out[i] = requantize.apply(x[i])`: a QDQ model's `QuantizeLinear → DequantizeLinear` pair
/// in one pass, 8 values at a time on AVX2, split over the pool for large tensors.
///
/// # Panics
/// If `out` is not as long as `x`.
pub fn requantize_linear(
    kernel: &QuantKernel,
    threads: &ThreadPolicy,
    x: &[f32],
    requantize: Requantize,
    out: &mut [f32],
) {
    elementwise(threads, x, out, |x, out| match kernel.build {
        // SAFETY: the AVX2 build is chosen only on CPUs with AVX2.
        Build::Avx2 => unsafe { avx2::requantize_linear(x, requantize, out) },
        Build::Portable => portable::requantize(x, requantize, out),
    });
}

/// ONNX `QuantizeLinear` then `DequantizeLinear` with the same scale and zero point (a QDQ
/// model's round trip of an activation through `to`): `(saturate(round(x / scale) +
/// zero_point) − zero_point) · scale`, the quantization as [`quantize_linear`], the product
/// rounded once, as tract's `DequantizeLinear` computes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Requantize {
    /// The scale.
    pub scale: f32,
    /// The zero point, in `to`'s range.
    pub zero_point: i32,
    /// The type quantized to.
    pub to: Quantized,
}

impl Requantize {
    /// `x` after the round trip.
    #[inline(always)]
    pub fn apply(&self, x: f32) -> f32 {
        let q = portable::quantize_value(x, self.scale, self.zero_point as f32, self.to);
        (q - self.zero_point) as f32 * self.scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Vec<f32> {
        let mut v: Vec<f32> = (0..203).map(|i| (i as f32 - 101.0) * 0.0375).collect();
        v.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e30,
            -1e30,
            3e9,
            -3e9,
            0.125,
            -0.125,
            0.375,
            0.625,
            -0.625,
            -0.0,
        ]);
        v
    }

    #[test]
    fn every_build_saturates_and_rounds_half_to_even() {
        let x = values();
        let threads = ThreadPolicy::default();
        for kernel in QuantKernel::every_build() {
            for (to, zp) in [
                (Quantized::U8, 3),
                (Quantized::U8, 250),
                (Quantized::I8, -5),
            ] {
                let mut out = vec![0u8; x.len()];
                quantize_linear(&kernel, &threads, &x, 0.25, zp, to, &mut out);
                let mut want = vec![0u8; x.len()];
                portable::quantize_linear(&x, 0.25, zp as f32, to, &mut want);
                assert_eq!(out, want, "{kernel} {to:?} zp {zp}");
                let tail = &out[203..];
                let (lo, hi) = to.bounds();
                let byte = |v: f32| {
                    if to == Quantized::U8 {
                        v as u8
                    } else {
                        v as i8 as u8
                    }
                };
                // inf, −inf, NaN, 1e30, −1e30, 3e9, −3e9 saturate (NaN: the zero point)
                assert_eq!(
                    tail[..7],
                    [
                        byte(hi),
                        byte(lo),
                        byte(zp as f32),
                        byte(hi),
                        byte(lo),
                        byte(hi),
                        byte(lo)
                    ]
                );
                // 0.125 / 0.25 = 0.5 → 0, −0.5 → −0, 1.5 → 2, 2.5 → 2, −2.5 → −2 (half to even)
                let q = |r: f32| byte((r + zp as f32).clamp(lo, hi));
                assert_eq!(tail[7..12], [q(0.0), q(0.0), q(2.0), q(2.0), q(-2.0)]);
            }
        }
    }

    /// The one-pass round trip equals `quantize_linear`'s bytes dequantized as
    /// `(q − zero_point) as f32 · scale` on every build, infinities and NaN included, on a
    /// tensor large enough to be split over the pool.
    #[test]
    fn requantize_is_quantize_then_dequantize_on_every_build() {
        let mut x = values();
        x.extend(crate::testing::ramp(40_000, 0.2).iter().map(|v| v * 40.0));
        let threads = ThreadPolicy::default();
        for kernel in QuantKernel::every_build() {
            for (to, zp) in [(Quantized::U8, 3), (Quantized::I8, -5)] {
                let rq = Requantize {
                    scale: 0.25,
                    zero_point: zp,
                    to,
                };
                let mut q = vec![0u8; x.len()];
                quantize_linear(&kernel, &threads, &x, 0.25, zp, to, &mut q);
                let mut y = vec![f32::NAN; x.len()];
                crate::testing::pool(2)
                    .install(|| requantize_linear(&kernel, &threads, &x, rq, &mut y));
                for (i, (&y, &q)) in y.iter().zip(&q).enumerate() {
                    let q = match to {
                        Quantized::U8 => i32::from(q),
                        Quantized::I8 => i32::from(q as i8),
                    };
                    let want = (q - zp) as f32 * 0.25;
                    assert_eq!(
                        y.to_bits(),
                        want.to_bits(),
                        "{kernel} {to:?} x[{i}] = {}",
                        x[i]
                    );
                }
            }
        }
    }
}
