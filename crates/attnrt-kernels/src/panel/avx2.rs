//! The AVX2+FMA build of the panel kernel, shaped for the few tokens of a (batched) decode step,
//! where the weights stream from memory: per block of [`KC`] panel rows (16 KB), each token in
//! turn runs the block's rows with the panel's 64 outputs in eight ymm accumulators. The first
//! token reads the block from memory in order (the hardware prefetchers follow it), the others
//! reuse it from L1, so a batch reads each panel once. From [`PREFETCH_FROM`] tokens, where the
//! tokens' arithmetic outlasts a block's load, the passes also prefetch a block ahead. Each token's sums run in the same order
//! (per block, input features in order) whatever the other tokens, so a batch row's outputs are
//! those of the row alone. A full panel's block is stored straight from the accumulators
//! ([`store_token`]); the strip-by-strip store through lane arrays it replaces cost eight
//! `memcpy` calls per token and block.
//!
//! Measured on a 2-vCPU AMD EPYC Zen 3 VM (AVX2, no AVX-512), `benches/benches/decode_batch.rs`
//! (12 layers of the 125M decoder's projections, 302 MB, 2 threads; benches/README.md, section
//! "Batch decode projection kernel"), in paired rounds against each other:
//! - the register store: process CPU time 0.90–0.91 of the strip store's at 4 tokens, 0.96–0.98
//!   at 1, 0.95 at 2, 0.85 at 8; 0.93 with the weights hot (bit-identical outputs);
//! - software prefetches (`_mm_prefetch` T0, T1, T2 or NTA, 2, 4, 8 or 16 blocks ahead, the
//!   block's lines spread over all tokens' passes, or every other line): 4 tokens 0.86–1.03 of
//!   no prefetch from run to run (1.00 over 100 rounds), 2 tokens 1.01–1.19, 5 tokens 0.97, 6
//!   tokens 0.93, 8 tokens 0.68–0.92 (0.88 over 100 rounds); one token prefetching too:
//!   1.13–1.32. Kept from [`PREFETCH_FROM`] tokens: T2, [`DISTANCE`] blocks ahead;
//! - the tokens interleaved sub-block by sub-block (8, 16 or 32 rows, each token's sums kept
//!   between them): 1.01–1.06 at 4 tokens, 1.05–1.09 at 1 — not kept;
//! - pairs or triples of tokens sharing each half-panel row's four weight loads: 0.96 (pairs)
//!   and 1.08–1.18 (triples) of one token at a time at 4 tokens, weights hot — not kept.
//! - [`KC`] 16, 32 or 128 rows instead of 64 (cold, 160 rounds): at 4 tokens CPU time 1.18,
//!   1.04 and 1.00 of 64's, at 1 token 1.01, 1.00 and 0.98 — 64 kept.

use std::arch::x86_64::*;

use super::lanes::store_strip;
use super::{Onto, PanelProduct, PANEL, STRIP};

/// Panel rows per block: 16 KB, half of L1.
const KC: usize = 64;

/// ymm registers per panel row.
const VECS: usize = PANEL / 8;

/// Tokens from which a block's passes prefetch the block [`DISTANCE`] ahead into L2.
const PREFETCH_FROM: usize = 6;

/// Blocks ahead a prefetch reads.
const DISTANCE: usize = 4;

/// 64-byte lines per block.
const BLOCK_LINES: usize = KC * PANEL * 4 / 64;

