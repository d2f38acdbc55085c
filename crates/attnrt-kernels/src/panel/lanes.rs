//! The panel kernel over lane arrays (`crate::lanes`): the portable build (and the stores of the
//! AVX2 one). One token at a time against a block of [`KC`] panel rows (32 KB, in L1 while the
//! block's tokens use it), the panel's 64 outputs in four 16-lane accumulators.

use super::{Onto, PanelProduct, PANEL, STRIP};
use crate::act::lanes::apply;
use crate::lanes::{load, madd_lanes};

/// Input features per block.
const KC: usize = 128;

/// Lanes per accumulator; `PANEL / L` accumulators.
const L: usize = STRIP;

/// [`super::panel_product_raw`] on lane arrays.
///
/// # Safety
/// As `panel_product_raw`, with its asserts passed.
#[inline(always)]
unsafe fn product<const FMA: bool>(p: &PanelProduct, y: *mut f32, y_stride: usize) {
    let mut k0 = 0;
    while k0 < p.k {
        let kc = KC.min(p.k - k0);
        let last = k0 + kc == p.k;
        for t in 0..p.tokens {
            let mut acc = [[0.0f32; L]; PANEL / L];
            // SAFETY: the asserts of `panel_product_raw` keep x's row and the panel rows inside
            // their slices.
            let x = unsafe { p.x.as_ptr().add(t * p.x_stride + k0) };
            let w = unsafe { p.panel.as_ptr().add(k0 * PANEL) };
            for kk in 0..kc {
                let a = [unsafe { *x.add(kk) }; L];
                for (j, acc_j) in acc.iter_mut().enumerate() {
                    let wv = unsafe { load::<L>(w.add(kk * PANEL + j * L)) };
                    *acc_j = madd_lanes::<FMA, L>(a, wv, *acc_j);
                }
            }
            // SAFETY: row t of the output is the caller's.
            let yr = unsafe { y.add(t * y_stride) };
            unsafe { store::<FMA>(p, &acc, yr, k0 > 0, last) };
        }
        k0 += kc;
    }
}

/// Stores one token's block: `y = act(alpha·acc + addend)`, the addend `p.onto` for the first
/// block and `y` itself after it, the activation at the last block only.
///
/// # Safety
/// `yr..yr + p.width` is the caller's.
#[inline(always)]
unsafe fn store<const FMA: bool>(
    p: &PanelProduct,
    acc: &[[f32; L]; PANEL / L],
    yr: *mut f32,
    after_first: bool,
    last: bool,
) {
    for (j, acc_j) in acc.iter().enumerate() {
        if j * L >= p.width {
            break;
        }
        // SAFETY: as the caller vouches.
        unsafe { store_strip::<FMA>(p, j, acc_j, yr, after_first, last) };
    }
}

/// [`store`] of strip `j` (the token's outputs `j·STRIP..`, `j·STRIP < p.width`) only; the
/// AVX2 build (`avx2.rs`) stores its strips with it.
///
/// # Safety
/// `yr..yr + p.width` is the caller's.
#[inline(always)]
pub(super) unsafe fn store_strip<const FMA: bool>(
    p: &PanelProduct,
    j: usize,
    acc_j: &[f32; STRIP],
    yr: *mut f32,
    after_first: bool,
    last: bool,
) {
    let c0 = j * L;
    let lanes = (p.width - c0).min(L);
    let mut addend = [0.0f32; L];
    let from = match p.onto {
        _ if after_first => Some(yr.add(c0) as *const f32),
        Onto::Zero => None,
        Onto::Output => Some(yr.add(c0) as *const f32),
        Onto::Row(row) => Some(row.as_ptr().add(c0)),
    };
    if let Some(from) = from {
        std::ptr::copy_nonoverlapping(from, addend.as_mut_ptr(), lanes);
    }
    let mut v = madd_lanes::<FMA, L>([p.alpha; L], *acc_j, addend);
    if let (true, Some(act)) = (last, p.activation) {
        v = apply::<FMA, L>(act, v);
    }
    std::ptr::copy_nonoverlapping(v.as_ptr(), yr.add(c0), lanes);
}

/// [`super::panel_product_raw`] for the baseline target.
///
/// # Safety
/// As [`product`].
pub(super) unsafe fn product_portable(p: &PanelProduct, y: *mut f32, y_stride: usize) {
    // SAFETY: as the caller vouches.
    unsafe { product::<false>(p, y, y_stride) }
}
