//! The tasks of one projection: blocks of up to [`TOKENS`] tokens × one panel of `PANEL` output
//! features, each one single-threaded call of the panel kernel or of `gemm` (whichever
//! [`ProjectionKernel`] picks for its tokens) that writes its own block of `y`.

use rayon::prelude::*;

use super::gemm::gemm_block;
use super::{Product, ProjectionKernel};
use crate::act::apply_rows;
use crate::panel::{panel_product_raw, Onto, PanelProduct, PANEL};
use crate::threads::ThreadPolicy;

/// Tokens per task.
const TOKENS: usize = 256;

/// A raw output pointer shared by the tasks of [`project`], which write disjoint blocks.
struct OutPtr(*mut f32);
// SAFETY: only used inside `project`, whose tasks write disjoint elements of a buffer borrowed
// mutably for the whole call.
unsafe impl Sync for OutPtr {}

/// `y[m×n] = product(x[m×k])`, all row-major and contiguous, on `kernel`, the tasks on the
/// current rayon pool when `threads` spreads them.
///
/// # Panics
/// If `x`, `y` or the bias do not fit the sizes, or the product has an activation and `kernel`
/// has no epilogue ([`ProjectionKernel::epilogue`]).
pub fn project(
    kernel: &ProjectionKernel,
    threads: &ThreadPolicy,
    x: &[f32],
    product: &Product,
    y: &mut [f32],
    m: usize,
) {
    let Product {
        w,
        alpha,
        bias,
        activation,
    } = *product;
    let (k, n) = (w.k(), w.n());
    assert!(x.len() == m * k && y.len() == m * n);
    assert!(bias.is_none_or(|b| b.len() == n));
    assert!(
        activation.is_none() || kernel.epilogue.is_some(),
        "an activation epilogue the projection kernel does not support"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        match bias {
            Some(b) => y.chunks_exact_mut(n).for_each(|row| row.copy_from_slice(b)),
            None => y.fill(0.0),
        }
        if let (Some(act), Some(epilogue)) = (activation, kernel.epilogue) {
            apply_rows(epilogue, act, y, n, m, n);
        }
        return;
    }
    let chunks = n.div_ceil(PANEL);
    let blocks = m.div_ceil(TOKENS);
    let out = OutPtr(y.as_mut_ptr());
    let out = &out;
    let task = |t: usize| {
        // Token-block major: consecutive tasks (one thread's share) reuse the same rows of x.
        let (tb, c) = (t / chunks, t % chunks);
        let t0 = tb * TOKENS;
        let tokens = TOKENS.min(m - t0);
        let c0 = c * PANEL;
        let features = PANEL.min(n - c0);
        let bias = bias.map(|b| &b[c0..c0 + features]);
        let block_product = PanelProduct {
            x: &x[t0 * k..(t0 + tokens) * k],
            x_stride: k,
            tokens,
            k,
            panel: w.panel(c),
            width: features,
            alpha,
            onto: bias.map_or(Onto::Zero, Onto::Row),
            activation,
        };
        // SAFETY: the block y[t0.., c0..c0 + features] (row stride n) is inside `y` and written
        // by this task only.
        let block = unsafe { out.0.add(t0 * n + c0) };
        match kernel.panel {
            Some((panel, most)) if tokens <= most => {
                // SAFETY: as above.
                unsafe { panel_product_raw(panel, &block_product, block, n) }
            }
            // SAFETY: as above.
            _ => unsafe { gemm_block(&block_product, block, n, kernel.epilogue) },
        }
    };
    let tasks = blocks * chunks;
    if threads.spreads_tasks(tasks) {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}
