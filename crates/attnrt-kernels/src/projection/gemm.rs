//! The bridge to the `gemm` crate: one block of a projection as one single-threaded call of its
//! kernel (which picks its own SIMD path: AVX-512 with the `x86-v4` feature, else FMA), reading
//! the packed panel in place.

use crate::act::{apply_rows_raw, ActKernel};
use crate::panel::{Onto, PanelProduct, PANEL};

/// Runs `p` on the `gemm` crate into `block` (row stride `n`): the product added onto what
/// `p.onto` says (a bias row is copied into the block first), then its activation over the rows
/// on `act`.
///
/// # Safety
/// `block.add(t·n + i)` for `t < p.tokens`, `i < p.width` must be valid for reads and writes and
/// not accessed by anything else during the call; `p`'s slices hold what its sizes say.
///
/// # Panics
/// If `p` has an activation and `act` is `None`.
pub(super) unsafe fn gemm_block(
    p: &PanelProduct,
    block: *mut f32,
    n: usize,
    act: Option<ActKernel>,
) {
    if let Onto::Row(row) = p.onto {
        for t in 0..p.tokens {
            // SAFETY: row t of the block, as the caller vouches.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), block.add(t * n), p.width) };
        }
    }
    // SAFETY: the gemm computes the `width × tokens` block yᵀ = panelᵀ · xᵀ: the panel holds `k`
    // columns of PANEL contiguous floats, x's rows are `k` contiguous floats `x_stride` apart,
    // and the block (column stride n, row stride 1) is the caller's. With `read_dst` the gemm
    // computes `1·y + alpha·product`, and y holds the bias or its own values then.
    unsafe {
        gemm::gemm(
            p.width,
            p.tokens,
            p.k,
            block,
            n as isize,
            1,
            !matches!(p.onto, Onto::Zero),
            p.panel.as_ptr(),
            PANEL as isize,
            1,
            p.x.as_ptr(),
            p.x_stride as isize,
            1,
            1.0f32,
            p.alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    if let Some(activation) = p.activation {
        let act = act.expect("an activation epilogue the projection kernel does not support");
        // SAFETY: the caller's block.
        unsafe { apply_rows_raw(act, activation, block, n, p.tokens, p.width) };
    }
}
