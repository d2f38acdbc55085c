//! Activations applied to values still in registers: the epilogue of a projection
//! ([`crate::panel`]) that an activation follows in the graph, so that the activation costs no
//! pass of its own over the output. AVX-512 only, like the panel kernel (callers keep the
//! activation as an op of its own elsewhere: [`apply_rows`] reports whether it ran).
//!
//! * [`Activation::GeluErf`], `x/2 · (1 + erf(x/√2))`: `erf` by Abramowitz & Stegun 7.1.28
//!   (`1 − (1 + a₁x + … + a₆x⁶)⁻¹⁶`, absolute error ≤ 3e-7), operation for operation as
//!   tract-linalg's AVX-512 `erf`, and the GELU around it as tract's f32 `Gelu`, so the values
//!   are the bits of the op it replaces when tract runs its AVX-512 kernel.
//! * [`Activation::GeluTanh`], `x/2 · (1 + tanh(u))` with `u = √(2/π)·(x + 0.044715·x³)`,
//!   computed as `x / (1 + e^{−2u})` (the same function, without the cancellation of `1 + tanh`
//!   near −1), `e^{−2u}` from the attention kernel's `2^x` polynomial (relative error < 1e-7).
//!   Not tract's bits (its `tanh` is another approximation, which saturates sooner: 1.6e-6
//!   where the value is 6.5e-9 at x = −5.49); within a relative 1e-5 of the exact value on
//!   −12..12, tails included.

/// An element-wise activation a projection can apply to its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// GELU, `approximate = "none"`
    GeluErf,
    /// GELU, `approximate = "tanh"`
    GeluTanh,
}

impl Activation {
    /// The activation in f64 arithmetic (the reference of the tests).
    pub fn reference(self, x: f64) -> f64 {
        match self {
            Activation::GeluErf => 0.5 * x * (1.0 + erf_f64(x / std::f64::consts::SQRT_2)),
            Activation::GeluTanh => {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
                // = 0.5·x·(1 + tanh(u)), without its cancellation near tanh(u) = −1
                x / (1.0 + (-2.0 * u).exp())
            }
        }
    }
}

