//! Matrix products against a pre-packed weight panel: the projections of a transformer
//! (`x · W` with a constant `W`), a block of tokens times one panel of [`PANEL`] output
//! features at a time.
//!
//! A panel holds `W[kk][c0 + i]` at `kk·PANEL + i`: for each input feature the panel's output
//! features are one aligned row of 64 floats, four AVX-512 vectors. The micro-kernel keeps
//! `MR × 4` accumulators (`MR` = 6 tokens) in registers; per input feature it loads the panel
//! row once and broadcasts one input value per token, so the tokens are read in place (no copy
//! of `x`) and the weight is never repacked per call. AVX-512 only: without it callers use
//! another implementation ([`panel_product`] reports whether it ran).

use crate::act::Activation;

/// Output features per panel.
pub const PANEL: usize = 64;

/// Tokens per register tile.
const MR: usize = 6;

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

/// Runs `p` into `y` (row `t` at `y[t·y_stride..]`, `width` elements) when the CPU has
/// AVX-512, returning `false` (and writing nothing) otherwise.
///
/// # Panics
/// If the slices are too short for the sizes given.
pub fn panel_product(p: &PanelProduct, y: &mut [f32], y_stride: usize) -> bool {
    if p.tokens > 0 && p.width > 0 {
        assert!(
            y.len() >= (p.tokens - 1) * y_stride + p.width,
            "y too short"
        );
    }
    // SAFETY: `y` is borrowed mutably and holds every row written.
    unsafe { panel_product_raw(p, y.as_mut_ptr(), y_stride) }
}

/// [`panel_product`] into a raw output (tasks that write disjoint blocks of one matrix).
///
/// # Safety
/// `y.add(t·y_stride + i)` for `t < tokens`, `i < width` must be valid for reads and writes and
/// not accessed by anything else during the call.
///
/// # Panics
/// If `x` or the panel are too short for the sizes given.
pub unsafe fn panel_product_raw(p: &PanelProduct, y: *mut f32, y_stride: usize) -> bool {
    assert!(p.width <= PANEL && p.x_stride >= p.k && y_stride >= p.width);
    assert!(p.panel.len() >= p.k * PANEL, "panel shorter than k·PANEL");
    if let Onto::Row(row) = p.onto {
        assert!(row.len() >= p.width, "row shorter than the width");
    }
    if p.tokens == 0 || p.width == 0 {
        return true;
    }
    assert!(
        p.x.len() >= (p.tokens - 1) * p.x_stride + p.k,
        "x too short"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F checked; the asserts above keep every read of x and the panel
        // inside their slices, the caller vouches for y.
        unsafe { avx512::product(p, y, y_stride) };
        return true;
    }
    let _ = y;
    false
}

/// Whether this CPU runs [`panel_product`] faster than the `gemm` crate's kernel on the same
/// packed panels for blocks of many tokens (a prefill), not only for the few tokens of a decode
/// step, where it is faster on every AVX-512 CPU measured. Measured per CPU family with
/// `cargo bench -p attnrt-benches --bench projection` (one thread): on AMD Zen 5 (family 1Ah)
/// the panel kernel is as fast or faster at 128 and 512 tokens (gemm time / panel time
/// 1.00–1.09, 85–95 % of the FMA peak); on an Intel Xeon VM (Sapphire Rapids class) `gemm` was
/// 3–24 % faster from 16 tokens on. Unmeasured CPUs keep `gemm`.
pub fn fastest_for_many_tokens() -> bool {
    static FASTEST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FASTEST.get_or_init(|| {
        crate::Isa::Avx512.is_available() && amd_family().is_some_and(|f| f >= 0x1A)
    })
}

/// The CPU family of an AMD CPU (the base family plus the extended one), `None` elsewhere.
fn amd_family() -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // SAFETY: CPUID exists on every x86_64 CPU; leaves 0 and 1 always do.
        #[allow(unused_unsafe)]
        let (vendor, signature) = unsafe { (__cpuid(0), __cpuid(1).eax) };
        let is_amd = vendor.ebx.to_le_bytes() == *b"Auth"
            && vendor.edx.to_le_bytes() == *b"enti"
            && vendor.ecx.to_le_bytes() == *b"cAMD";
        is_amd.then_some(family(signature))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The family in a CPUID leaf-1 signature: the base family, plus the extended one when the
