//! Matrix products against a pre-packed weight panel: the projections of a transformer
//! (`x · W` with a constant `W`), a block of tokens times one panel of [`PANEL`] output
//! features at a time.
//!
//! A panel holds `W[kk][c0 + i]` at `kk·PANEL + i`: for each input feature the panel's output
//! features are one aligned row of 64 floats, four AVX-512 vectors. The micro-kernel keeps
//! `MR × 4` accumulators (`MR` = 6 tokens) in registers; per input feature it loads the panel
//! row once and broadcasts one input value per token, so the tokens are read in place (no copy
//! of `x`) and the weight is never repacked per call. That is the AVX-512 build
//! (`avx512.rs`); `avx2.rs` is the AVX2+FMA build (one token at a time over a 16 KB block of
//! the panel, read from memory once for all: for the few tokens of a decode step, where the
//! weights stream from memory) and `lanes.rs` the portable one (in lane arrays), which
//! [`PanelKernel`] picks where the CPU, or `ATTNRT_KERNEL_ISA`, allows no AVX-512.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod lanes;

use crate::act::Activation;
use crate::isa::Isa;

/// The panel kernel of a [`crate::KernelSet`]: which build runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PanelKernel {
    isa: Isa,
}

impl PanelKernel {
    /// The build for `isa`, which this CPU must have (the resolver's promise).
    pub(crate) fn new(isa: Isa) -> Self {
        PanelKernel { isa }
    }

    /// The build's ISA.
    pub fn isa(self) -> Isa {
        self.isa
    }
}

/// Output features per panel.
pub const PANEL: usize = 64;

/// Tokens per register tile.
const MR: usize = 6;

/// Output features per strip of the AVX2 and portable builds: one 64-byte line of a panel row.
const STRIP: usize = 16;

/// One product: `y[t][i] = act(alpha · Σₖₖ x[t][kk] · panel[kk·PANEL + i] + addend)` for
/// `t < tokens`, `i < width`, the addend given by [`PanelProduct::onto`], `act` by
/// [`PanelProduct::activation`] (none: the identity).
pub struct PanelProduct<'a> {
    /// `tokens` rows of `k` inputs, row `t` at `x[t·x_stride..]`
    pub x: &'a [f32],
    /// distance between token rows of `x`, `≥ k`
    pub x_stride: usize,
    /// rows of `x` and `y`
    pub tokens: usize,
    /// input features
    pub k: usize,
    /// `k · PANEL` weights
    pub panel: &'a [f32],
    /// output features of this panel used, `≤ PANEL`
    pub width: usize,
    /// scale of the product
    pub alpha: f32,
    /// what the product is added onto
    pub onto: Onto<'a>,
    /// applied to the sum as it is stored
    pub activation: Option<Activation>,
}

/// What a [`PanelProduct`] adds its product onto.
#[derive(Clone, Copy, Debug)]
pub enum Onto<'a> {
    /// nothing: `y` is overwritten
    Zero,
    /// `y`'s own values
    Output,
    /// one row of `width` values (a bias), the same for every token; `y` is overwritten
    Row(&'a [f32]),
}

/// Runs `p` into `y` (row `t` at `y[t·y_stride..]`, `width` elements) on `kernel`'s build.
///
/// # Panics
/// If the slices are too short for the sizes given.
pub fn panel_product(kernel: PanelKernel, p: &PanelProduct, y: &mut [f32], y_stride: usize) {
    if p.tokens > 0 && p.width > 0 {
        assert!(
            y.len() >= (p.tokens - 1) * y_stride + p.width,
            "y too short"
        );
    }
    // SAFETY: `y` is borrowed mutably and holds every row written.
    unsafe { panel_product_raw(kernel, p, y.as_mut_ptr(), y_stride) }
}

