//! The panel kernel on AVX-512F: `MR × 4` zmm accumulators, the panel row loaded once per input
//! feature, one input broadcast per token.

use std::arch::x86_64::*;

use super::{Onto, PanelProduct, MR, PANEL};
use crate::act::{avx512::apply, Activation};

/// [`super::panel_product_raw`] with AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F; `p`'s slices hold what its sizes say and `y` is the caller's, as
/// `panel_product_raw` says.
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
        // Each tile prefetches its share of the next block's lines, spread over its kc steps
        // (one line a step for many tiles; a decode step's single tile takes four a step, a
        // whole panel row, so that all the next block is asked for, not its first quarter).
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
        // The prefetch lines spread over the kc input features, rounded up.
        let lines_per_step = self.prefetch_lines.div_ceil(self.kc);
        for kk in 0..self.kc {
            let first = kk * lines_per_step;
            for l in first..(first + lines_per_step).min(self.prefetch_lines) {
                let line = self.prefetch.wrapping_add(l * LINE);
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