/// base is 0Fh.
fn family(signature: u32) -> u32 {
    let base = (signature >> 8) & 0xF;
    let extended = if base == 0xF {
        (signature >> 20) & 0xFF
    } else {
        0
    };
    base + extended
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Onto, PanelProduct, MR, PANEL};
    use crate::act::{avx512::apply, Activation};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn product(p: &PanelProduct, y: *mut f32, y_stride: usize) {
        // Input features in blocks of KC: the block's panel rows (KC·256 bytes) stay in L1
        // while every token tile uses them; each block after the first adds onto y. The
        // weights usually come from memory (a model's weights do not fit the caches), so while
        // the tiles run on one block they prefetch the next block's rows into L2, a share per
        // tile; past the panel's last block, the rows that follow it in memory (the next
        // panel of the packed weight, which the same thread usually runs next).
        let tiles = p.tokens.div_ceil(MR);
        let mut k0 = 0;
        while k0 < p.k {
            let kc = KC.min(p.k - k0);
            // The first block adds onto what `p.onto` says, the others onto y.
            let onto = match p.onto {
                _ if k0 > 0 => Addend::Output,
                Onto::Zero => Addend::Zero,
                Onto::Output => Addend::Output,
                Onto::Row(row) => Addend::Row(row.as_ptr()),
            };
            // The last block's stores are the final values: the activation goes there.
            let activation = if k0 + kc == p.k { p.activation } else { None };
            let next = p.panel.as_ptr().wrapping_add((k0 + kc) * PANEL);
            let share = (KC * LINES_PER_ROW).div_ceil(tiles);
            let mut t = 0;
            while t < p.tokens {
                let rows = MR.min(p.tokens - t);
                let tile = Tile {
                    x: p.x.as_ptr().add(t * p.x_stride + k0),
                    xs: p.x_stride,
                    w: p.panel.as_ptr().add(k0 * PANEL),
                    kc,
                    y: y.add(t * y_stride),
                    ys: y_stride,
                    prefetch: next.wrapping_add(t / MR * share * LINE),
                    prefetch_lines: share,
                };
                match rows {
                    6 => tile.run::<6>(p.width, p.alpha, onto, activation),
                    5 => tile.run::<5>(p.width, p.alpha, onto, activation),
                    4 => tile.run::<4>(p.width, p.alpha, onto, activation),
                    3 => tile.run::<3>(p.width, p.alpha, onto, activation),
                    2 => tile.run::<2>(p.width, p.alpha, onto, activation),
                    _ => tile.run::<1>(p.width, p.alpha, onto, activation),
                }
                t += rows;
            }
            k0 += kc;
        }
    }

    /// What one k-block of a tile adds its product onto: [`Onto`] with the row as a pointer.
    #[derive(Clone, Copy)]
    enum Addend {
        Zero,
        Output,
        Row(*const f32),
    }

    /// Floats per cache line.
    const LINE: usize = 16;

    /// Cache lines per panel row.
    const LINES_PER_ROW: usize = PANEL / LINE;

    /// Input features per block of [`product`].
    const KC: usize = 128;

    /// One register tile's operands: `kc` inputs of up to `MR` token rows (`x`, row stride
    /// `xs`), the panel rows `w`, and the output rows `y` (row stride `ys`).
    struct Tile {
        x: *const f32,
        xs: usize,
        w: *const f32,
        kc: usize,
        y: *mut f32,
        ys: usize,
        /// lines to prefetch into L2 (a hint: never dereferenced, may lie past the panel)
        prefetch: *const f32,
        prefetch_lines: usize,
    }

    impl Tile {
        /// `R` tokens × the panel: `R·4` accumulators over the block's input features, then
        /// one (masked) store per vector: `y = act(alpha·acc + addend)`.
        #[inline(always)]
        unsafe fn run<const R: usize>(
            &self,
            width: usize,
            alpha: f32,
            onto: Addend,
            activation: Option<Activation>,
        ) {
            let mut acc = [[_mm512_setzero_ps(); 4]; R];
            for kk in 0..self.kc {
                if kk < self.prefetch_lines {
                    let line = self.prefetch.wrapping_add(kk * LINE);
                    _mm_prefetch::<_MM_HINT_T1>(line as *const i8);
                }
                let row = self.w.add(kk * PANEL);
                let wv = [
                    _mm512_loadu_ps(row),
                    _mm512_loadu_ps(row.add(16)),
                    _mm512_loadu_ps(row.add(32)),
                    _mm512_loadu_ps(row.add(48)),
                ];
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_ps(*self.x.add(r * self.xs + kk));
                    for (j, acc_rj) in acc_r.iter_mut().enumerate() {
                        *acc_rj = _mm512_fmadd_ps(a, wv[j], *acc_rj);
                    }
                }
            }
            let alpha = _mm512_set1_ps(alpha);
            for (r, acc_r) in acc.iter().enumerate() {
                let yr = self.y.add(r * self.ys);
                for (j, acc_rj) in acc_r.iter().enumerate() {
                    let c0 = j * 16;
                    if c0 >= width {
                        break;
                    }
                    let lanes = (width - c0).min(16);
                    let m: __mmask16 = if lanes == 16 {
                        0xffff
                    } else {
                        (1u16 << lanes) - 1
                    };
                    let dst = yr.add(c0);
                    let v = match onto {
                        Addend::Zero => _mm512_mul_ps(alpha, *acc_rj),
                        Addend::Output => {
                            _mm512_fmadd_ps(alpha, *acc_rj, _mm512_maskz_loadu_ps(m, dst))
                        }
                        Addend::Row(row) => {
                            _mm512_fmadd_ps(alpha, *acc_rj, _mm512_maskz_loadu_ps(m, row.add(c0)))
                        }
                    };
                    let v = match activation {
                        Some(act) => apply(act, v),
                        None => v,
                    };
                    _mm512_mask_storeu_ps(dst, m, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize, c: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * 0.37 + c).sin()).collect()
    }

    #[test]
    fn family_adds_the_extended_family_only_past_base_0f() {
        assert_eq!(family(0x00B4_0F40), 0x1A, "a Zen 5 signature");
        assert_eq!(family(0x00A1_0F11), 0x19, "a Zen 4 signature");
        assert_eq!(family(0x0008_06F8), 0x6, "a Sapphire Rapids signature");
        assert_eq!(family(0x0FF0_0600), 0x6, "extended bits ignored below 0Fh");
    }

    #[test]
    fn matches_a_naive_product_on_every_tile_height_width_addend_and_activation() {
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
            if !panel_product(&p, &mut y, ys) {
                return; // no AVX-512 here: nothing ran, nothing to check
            }
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
                        "tokens {tokens} k {k} width {width} addend {addend}: y[{t}][{c}] = \
                         {got}, want {want}"
                    );
                }
            }
        }
    }
}
