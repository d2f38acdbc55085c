//! Layer normalization over rows: `y = (x − mean) / √(var + ε) · scale + bias` for every row of
//! `x`, mean and (biased) variance taken over the row — ONNX `LayerNormalization` with its
//! normalized axes flattened into one row.
//!
//! Two passes over a row that stays in L1: the mean, then the variance of `x − mean` (not
//! `E[x²] − mean²`, which cancels badly when the mean is large against the spread), then one
//! pass that writes `y`. Sums are taken in 16 lanes, which the compiler vectorizes; the whole
//! body is compiled once per [`Isa`] (AVX-512F, AVX2+FMA, the baseline target) and the
//! [`NormKernel`] of a [`crate::KernelSet`] picks one. The builds give the same bits: the
//! arithmetic is the same operations in the same order (no multiply-add is fused).

use rayon::prelude::*;

use crate::isa::Isa;
use crate::threads::ThreadPolicy;

/// The layer-normalization kernel of a [`crate::KernelSet`]: which build runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormKernel {
    isa: Isa,
}

impl NormKernel {
    /// The build for `isa`, which this CPU must have (the resolver's promise).
    pub(crate) fn new(isa: Isa) -> Self {
        NormKernel { isa }
    }

    /// The build's ISA.
    pub fn isa(self) -> Isa {
        self.isa
    }
}

/// One normalization: `rows` rows of `scale.len()` values.
pub struct LayerNorm<'a> {
    /// Multiplies every normalized row, one value per column.
    pub scale: &'a [f32],
    /// Added after the scale, one value per column, when present.
    pub bias: Option<&'a [f32]>,
    /// Added to the variance before the square root.
    pub epsilon: f32,
}

/// [`layer_norm_rows`] split by rows over the current rayon pool when `threads` spreads that
/// many values.
///
/// # Panics
/// As [`layer_norm_rows`].
pub fn layer_norm(
    kernel: NormKernel,
    threads: &ThreadPolicy,
    p: &LayerNorm,
    x: &[f32],
    y: &mut [f32],
) {
    let cols = p.scale.len();
    if cols == 0 || !threads.spreads_values(x.len()) {
        layer_norm_rows(kernel, p, x, y);
        return;
    }
    assert_eq!(x.len(), y.len(), "x and y differ in length");
    let per_task = threads.rows_per_task(x.len() / cols) * cols;
    x.par_chunks(per_task)
        .zip(y.par_chunks_mut(per_task))
        .for_each(|(xs, ys)| layer_norm_rows(kernel, p, xs, ys));
}

