//! The AVX2+FMA build of the panel kernel, shaped for the few tokens of a (batched) decode step,
//! where the weights stream from memory: per block of [`KC`] panel rows (16 KB), each token in
//! turn runs the block's rows with the panel's 64 outputs in eight ymm accumulators. The first
//! token reads the block from memory in order (the hardware prefetchers follow it; software
//! prefetches of the next block measured 1–18 % slower), the others reuse it from L1, so a batch
//! reads each panel once. Each token's sums run in the same order (per block, input features in
//! order) whatever the other tokens, so a batch row's outputs are those of the row alone.

use std::arch::x86_64::*;

use super::lanes::store_strip;
use super::{PanelProduct, PANEL, STRIP};

/// Panel rows per block: 16 KB, half of L1.
const KC: usize = 64;

/// ymm registers per panel row.
const VECS: usize = PANEL / 8;

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
        for t in 0..p.tokens {
            let x = unsafe { p.x.as_ptr().add(t * p.x_stride + k0) };
            let acc = unsafe { token_block(x, w, kc) };
            let yr = unsafe { y.add(t * y_stride) };
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
        k0 += kc;
    }
}

/// `Σ x[kk] · w[kk·PANEL..][..PANEL]` over `kk < kc`, in order.
///
/// # Safety
/// AVX2 and FMA available; `x..x + kc` and `w..w + kc·PANEL` readable.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn token_block(x: *const f32, w: *const f32, kc: usize) -> [__m256; VECS] {
    let mut acc = [_mm256_setzero_ps(); VECS];
    for kk in 0..kc {
        // SAFETY: as the caller vouches.
        let (a, row) = unsafe { (_mm256_broadcast_ss(&*x.add(kk)), w.add(kk * PANEL)) };
        for (j, acc_j) in acc.iter_mut().enumerate() {
            let wv = unsafe { _mm256_loadu_ps(row.add(j * 8)) };
            *acc_j = _mm256_fmadd_ps(a, wv, *acc_j);
        }
    }
    acc
}