/// `erf` in f64: its Maclaurin series below |x| = 4 (error < 1e-10 there), ±1 beyond (where
/// `1 − erf` < 2e-8, below half an f32 ulp of 1).
fn erf_f64(x: f64) -> f64 {
    if x.abs() >= 4.0 {
        return x.signum();
    }
    // erf(x) = 2/√π · Σ (−1)ⁿ x^{2n+1} / (n! (2n+1))
    let (mut term, mut sum) = (x, x);
    for n in 1..200 {
        term *= -x * x / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// Applies `act` in place to `rows` rows of `width` values, row `r` at `y[r·stride..]`, when the
/// CPU has AVX-512; returns `false` (and changes nothing) otherwise.
///
/// # Panics
/// If `y` is too short for the rows given.
pub fn apply_rows(
    act: Activation,
    y: &mut [f32],
    stride: usize,
    rows: usize,
    width: usize,
) -> bool {
    if rows > 0 && width > 0 {
        assert!(
            stride >= width && y.len() >= (rows - 1) * stride + width,
            "y too short"
        );
    }
    // SAFETY: `y` holds every row, as asserted.
    unsafe { apply_rows_raw(act, y.as_mut_ptr(), stride, rows, width) }
}

/// [`apply_rows`] on a raw output (tasks that own disjoint blocks of one matrix).
///
/// # Safety
/// `y.add(r·stride + i)` for `r < rows`, `i < width` must be valid for reads and writes and not
/// accessed by anything else during the call.
pub unsafe fn apply_rows_raw(
    act: Activation,
    y: *mut f32,
    stride: usize,
    rows: usize,
    width: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::Avx512.is_available() {
        // SAFETY: AVX-512F checked; the caller vouches for the rows.
        unsafe { avx512::apply_rows(act, y, stride, rows, width) };
        return true;
    }
    let _ = (act, y, stride, rows, width);
    false
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::Activation;
    use crate::flash::avx512::vexp2;
    use std::arch::x86_64::*;

    /// [`super::apply_rows_raw`] with AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn apply_rows(
        act: Activation,
        y: *mut f32,
        stride: usize,
        rows: usize,
        width: usize,
    ) {
        for r in 0..rows {
            let row = y.add(r * stride);
            let mut c = 0;
            while c < width {
                let lanes = (width - c).min(16);
                let m: __mmask16 = if lanes == 16 {
                    0xffff
                } else {
                    (1u16 << lanes) - 1
                };
                let v = _mm512_maskz_loadu_ps(m, row.add(c));
                _mm512_mask_storeu_ps(row.add(c), m, apply(act, v));
                c += 16;
            }
        }
    }

    /// `act` on 16 values.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn apply(act: Activation, x: __m512) -> __m512 {
        match act {
            Activation::GeluErf => gelu_erf(x),
            Activation::GeluTanh => gelu_tanh(x),
        }
    }

    /// `(x·0.5)·(erf(x·(1/√2)) + 1)`, the operations of tract's f32 `Gelu` (exact form).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn gelu_erf(x: __m512) -> __m512 {
        let scaled = _mm512_mul_ps(x, _mm512_set1_ps(2.0f32.sqrt().recip()));
        let e = erf(scaled);
        let one = _mm512_set1_ps(1.0);
        _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5)), _mm512_add_ps(e, one))
    }

    /// Abramowitz & Stegun 7.1.28, in the order of tract-linalg's AVX-512 `erf`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn erf(x: __m512) -> __m512 {
        #[allow(clippy::excessive_precision)]
        const A: [f32; 6] = [
            0.0705230784,
            0.0422820123,
            0.0092705272,
            0.0001520143,
            0.0002765672,
            0.0000430638,
        ];
        let sign_bit = _mm512_set1_epi32(i32::MIN);
        let xi = _mm512_castps_si512(x);
        let sign = _mm512_and_si512(xi, sign_bit);
        let a = _mm512_castsi512_ps(_mm512_andnot_si512(sign_bit, xi));
        let mut y = _mm512_set1_ps(A[5]);
        for c in A[..5].iter().rev() {
            y = _mm512_fmadd_ps(y, a, _mm512_set1_ps(*c));
        }
        y = _mm512_mul_ps(y, a);
        let one = _mm512_set1_ps(1.0);
        y = _mm512_add_ps(y, one);
        for _ in 0..4 {
            y = _mm512_mul_ps(y, y);
        }
        let r = _mm512_sub_ps(one, _mm512_div_ps(one, y));
        _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign))
    }

    /// `0.5·x·(1 + tanh(u)) = x / (1 + e^{−2u})`, `u = √(2/π)·(x + 0.044715·x³)`: the second
    /// form has no cancellation where `tanh(u)` is near −1 (large negative `x`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn gelu_tanh(x: __m512) -> __m512 {
        let x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        let inner = _mm512_fmadd_ps(_mm512_set1_ps(0.044715), x3, x);
        // −2u in base 2: e^{−2u} = 2^{−2u·log2 e} (the attention kernel's `2^x`), clamped where
        // 2^t is 0 or inf in f32 anyway.
        let t = _mm512_mul_ps(
            _mm512_set1_ps(-2.0 * 0.797_884_6 * std::f32::consts::LOG2_E),
            inner,
        );
        let t = _mm512_min_ps(
            _mm512_max_ps(t, _mm512_set1_ps(-127.0)),
            _mm512_set1_ps(128.0),
        );
        _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), vexp2(t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_f64_erf_matches_known_values() {
        for (x, want) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!(
                (erf_f64(x) - want).abs() < 1e-12,
                "erf({x}) = {}",
                erf_f64(x)
            );
        }
    }

    #[test]
    fn both_gelus_match_the_f64_reference_on_a_wide_range() {
        // -12..12 in steps of 1/64, plus the rows' masked tail (width 37 of stride 40)
        let values: Vec<f32> = (-768..=768).map(|i| i as f32 / 64.0).collect();
        let (rows, width, stride) = (values.len().div_ceil(37), 37, 40);
        for act in [Activation::GeluErf, Activation::GeluTanh] {
            let mut y = vec![f32::NAN; rows * stride];
            for (i, v) in values.iter().enumerate() {
                y[i / width * stride + i % width] = *v;
            }
            if !apply_rows(act, &mut y, stride, rows, width) {
                return; // no AVX-512 here: nothing ran, nothing to check
            }
            for (i, x) in values.iter().enumerate() {
                let got = y[i / width * stride + i % width] as f64;
                let want = act.reference(*x as f64);
                // The erf form has A&S 7.1.28's absolute error (as tract's); the tanh form is
                // relatively accurate down to the f32 underflow, tails included (the rounding of
                // u weighs 2·|u| in e^{−2u}: 5e-6 at x = −9.3).
                let tolerance = match act {
                    Activation::GeluErf => 4e-7 * (1.0 + x.abs() as f64),
                    Activation::GeluTanh => 1e-5 * want.abs() + 1e-37,
                };
                assert!(
                    (got - want).abs() <= tolerance,
                    "{act:?}({x}) = {got}, want {want}"
                );
            }
            for r in 0..rows {
                assert!(y[r * stride + width..(r + 1) * stride]
                    .iter()
                    .all(|v| v.is_nan()));
            }
        }
    }
}
