//! The key/value cache of an attention call that appends to it: `present = past ++ current`
//! along the key axis ([`CacheAppend`], served by [`crate::attention_appending`]), and the copy
//! of a strided view's rows into a dense `present` ([`append_rows`]).
//!
//! A decode step with a long cache is bounded by memory traffic. Built in two passes (copy the
//! past into `present`, then attend to `present`) the step reads the past, writes `present` and
//! reads `present` again; the decode path instead reads each past row once, uses it for every
//! query of its GQA group while it is in L1, and stores it into `present` from there. Calls the
//! decode path does not serve (more than a few queries) copy first and run the flash kernel.

use rayon::prelude::*;

use crate::error::KernelError;
use crate::threads::ThreadPolicy;
use crate::view::{effective_strides, View4};

/// The cache of one call: the past keys and values (`[B, Hkv, P, D]` and `[B, Hkv, P, Dv]`,
/// any strides) and the `present` buffers they are appended to, dense row-major
/// `[B, Hkv, P + L, D]` and `[B, Hkv, P + L, Dv]` whose rows `P..P + L` already hold the
/// current keys and values. Rows `0..P` are written by the call.
pub struct CacheAppend<'v, 'a> {
    /// `past_key`, `[B, Hkv, P, D]`
    pub past_key: &'v View4<'a>,
    /// `past_value`, `[B, Hkv, P, Dv]`
    pub past_value: &'v View4<'a>,
    /// `present_key`, dense `[B, Hkv, P + L, D]`
    pub present_key: &'v mut [f32],
    /// `present_value`, dense `[B, Hkv, P + L, Dv]`
    pub present_value: &'v mut [f32],
    /// `P + L`: keys in `present`
    pub total: usize,
}

impl CacheAppend<'_, '_> {
    /// Dims of `present_key` and `present_value`, checked against the past and the buffers.
    pub(crate) fn present_dims(&self) -> Result<([usize; 4], [usize; 4]), KernelError> {
        self.past_key.validate("past_key")?;
        self.past_value.validate("past_value")?;
        let [b, h, p, d] = self.past_key.dims;
        let [vb, vh, vp, dv] = self.past_value.dims;
        if (vb, vh, vp) != (b, h, p) {
            return Err(KernelError::Shape(format!(
                "past_key {:?} and past_value {:?} differ in batch, heads or length",
                self.past_key.dims, self.past_value.dims
            )));
        }
        if self.total < p {
            return Err(KernelError::Shape(format!(
                "present holds {} keys, fewer than the past's {p}",
                self.total
            )));
        }
        let kd = [b, h, self.total, d];
        let vd = [b, h, self.total, dv];
        for (what, dims, len) in [
            ("present_key", kd, self.present_key.len()),
            ("present_value", vd, self.present_value.len()),
        ] {
            if dims.iter().product::<usize>() != len {
                return Err(KernelError::Shape(format!(
                    "{what} has {len} elements, not the {} of {dims:?}",
                    dims.iter().product::<usize>()
                )));
            }
        }
        Ok((kd, vd))
    }
}

/// Copies the strided view `v` (`[B, H, L, D]`) into the dense `[B, H, total, D]` buffer `out`
/// at key positions `offset..offset + L`, one `(batch, head)` slice per task, on the current
/// pool when `threads` spreads them. `out` must have `B·H·total·D` elements and
/// `offset + L ≤ total`.
pub fn append_rows(
    threads: &ThreadPolicy,
    v: &View4,
    out: &mut [f32],
    total: usize,
    offset: usize,
) {
    let [_, _, l_n, d_n] = v.dims;
    if total == 0 || d_n == 0 || l_n == 0 {
        return;
    }
    let slices = out.len() / (total * d_n);
    if !threads.spreads_tasks(slices) {
        return append_rows_here(v, out, total, offset);
    }
    assert!(offset + l_n <= total, "rows {offset}+{l_n} past {total}");
    out.par_chunks_mut(total * d_n)
        .enumerate()
        .for_each(|(bh, slice)| copy_slice(v, bh, slice, offset));
}

/// [`append_rows`] on the calling thread alone, whatever pool it runs on (or none: a caller
/// outside every pool, which must not start rayon's global one).
pub fn append_rows_here(v: &View4, out: &mut [f32], total: usize, offset: usize) {
    let [_, _, l_n, d_n] = v.dims;
    if total == 0 || d_n == 0 || l_n == 0 {
        return;
    }
    assert!(offset + l_n <= total, "rows {offset}+{l_n} past {total}");
    out.chunks_mut(total * d_n)
        .enumerate()
        .for_each(|(bh, slice)| copy_slice(v, bh, slice, offset));
}

/// The rows of `(batch, head)` slice `bh` of `v` into rows `offset..` of `slice` (one
/// `[total, D]` slice of the destination).
fn copy_slice(v: &View4, bh: usize, slice: &mut [f32], offset: usize) {
    let [_, h_n, l_n, d_n] = v.dims;
    let dst = &mut slice[offset * d_n..(offset + l_n) * d_n];
    copy_head(v, bh / h_n, bh % h_n, dst);
}

/// Rows `0..L` of `(b, h)` of `v` into `dst` (`L·D` dense elements).
fn copy_head(v: &View4, b: usize, h: usize, dst: &mut [f32]) {
    let [_, _, l_n, d_n] = v.dims;
    let st = effective_strides(&v.dims, &v.strides);
    let src = |l: usize, d: usize| {
        (b as isize * st[0] + h as isize * st[1] + l as isize * st[2] + d as isize * st[3]) as usize
    };
    if st[3] == 1 && (st[2] == d_n as isize || l_n == 1) {
        // Rows adjacent in the source too (a dense past, 4-D inputs): one block copy.
        let s = src(0, 0);
        dst.copy_from_slice(&v.data[s..s + l_n * d_n]);
        return;
    }
    for (l, row) in dst.chunks_exact_mut(d_n).enumerate() {
        if st[3] == 1 {
            let s = src(l, 0);
            row.copy_from_slice(&v.data[s..s + d_n]);
        } else {
            for (d, x) in row.iter_mut().enumerate() {
                *x = v.data[src(l, d)];
            }
        }
    }
}