/// [`panel_product`] into a raw output (tasks that write disjoint blocks of one matrix).
///
/// # Safety
/// `y.add(t·y_stride + i)` for `t < tokens`, `i < width` must be valid for reads and writes and
/// not accessed by anything else during the call.
///
/// # Panics
/// If `x` or the panel are too short for the sizes given.
pub unsafe fn panel_product_raw(
    kernel: PanelKernel,
    p: &PanelProduct,
    y: *mut f32,
    y_stride: usize,
) {
    assert!(p.width <= PANEL && p.x_stride >= p.k && y_stride >= p.width);
    assert!(p.panel.len() >= p.k * PANEL, "panel shorter than k·PANEL");
    if let Onto::Row(row) = p.onto {
        assert!(row.len() >= p.width, "row shorter than the width");
    }
    if p.tokens == 0 || p.width == 0 {
        return;
    }
    assert!(
        p.x.len() >= (p.tokens - 1) * p.x_stride + p.k,
        "x too short"
    );
    // SAFETY: a `PanelKernel` is made only for an ISA this CPU has; the asserts above keep
    // every read of x and the panel inside their slices, the caller vouches for y.
    unsafe {
        match kernel.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::product(p, y, y_stride),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::product(p, y, y_stride),
            _ => lanes::product_portable(p, y, y_stride),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::ramp;

    #[test]
    fn matches_a_naive_product_on_every_isa_tile_height_width_addend_and_activation() {
        for isa in Isa::available() {
            matches_a_naive_product(PanelKernel::new(isa));
        }
    }

    /// The output of `tokens` rows of `x` times `panel` (a bias row, GELU at the last block).
    /// The data is made once by the caller: `ramp`'s `sin` may be folded at compile time where
    /// it is inlined, one ulp away from the run-time value.
    fn product_of(
        kernel: PanelKernel,
        x: &[f32],
        tokens: usize,
        data: &(Vec<f32>, Vec<f32>),
    ) -> Vec<f32> {
        let (panel, row) = data;
        let (k, width) = (x.len() / tokens, row.len());
        let mut y = vec![0.0f32; tokens * width];
        let p = PanelProduct {
            x,
            x_stride: k,
            tokens,
            k,
            panel,
            width,
            alpha: 0.75,
            onto: Onto::Row(row),
            activation: Some(Activation::GeluTanh),
        };
        panel_product(kernel, &p, &mut y, width);
        y
    }

    /// A panel of `k` rows and a bias row of `width`.
    fn panel_data(k: usize, width: usize) -> (Vec<f32>, Vec<f32>) {
        (ramp(k * PANEL, 0.2), ramp(width, 0.4))
    }

    #[test]
    fn a_token_s_outputs_do_not_depend_on_the_other_tokens_of_the_call() {
        // A batch row's decode step must give what the row alone gives: every token group of
        // the AVX2 build sums in the same order.
        // Width 53 stores strip by strip, 64 (a full panel) from the AVX2 build's registers.
        for (tokens, k, width) in [(7, 300, 53), (8, 200, 64), (4, 768, 64)] {
            let x = ramp(tokens * k, 0.1);
            let data = panel_data(k, width);
            for isa in Isa::available() {
                let kernel = PanelKernel::new(isa);
                let all = product_of(kernel, &x, tokens, &data);
                for t in 0..tokens {
                    let alone = product_of(kernel, &x[t * k..(t + 1) * k], 1, &data);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&all[t * width..(t + 1) * width]),
                        bits(&alone),
                        "{isa:?}: token {t} of {tokens}, width {width}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_avx2_build_matches_the_portable_one() {
        if !Isa::available().contains(&Isa::Avx2) {
            return;
        }
        let shapes = [
            (768, 64),
            (129, 64),
            (257, 40),
            (64, 16),
            (131, 63),
            (65, 64),
            (3, 33),
        ];
        for (tokens, (k, width)) in (1..=9).flat_map(|t| shapes.map(|s| (t, s))) {
            let x = ramp(tokens * k, 0.1);
            let data = panel_data(k, width);
            let avx2 = product_of(PanelKernel::new(Isa::Avx2), &x, tokens, &data);
            let portable = product_of(PanelKernel::new(Isa::Scalar), &x, tokens, &data);
            for (i, (a, b)) in avx2.iter().zip(&portable).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "tokens {tokens} k {k} width {width}: [{i}] avx2 {a}, portable {b}"
                );
            }
        }
    }

    fn matches_a_naive_product(kernel: PanelKernel) {
        // addend: 0 nothing, 1 the output's values, 2 a row (bias)
        let (erf, tanh) = (Some(Activation::GeluErf), Some(Activation::GeluTanh));
        for (tokens, k, width, addend, activation) in [
            (13, 70, 64, 0, None),
            (9, 300, 64, 2, erf),
            (8, 257, 31, 1, tanh),
            (6, 3, 17, 1, None),
            (1, 128, 64, 2, tanh),
            (11, 1, 1, 0, erf),
            (7, 33, 48, 1, None),
            (5, 131, 20, 2, None),
            (4, 200, 64, 1, None),
            (3, 150, 64, 0, tanh),
            (2, 64, 64, 2, None),
        ] {
            let xs = k + 3;
            let ys = width + 5;
            let x = ramp(tokens * xs, 0.1);
            let panel = ramp(k * PANEL, 0.2);
            let y0 = ramp(tokens * ys, 0.3);
            let row = ramp(width, 0.4);
            let mut y = y0.clone();
            let p = PanelProduct {
                x: &x,
                x_stride: xs,
                tokens,
                k,
                panel: &panel,
                width,
                alpha: 0.5,
                onto: [Onto::Zero, Onto::Output, Onto::Row(&row)][addend],
                activation,
            };
            panel_product(kernel, &p, &mut y, ys);
            for t in 0..tokens {
                for c in 0..ys {
                    let got = y[t * ys + c];
                    if c >= width {
                        assert_eq!(got, y0[t * ys + c], "t{t} c{c} outside the width");
                        continue;
                    }
                    let dot: f64 = (0..k)
                        .map(|kk| x[t * xs + kk] as f64 * panel[kk * PANEL + c] as f64)
                        .sum();
                    let base = [0.0, y0[t * ys + c], row[c]][addend] as f64;
                    let sum = base + 0.5 * dot;
                    let want = activation.map_or(sum, |a| a.reference(sum));
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * (1.0 + sum.abs()),
                        "{kernel:?} tokens {tokens} k {k} width {width} addend {addend}: \
                         y[{t}][{c}] = {got}, want {want}"
                    );
                }
            }
        }
    }
}
