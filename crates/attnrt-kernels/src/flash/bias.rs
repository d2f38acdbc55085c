//! Soft-cap, mask and causal rule on one score tile `Sᵀ[key][BQ]` (key-major, queries in the
//! lanes).

// The tiles pass raw tile pointers and strides; bundling them would obscure the loops.
#![allow(clippy::too_many_arguments)]

use super::simd::FlashSimd;
use super::{Job, JobMask};

/// Soft-cap, mask and causal rule on one score tile (`nq` live query lanes in `N` vectors) of
/// queries from `i0` and keys `j0..j0 + nk` of q-head `h` of batch `b`.
#[inline(always)]
pub(super) unsafe fn bias_block<S: FlashSimd, const N: usize>(
    job: &Job,
    b: usize,
    h: usize,
    i0: usize,
    nq: usize,
    j0: usize,
    nk: usize,
    s: *mut f32,
) {
    let bq = S::BQ;
    if let Some(c) = job.softcap {
        for j in 0..nk {
            for q in 0..nq {
                let x = s.add(j * bq + q);
                *x = c * (*x / c).tanh();
            }
        }
    }
    // A tile where the mask is all zeros (below the triangle of a causal mask) is not read.
    let zero = job
        .key_ends
        .as_ref()
        .is_some_and(|e| e.zero_tile(b, h, i0, j0));
    match if zero { JobMask::None } else { job.mask } {
        JobMask::None => {}
        JobMask::Additive(ptr, st) if st[2] == 0 => {
            // One value per key for all queries (e.g. a `[B, 1, 1, Lk]` padding mask):
            // a vector add per key row. Dead lanes get it too, harmlessly.
            let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
            for j in 0..nk {
                let mv = S::splat(*base.offset((j0 + j) as isize * st[3]));
                for n in 0..N {
                    let x = s.add(j * bq + n * S::LANES);
                    S::store(x, S::add(S::load(x), mv));
                }
            }
        }
        JobMask::Boolean(ptr, st) if st[2] == 0 => {
            let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
            let neg_inf = S::splat(f32::NEG_INFINITY);
            for j in 0..nk {
                if !*base.offset((j0 + j) as isize * st[3]) {
                    for n in 0..N {
                        S::store(s.add(j * bq + n * S::LANES), neg_inf);
                    }
                }
            }
        }
        JobMask::Additive(ptr, st) if st[3] == 1 => {
            let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
            add_rows_transposed::<S>(base, st[2], i0, nq, j0, nk, s);
        }
        JobMask::Additive(ptr, st) => {
            let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
            for j in 0..nk {
                let col = base.offset((j0 + j) as isize * st[3]);
                for q in 0..nq {
                    *s.add(j * bq + q) += *col.offset((i0 + q) as isize * st[2]);
                }
            }
        }
        JobMask::Boolean(ptr, st) => {
            let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
            for j in 0..nk {
                let col = base.offset((j0 + j) as isize * st[3]);
                for q in 0..nq {
                    if !*col.offset((i0 + q) as isize * st[2]) {
                        *s.add(j * bq + q) = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
    if let Some(off) = job.causal {
        causal::<S>(off, i0, nq, j0, nk, s);
    }
}

/// Adds an additive mask that varies along queries (e.g. `[B, 1, Lq, Lk]`, rows `row_stride`
/// apart from `base`, unit key stride). It is stored query-major, the tile key-major:
/// `LANES`×`LANES` pieces (`LANES` queries' runs of `LANES` keys, contiguous) are transposed in
/// registers, the key tail element-wise.
#[inline(always)]
unsafe fn add_rows_transposed<S: FlashSimd>(
    base: *const f32,
    row_stride: isize,
    i0: usize,
    nq: usize,
    j0: usize,
    nk: usize,
    s: *mut f32,
) {
    let (lanes, bq) = (S::LANES, S::BQ);
    let nk_full = nk - nk % lanes;
    for q0 in (0..nq).step_by(lanes) {
        let live = (nq - q0).min(lanes);
        let rows = base.offset((i0 + q0) as isize * row_stride + j0 as isize);
        let mut jg = 0;
        while jg < nk_full {
            let mut t = S::zero_tile();
            for (r, x) in t.as_mut().iter_mut().enumerate().take(live) {
                *x = S::load(rows.offset(r as isize * row_stride).add(jg));
            }
            S::transpose(&mut t);
            for (k, x) in t.as_ref().iter().enumerate() {
                let sp = s.add((jg + k) * bq + q0);
                S::store(sp, S::add(S::load(sp), *x));
            }
            jg += lanes;
        }
        for j in nk_full..nk {
            for r in 0..live {
                *s.add(j * bq + q0 + r) += *rows.offset(r as isize * row_stride).add(j);
            }
        }
    }
}

/// The causal rule: query `i0 + q` may see keys `j ≤ i0 + q + off`; only tiles crossing the
/// frontier of the block's first query need work.
#[inline(always)]
unsafe fn causal<S: FlashSimd>(
    off: isize,
    i0: usize,
    nq: usize,
    j0: usize,
    nk: usize,
    s: *mut f32,
) {
    let first_limit = (i0 as isize).saturating_add(off);
    if (j0 + nk - 1) as isize > first_limit {
        for j in 0..nk {
            let key = (j0 + j) as isize;
            for q in 0..nq {
                if key > ((i0 + q) as isize).saturating_add(off) {
                    *s.add(j * S::BQ + q) = f32::NEG_INFINITY;
                }
            }
        }
    }
}
