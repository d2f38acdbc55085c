//! Moving data between the caller's layout and the kernel's scratch: K/V rows copied densely,
//! `Qᵀ` packed (scaled, transposed), `Oᵀ` normalized and written back, and prefetches of rows
//! about to be read.

// The packing passes raw pointers and strides; bundling them would obscure the loops.
#![allow(clippy::too_many_arguments)]

use super::simd::{FlashSimd, MAX_BQ, MAX_LANES};

/// Copies `nk` rows of `n` elements (strides `rs`, `cs`) densely into `dst`. Inline vector
/// copies: a `memcpy` call per 256-byte row cost more than the copy itself.
#[inline(always)]
pub(super) unsafe fn pack_rows<S: FlashSimd>(
    src: *const f32,
    rs: isize,
    cs: isize,
    nk: usize,
    n: usize,
    dst: *mut f32,
) {
    for j in 0..nk {
        let row = src.offset(j as isize * rs);
        let out = dst.add(j * n);
        if cs == 1 {
            let mut e = 0;
            while e + S::LANES <= n {
                S::store(out.add(e), S::load(row.add(e)));
                e += S::LANES;
            }
            while e < n {
                *out.add(e) = *row.add(e);
                e += 1;
            }
        } else {
            for e in 0..n {
                *out.add(e) = *row.offset(e as isize * cs);
            }
        }
    }
}

/// Asks for the cache lines of `nk` rows of `n` elements (row stride `rs`, unit element
/// stride) ahead of their use: rows `H·D` floats apart defeat the hardware prefetcher.
#[inline(always)]
pub(super) unsafe fn prefetch_rows<S: FlashSimd>(src: *const f32, rs: isize, nk: usize, n: usize) {
    for j in 0..nk {
        let row = src.offset(j as isize * rs);
        let mut e = 0;
        while e < n {
            S::prefetch(row.add(e));
            e += 16;
        }
        S::prefetch(row.add(n - 1));
    }
}

/// Packs `Qᵀ[d][q] = scale·Q[i0+q][d]` (dead lanes 0). With unit element stride, each `LANES`
/// queries × `LANES` elements piece is read as contiguous row runs and transposed in registers
/// (gathers cost ~2 cycles per element on recent Intel cores, microcode mitigations included,
/// and were ~3 % of the kernel's time at L = 512); other strides use one gather per `LANES`
/// queries and element, or the portable transpose when the row offsets overflow the gathers'
/// i32 indices.
#[inline(always)]
pub(super) unsafe fn pack_q_block<S: FlashSimd>(
    qbase: *const f32,
    row_stride: isize,
    col_stride: isize,
    scale: f32,
    i0: usize,
    nq: usize,
    d: usize,
    qt: *mut f32,
) {
    let (lanes, bq) = (S::LANES, S::BQ);
    let first = qbase.offset(i0 as isize * row_stride);
    let sc = S::splat(scale);
    if col_stride == 1 {
        // Rows `H·D` floats apart (3-D layout) would otherwise be fetched one miss at a time.
        if d > 0 {
            prefetch_rows::<S>(first, row_stride, nq, d);
        }
        let d_full = d - d % lanes;
        for q0 in (0..bq).step_by(lanes) {
            let live = nq.saturating_sub(q0).min(lanes);
            let rows = first.offset(q0 as isize * row_stride);
            let mut e0 = 0;
            while e0 < d_full {
                let mut t = S::zero_tile();
                for (r, x) in t.as_mut().iter_mut().enumerate().take(live) {
                    *x = S::load(rows.offset(r as isize * row_stride).add(e0));
                }
                S::transpose(&mut t);
                for (k, x) in t.as_ref().iter().enumerate() {
                    S::store(qt.add((e0 + k) * bq + q0), S::mul(*x, sc));
                }
                e0 += lanes;
            }
            for e in d_full..d {
                for r in 0..lanes {
                    *qt.add(e * bq + q0 + r) = if r < live {
                        *rows.offset(r as isize * row_stride).add(e) * scale
                    } else {
                        0.0
                    };
                }
            }
        }
        return;
    }
    let fits = row_stride
        .checked_mul(bq as isize)
        .is_some_and(|x| x.unsigned_abs() <= i32::MAX as usize);
    if !fits {
        pack_qt(qbase, row_stride, col_stride, scale, i0, nq, d, bq, qt);
        return;
    }
    // Query q's row offset, for the gathers (`idx[n·LANES..]` serves vector n).
    let mut idx = [0i32; MAX_BQ];
    for (q, x) in idx.iter_mut().enumerate().take(bq) {
        // Fits: |row_stride|·BQ ≤ i32::MAX was checked above.
        *x = (q as isize * row_stride) as i32;
    }
    for dd in 0..d {
        let col = first.offset(dd as isize * col_stride);
        for n in 0..S::NR {
            let live = nq.saturating_sub(n * lanes).min(lanes);
            let v = if live > 0 {
                S::mul(S::gather(col, idx.as_ptr().add(n * lanes), live), sc)
            } else {
                S::zero()
            };
            S::store(qt.add(dd * bq + n * lanes), v);
        }
    }
}