/// [`super::panel_product_raw`] on AVX2+FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA; the asserts of `panel_product_raw` passed.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn product(p: &PanelProduct, y: *mut f32, y_stride: usize) {
    let mut k0 = 0;
    while k0 < p.k {
        let kc = KC.min(p.k - k0);
        let (after_first, last) = (k0 > 0, k0 + kc == p.k);
        // SAFETY: the asserts of `panel_product_raw` keep the block's panel rows and each
        // token's inputs `k0..k0 + kc` inside their slices; row `t` of `y` is the caller's.
        let w = unsafe { p.panel.as_ptr().add(k0 * PANEL) };
        // Past the panel's end: the next panel's first blocks, as the tasks run them (a
        // prefetch is a hint and never faults).
        let ahead = w.wrapping_add(DISTANCE * KC * PANEL) as *const i8;
        for t in 0..p.tokens {
            let x = unsafe { p.x.as_ptr().add(t * p.x_stride + k0) };
            let acc = if p.tokens >= PREFETCH_FROM {
                // Token t's share of the lines, so the block's passes prefetch each once.
                let lines = ahead.wrapping_add(t * BLOCK_LINES / p.tokens * 64);
                let count = (t + 1) * BLOCK_LINES / p.tokens - t * BLOCK_LINES / p.tokens;
                unsafe { token_block::<true>(x, w, kc, lines, count) }
            } else {
                unsafe { token_block::<false>(x, w, kc, ahead, 0) }
            };
            let yr = unsafe { y.add(t * y_stride) };
            unsafe { store_token(p, &acc, yr, after_first, last) };
        }
        k0 += kc;
    }
}

/// `Σ x[kk] · w[kk·PANEL..][..PANEL]` over `kk < kc`, in order; with `PREFETCH`, the `count`
/// lines from `lines` prefetched into L2 along the way, spread evenly over the rows (no
/// division in the loop: one measured slower than the prefetches won).
///
/// # Safety
/// AVX2 and FMA available; `x..x + kc` and `w..w + kc·PANEL` readable.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn token_block<const PREFETCH: bool>(
    x: *const f32,
    w: *const f32,
    kc: usize,
    mut lines: *const i8,
    count: usize,
) -> [__m256; VECS] {
    let mut acc = [_mm256_setzero_ps(); VECS];
    let mut owed = 0;
    for kk in 0..kc {
        if PREFETCH {
            owed += count;
            while owed >= kc {
                _mm_prefetch::<_MM_HINT_T2>(lines);
                lines = lines.wrapping_add(64);
                owed -= kc;
            }
        }
        // SAFETY: as the caller vouches.
        let (a, row) = unsafe { (_mm256_broadcast_ss(&*x.add(kk)), w.add(kk * PANEL)) };
        for (j, acc_j) in acc.iter_mut().enumerate() {
            let wv = unsafe { _mm256_loadu_ps(row.add(j * 8)) };
            *acc_j = _mm256_fmadd_ps(a, wv, *acc_j);
        }
    }
    acc
}

/// Stores one token's block: `y = act(alpha·acc + addend)`, the addend `p.onto` for the first
/// block and `y` itself after it, the activation at the last block only. A full panel with no
/// activation to apply is stored from the registers (the fused multiply-add `store_strip`
/// computes lane by lane, so the same bits); the rest strip by strip through `store_strip`.
///
/// # Safety
/// AVX2 and FMA available; `yr..yr + p.width` is the caller's.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn store_token(
    p: &PanelProduct,
    acc: &[__m256; VECS],
    yr: *mut f32,
    after_first: bool,
    last: bool,
) {
    if p.width == PANEL && !(last && p.activation.is_some()) {
        let alpha = _mm256_set1_ps(p.alpha);
        for (j, acc_j) in acc.iter().enumerate() {
            // SAFETY: as the caller vouches; a bias row holds `p.width` values (asserted by
            // `panel_product_raw`).
            unsafe {
                let addend = match p.onto {
                    _ if after_first => _mm256_loadu_ps(yr.add(j * 8)),
                    Onto::Zero => _mm256_setzero_ps(),
                    Onto::Output => _mm256_loadu_ps(yr.add(j * 8)),
                    Onto::Row(row) => _mm256_loadu_ps(row.as_ptr().add(j * 8)),
                };
                _mm256_storeu_ps(yr.add(j * 8), _mm256_fmadd_ps(alpha, *acc_j, addend));
            }
        }
        return;
    }
    for s in 0..PANEL / STRIP {
        if s * STRIP >= p.width {
            break;
        }
        let mut sums = [0.0f32; STRIP];
        // SAFETY: `sums` holds two vectors; the output row is the caller's.
        unsafe {
            _mm256_storeu_ps(sums.as_mut_ptr(), acc[2 * s]);
            _mm256_storeu_ps(sums.as_mut_ptr().add(8), acc[2 * s + 1]);
            store_strip::<true>(p, s, &sums, yr, after_first, last);
        }
    }
}