/// Normalizes every row of `x` into `y` (both `rows × scale.len()`, row-major) on the calling
/// thread.
///
/// # Panics
/// If `x` and `y` differ in length, the length is not a whole number of rows, or the bias is
/// not as long as the scale.
pub fn layer_norm_rows(kernel: NormKernel, p: &LayerNorm, x: &[f32], y: &mut [f32]) {
    let cols = p.scale.len();
    assert_eq!(x.len(), y.len(), "x and y differ in length");
    assert!(
        p.bias.is_none_or(|b| b.len() == cols),
        "bias and scale differ in length"
    );
    if cols == 0 {
        assert!(x.is_empty(), "rows of no columns hold no values");
        return;
    }
    assert_eq!(
        x.len() % cols,
        0,
        "x is not a whole number of rows of {cols}"
    );
    // SAFETY: a `NormKernel` is made only for an ISA this CPU has.
    unsafe {
        match kernel.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => rows_avx512(p, x, y),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => rows_avx2(p, x, y),
            _ => rows(p, x, y),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows_avx512(p: &LayerNorm, x: &[f32], y: &mut [f32]) {
    rows(p, x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(p: &LayerNorm, x: &[f32], y: &mut [f32]) {
    rows(p, x, y)
}

#[inline(always)]
fn rows(p: &LayerNorm, x: &[f32], y: &mut [f32]) {
    let cols = p.scale.len();
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        let mean = lane_sum(xr, |v| v) / cols as f32;
        let var = lane_sum(xr, |v| (v - mean) * (v - mean)) / cols as f32;
        let inv = 1.0 / (var + p.epsilon).sqrt();
        match p.bias {
            Some(b) => {
                for (((o, &v), &s), &c) in yr.iter_mut().zip(xr).zip(p.scale).zip(b) {
                    *o = (v - mean) * inv * s + c;
                }
            }
            None => {
                for ((o, &v), &s) in yr.iter_mut().zip(xr).zip(p.scale) {
                    *o = (v - mean) * inv * s;
                }
            }
        }
    }
}

/// Lanes of the partial sums in [`lane_sum`]: one AVX-512 vector.
const LANES: usize = 16;

/// `Σ f(v)` over `row`, summed in [`LANES`] independent partial sums.
#[inline(always)]
fn lane_sum(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a += f(v);
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], scale: &[f32], bias: Option<&[f32]>, eps: f32) -> Vec<f64> {
        let cols = scale.len();
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks_exact(cols) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
            let inv = 1.0 / (var + eps as f64).sqrt();
            for (c, &v) in row.iter().enumerate() {
                let b = bias.map_or(0.0, |b| b[c] as f64);
                y.push((v as f64 - mean) * inv * scale[c] as f64 + b);
            }
        }
        y
    }

    fn ramp(n: usize, c: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32) * 0.61 + c).sin() * 3.0)
            .collect()
    }

    /// The portable build, the reference of the others' bits.
    fn portable() -> NormKernel {
        NormKernel::new(Isa::Scalar)
    }

    #[test]
    fn matches_a_naive_normalization_on_odd_widths_with_and_without_bias() {
        for (rows, cols) in [(1, 1), (3, 7), (5, 16), (4, 33), (2, 768), (3, 1000)] {
            let x: Vec<f32> = ramp(rows * cols, 0.2).iter().map(|v| v + 100.0).collect();
            let scale = ramp(cols, 0.5);
            let bias = ramp(cols, 0.9);
            for with_bias in [false, true] {
                let b = with_bias.then_some(bias.as_slice());
                let p = LayerNorm {
                    scale: &scale,
                    bias: b,
                    epsilon: 1e-5,
                };
                let mut y = vec![f32::NAN; x.len()];
                layer_norm_rows(portable(), &p, &x, &mut y);
                let want = naive(&x, &scale, b, 1e-5);
                for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - w).abs() <= 2e-4 * (1.0 + w.abs()),
                        "rows {rows} cols {cols} bias {with_bias}: y[{i}] = {g}, want {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_constant_row_normalizes_to_the_bias() {
        let x = vec![7.5f32; 40];
        let scale = vec![2.0f32; 20];
        let bias = ramp(20, 0.1);
        let mut y = vec![0.0; 40];
        let p = LayerNorm {
            scale: &scale,
            bias: Some(&bias),
            epsilon: 1e-5,
        };
        for isa in Isa::available() {
            layer_norm_rows(NormKernel::new(isa), &p, &x, &mut y);
            for (i, &v) in y.iter().enumerate() {
                assert_eq!(v, bias[i % 20], "{isa}: y[{i}]");
            }
        }
    }

    #[test]
    fn every_build_and_split_gives_the_portable_bits() {
        let pool = crate::testing::pool(2);
        let threads = ThreadPolicy::default();
        // 64 rows of 768: enough values for the threaded split
        for (rows, cols) in [(3, 37), (64, 768)] {
            let x = ramp(rows * cols, 0.3);
            let (scale, bias) = (ramp(cols, 0.7), ramp(cols, 1.1));
            let p = LayerNorm {
                scale: &scale,
                bias: Some(&bias),
                epsilon: 1e-6,
            };
            let mut want = vec![f32::NAN; x.len()];
            layer_norm_rows(portable(), &p, &x, &mut want);
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; x.len()];
                pool.install(|| layer_norm(NormKernel::new(isa), &threads, &p, &x, &mut y));
                let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa}, {rows}×{cols}: not the portable build's bits");
            }
        }
    }
}