/// Writes `out[i0+q][c] = Oᵀ[c][q] / l[q]` (0 when `l[q] == 0`: no attendable key, per the
/// ONNX errata): `LANES` columns × `LANES` queries of `Oᵀ` transposed in registers, one
/// contiguous store per query (the portable loop for other element strides).
#[inline(always)]
pub(super) unsafe fn unpack_o_block<S: FlashSimd>(
    ot: *const f32,
    l: *const f32,
    obase: *mut f32,
    row_stride: isize,
    col_stride: isize,
    i0: usize,
    nq: usize,
    dv: usize,
) {
    let (lanes, bq) = (S::LANES, S::BQ);
    if col_stride != 1 {
        unpack_ot(ot, l, obase, row_stride, col_stride, i0, nq, dv, bq);
        return;
    }
    let dv_full = dv - dv % lanes;
    for q0 in (0..nq).step_by(lanes) {
        let live = (nq - q0).min(lanes);
        let mut inv = [0.0f32; MAX_LANES];
        for (r, x) in inv.iter_mut().enumerate().take(live) {
            let sum = *l.add(q0 + r);
            // `sum == 0` only when every key of the row was masked; NaN propagates.
            *x = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        }
        let rows = obase.offset((i0 + q0) as isize * row_stride);
        let mut c0 = 0;
        while c0 < dv_full {
            // Lanes past `nq` hold finite scratch values and are never stored.
            let mut t = S::zero_tile();
            for (k, x) in t.as_mut().iter_mut().enumerate() {
                *x = S::load(ot.add((c0 + k) * bq + q0));
            }
            S::transpose(&mut t);
            for (r, x) in t.as_ref().iter().enumerate().take(live) {
                let out = rows.offset(r as isize * row_stride).add(c0);
                S::store(out, S::mul(*x, S::splat(inv[r])));
            }
            c0 += lanes;
        }
        for c in dv_full..dv {
            for (r, &iv) in inv.iter().enumerate().take(live) {
                *rows.offset(r as isize * row_stride).add(c) = *ot.add(c * bq + q0 + r) * iv;
            }
        }
    }
}

/// Packs `Qᵀ[d][q] = scale·Q[i0+q][d]` for `q < nq`, zero for the dead lanes up to `bq` (the
/// portable fallback of the SIMD packing in the ISA modules, for strides too large for gathers).
///
/// Deliberately not inlined into the SIMD tasks: compiled for the baseline ISA it stays a simple
/// scalar transpose, where the AVX-512 auto-vectorizer would emit (very slow) scatters.
///
/// # Safety
/// `qbase` must address rows `i0..i0+nq` × `d` elements with the given strides; `qt` holds `d·bq`.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pack_qt(
    qbase: *const f32,
    row_stride: isize,
    col_stride: isize,
    scale: f32,
    i0: usize,
    nq: usize,
    d: usize,
    bq: usize,
    qt: *mut f32,
) {
    // Rows `H·D` floats apart (3-D layout) are fetched one miss at a time otherwise.
    #[cfg(target_arch = "x86_64")]
    if col_stride == 1 {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for q in 0..nq {
            let row = qbase.offset((i0 + q) as isize * row_stride);
            for e in (0..d).step_by(16) {
                _mm_prefetch::<_MM_HINT_T0>(row.add(e) as *const i8);
            }
        }
    }
    for q in 0..bq {
        if q < nq {
            let row = qbase.offset((i0 + q) as isize * row_stride);
            for dd in 0..d {
                *qt.add(dd * bq + q) = *row.offset(dd as isize * col_stride) * scale;
            }
        } else {
            for dd in 0..d {
                *qt.add(dd * bq + q) = 0.0;
            }
        }
    }
}

/// Writes `out[i0+q][c] = Oᵀ[c][q] / l[q]` (0 when `l[q] == 0`: no attendable key, per the ONNX
/// errata). Not inlined, for the same reason as [`pack_qt`].
///
/// # Safety
/// `obase` must address rows `i0..i0+nq` × `dv` elements with the given strides.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn unpack_ot(
    ot: *const f32,
    l: *const f32,
    obase: *mut f32,
    row_stride: isize,
    col_stride: isize,
    i0: usize,
    nq: usize,
    dv: usize,
    bq: usize,
) {
    for q in 0..nq {
        let sum = *l.add(q);
        // `sum == 0` only when every key of the row was masked; NaN propagates.
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        let row = obase.offset((i0 + q) as isize * row_stride);
        for c in 0..dv {
            *row.offset(c as isize * col_stride) = *ot.add(c * bq + q) * inv;
        }
    }
}
