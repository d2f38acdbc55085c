//! Layer normalization over rows: `y = (x − mean) / √(var + ε) · scale + bias` for every row of
//! `x`, mean and (biased) variance taken over the row — ONNX `LayerNormalization` with its
//! normalized axes flattened into one row.
//!
//! Two passes over a row that stays in L1: the mean, then the variance of `x − mean` (not
//! `E[x²] − mean²`, which cancels badly when the mean is large against the spread), then one
//! pass that writes `y`. Sums are taken in 16 lanes, which the compiler vectorizes; the whole
//! body is compiled once more with AVX-512 enabled and picked at run time.

/// One normalization: `rows` rows of `scale.len()` values.
pub struct LayerNorm<'a> {
    /// Multiplies every normalized row, one value per column.
    pub scale: &'a [f32],
    /// Added after the scale, one value per column, when present.
    pub bias: Option<&'a [f32]>,
    /// Added to the variance before the square root.
    pub epsilon: f32,
}

/// Normalizes every row of `x` into `y` (both `rows × scale.len()`, row-major).
///
/// # Panics
/// If `x` and `y` differ in length, the length is not a whole number of rows, or the bias is
/// not as long as the scale.
pub fn layer_norm_rows(p: &LayerNorm, x: &[f32], y: &mut [f32]) {
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
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::Avx512.is_available() {
        // SAFETY: AVX-512F is present.
        unsafe { rows_avx512(p, x, y) };
        return;
    }
    rows(p, x, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows_avx512(p: &LayerNorm, x: &[f32], y: &mut [f32]) {
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
                layer_norm_rows(&p, &x, &mut y);
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
        layer_norm_rows(&p, &x, &mut y);
        for (i, &v) in y.iter().enumerate() {
            assert_eq!(v, bias[i % 20], "y[{i}]");
        }
    }
}
