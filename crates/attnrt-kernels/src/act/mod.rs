//! Activations applied to values still in registers: the epilogue of a projection
//! ([`crate::panel`]) that an activation follows in the graph, so that the activation costs no
//! pass of its own over the output, and the same functions over rows in memory ([`apply_rows`]).
//! Three builds, one per [`Isa`] ([`ActKernel`]): AVX-512F intrinsics (`avx512.rs`), and the
//! lane arrays of `lanes.rs` compiled for AVX2+FMA and for the baseline target (portable).
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
//!
//! The lane builds compute the same formulas (fused multiply-adds only with FMA); their values
//! are within the tolerances above, not the AVX-512 build's bits.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod lanes;

use crate::isa::Isa;

/// `a₁..a₆` of Abramowitz & Stegun 7.1.28, `erf(x) ≈ 1 − (1 + a₁x + … + a₆x⁶)⁻¹⁶` for `x ≥ 0`
/// (tract-linalg's constants).
#[allow(clippy::excessive_precision)]
const ERF_A: [f32; 6] = [
    0.0705230784,
    0.0422820123,
    0.0092705272,
    0.0001520143,
    0.0002765672,
    0.0000430638,
];

/// The activation kernel of a [`crate::KernelSet`]: which build runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActKernel {
    isa: Isa,
}

impl ActKernel {
    /// The build for `isa`, which this CPU must have (the resolver's promise).
    pub(crate) fn new(isa: Isa) -> Self {
        ActKernel { isa }
    }

    /// The build's ISA.
    pub fn isa(self) -> Isa {
        self.isa
    }
}

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

/// Applies `act` in place to `rows` rows of `width` values, row `r` at `y[r·stride..]`, on
/// `kernel`'s build.
///
/// # Panics
/// If `y` is too short for the rows given.
pub fn apply_rows(
    kernel: ActKernel,
    act: Activation,
    y: &mut [f32],
    stride: usize,
    rows: usize,
    width: usize,
) {
    if rows > 0 && width > 0 {
        assert!(
            stride >= width && y.len() >= (rows - 1) * stride + width,
            "y too short"
        );
    }
    // SAFETY: `y` holds every row, as asserted.
    unsafe { apply_rows_raw(kernel, act, y.as_mut_ptr(), stride, rows, width) }
}

/// [`apply_rows`] on a raw output (tasks that own disjoint blocks of one matrix).
///
/// # Safety
/// `y.add(r·stride + i)` for `r < rows`, `i < width` must be valid for reads and writes and not
/// accessed by anything else during the call.
pub unsafe fn apply_rows_raw(
    kernel: ActKernel,
    act: Activation,
    y: *mut f32,
    stride: usize,
    rows: usize,
    width: usize,
) {
    // SAFETY: an `ActKernel` is made only for an ISA this CPU has; the caller vouches for the
    // rows.
    unsafe {
        match kernel.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::apply_rows(act, y, stride, rows, width),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => lanes::apply_rows_avx2(act, y, stride, rows, width),
            _ => lanes::apply_rows_portable(act, y, stride, rows, width),
        }
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
    fn both_gelus_match_the_f64_reference_on_a_wide_range_on_every_isa() {
        // -12..12 in steps of 1/64, plus the rows' masked tail (width 37 of stride 40)
        let values: Vec<f32> = (-768..=768).map(|i| i as f32 / 64.0).collect();
        let (rows, width, stride) = (values.len().div_ceil(37), 37, 40);
        for (isa, act) in Isa::available()
            .into_iter()
            .flat_map(|isa| [(isa, Activation::GeluErf), (isa, Activation::GeluTanh)])
        {
            let mut y = vec![f32::NAN; rows * stride];
            for (i, v) in values.iter().enumerate() {
                y[i / width * stride + i % width] = *v;
            }
            apply_rows(ActKernel::new(isa), act, &mut y, stride, rows, width);
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
                    "{isa} {act:?}({x}) = {got}, want {want}"
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
