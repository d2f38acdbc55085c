//! The register tiles of one key block against one query block: scores `Sᵀ = K·Qᵀ`, the online
//! softmax over them, and the output update `Oᵀ = α·Oᵀ + Vᵀ·Pᵀ`. The tile functions take the
//! number of live query vectors `N` (1 or the ISA's `NR`) as a const generic.

// The tiles pass raw tile pointers and strides; bundling them would obscure the loops. Index
// loops over the tiles' small arrays read as the algebra they compute.
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

use super::simd::FlashSimd;
use super::RowPrefetch;

/// `Sᵀ[m][·] = Σ_d K[row m][d] · Qᵀ[d][·]` for `M` consecutive keys.
#[inline(always)]
unsafe fn qk_tile<S: FlashSimd, const M: usize, const N: usize>(
    k0: *const f32,
    ks: isize,
    kd: isize,
    d: usize,
    qt: *const f32,
    s: *mut f32,
    mx: Option<&mut [S::V; N]>,
) {
    let mut acc = [[S::zero(); N]; M];
    let rows = strided::<M>(k0, ks);
    for dd in 0..d {
        rank1_update::<S, M, N>(&mut acc, &rows, dd as isize * kd, qt.add(dd * S::BQ));
    }
    store_tile::<S, M, N>(&acc, s);
    if let Some(mx) = mx {
        for row in &acc {
            for n in 0..N {
                mx[n] = S::max(mx[n], row[n]);
            }
        }
    }
}

/// `M` pointers `stride` elements apart from `first`: the rows (keys) or columns (values) a
/// tile reads.
#[inline(always)]
fn strided<const M: usize>(first: *const f32, stride: isize) -> [*const f32; M] {
    std::array::from_fn(|m| first.wrapping_offset(m as isize * stride))
}

/// `acc[m][·] += a[m][off] · b[·]`, `b` the `N` vectors at `b`: one rank-1 update of an `M × N`
/// register tile, the step of both products (`a` the keys and `b` a row of `Qᵀ`, or `a` the
/// value columns and `b` a row of `Pᵀ`).
#[inline(always)]
unsafe fn rank1_update<S: FlashSimd, const M: usize, const N: usize>(
    acc: &mut [[S::V; N]; M],
    a: &[*const f32; M],
    off: isize,
    b: *const f32,
) {
    let mut bv = [S::zero(); N];
    for (n, x) in bv.iter_mut().enumerate() {
        *x = S::load(b.add(n * S::LANES));
    }
    for m in 0..M {
        let am = S::splat(*a[m].offset(off));
        for n in 0..N {
            acc[m][n] = S::fma(am, bv[n], acc[m][n]);
        }
    }
}

/// Stores an `M × N` register tile at `dst`, its rows `BQ` floats apart.
#[inline(always)]
unsafe fn store_tile<S: FlashSimd, const M: usize, const N: usize>(
    acc: &[[S::V; N]; M],
    dst: *mut f32,
) {
    for (m, row) in acc.iter().enumerate() {
        for (n, x) in row.iter().enumerate() {
            S::store(dst.add(m * S::BQ + n * S::LANES), *x);
        }
    }
}

/// Scores of `nk` keys (rows from `k0`, strides `ks`/`kd`) against the packed query block;
/// with `mx`, also folds them into the running max, key by key (the same order as the
/// softmax's own pass, so the same result), which saves that pass a read of the tile.
#[inline(always)]
pub(super) unsafe fn qk_block<S: FlashSimd, const N: usize>(
    k0: *const f32,
    ks: isize,
    kd: isize,
    d: usize,
    nk: usize,
    qt: *const f32,
    s: *mut f32,
    ahead: &mut [RowPrefetch; 2],
    mut mx: Option<&mut [S::V; N]>,
) {
    let mr = S::MR;
    let mut j = 0;
    while j + mr <= nk {
        ahead[0].step();
        ahead[1].step();
        let (kj, sj) = (k0.offset(j as isize * ks), s.add(j * S::BQ));
        qk_rows::<S, N>(mr, kj, ks, kd, d, qt, sj, mx.as_deref_mut());
        j += mr;
    }
    let (k1, s1) = (k0.offset(j as isize * ks), s.add(j * S::BQ));
    qk_rows::<S, N>(nk - j, k1, ks, kd, d, qt, s1, mx);
}

/// [`qk_tile`] for `rows` (0..=8) keys, dispatched to its const row count.
#[inline(always)]
unsafe fn qk_rows<S: FlashSimd, const N: usize>(
    rows: usize,
    k: *const f32,
    ks: isize,
    kd: isize,
    d: usize,
    qt: *const f32,
    s: *mut f32,
    mx: Option<&mut [S::V; N]>,
) {
    match rows {
        0 => {}
        1 => qk_tile::<S, 1, N>(k, ks, kd, d, qt, s, mx),
        2 => qk_tile::<S, 2, N>(k, ks, kd, d, qt, s, mx),
        3 => qk_tile::<S, 3, N>(k, ks, kd, d, qt, s, mx),
        4 => qk_tile::<S, 4, N>(k, ks, kd, d, qt, s, mx),
        5 => qk_tile::<S, 5, N>(k, ks, kd, d, qt, s, mx),
        6 => qk_tile::<S, 6, N>(k, ks, kd, d, qt, s, mx),
        7 => qk_tile::<S, 7, N>(k, ks, kd, d, qt, s, mx),
        8 => qk_tile::<S, 8, N>(k, ks, kd, d, qt, s, mx),
        _ => unreachable!("MR is at most 8"),
    }
}

/// `Oᵀ[m][·] = α·Oᵀ[m][·] + Σ_j V[j][m] · Pᵀ[j][·]` for `M` consecutive value columns.
#[inline(always)]
unsafe fn pv_tile<S: FlashSimd, const M: usize, const N: usize>(
    v0: *const f32,
    vs: isize,
    vd: isize,
    nk: usize,
    p: *const f32,
    ot: *mut f32,
    alpha: *const f32,
    rescale: bool,
) {
    let mut al = [S::zero(); N];
    for (n, x) in al.iter_mut().enumerate() {
        *x = S::load(alpha.add(n * S::LANES));
    }
    let mut acc = [[S::zero(); N]; M];
    for (m, row) in acc.iter_mut().enumerate() {
        for (n, x) in row.iter_mut().enumerate() {
            *x = S::load(ot.add(m * S::BQ + n * S::LANES));
            if rescale {
                *x = S::mul(*x, al[n]);
            }
        }
    }
    let cols = strided::<M>(v0, vd);
    for j in 0..nk {
        rank1_update::<S, M, N>(&mut acc, &cols, j as isize * vs, p.add(j * S::BQ));
    }
    store_tile::<S, M, N>(&acc, ot);
}

/// Accumulates `nk` keys' values (rows from `v0`, strides `vs`/`vd`) weighted by the
/// probabilities in `p`, after rescaling the accumulator by `alpha` (skipped when `rescale`
/// is false: every factor is exactly 1, as after most tiles once the row maxima settle).
#[inline(always)]
pub(super) unsafe fn pv_block<S: FlashSimd, const N: usize>(
    v0: *const f32,
    vs: isize,
    vd: isize,
    dv: usize,
    nk: usize,
    p: *const f32,
    ot: *mut f32,
    alpha: *const f32,
    rescale: bool,
    ahead: &mut [RowPrefetch; 2],
) {
    let mr = S::MR;
    let mut c = 0;
    while c + mr <= dv {
        ahead[0].step();
        ahead[1].step();
        let (vc, oc) = (v0.offset(c as isize * vd), ot.add(c * S::BQ));
        pv_cols::<S, N>(mr, vc, vs, vd, nk, p, oc, alpha, rescale);
        c += mr;
    }
    let (v1, o1) = (v0.offset(c as isize * vd), ot.add(c * S::BQ));
    pv_cols::<S, N>(dv - c, v1, vs, vd, nk, p, o1, alpha, rescale);
}

/// [`pv_tile`] for `cols` (0..=8) value columns, dispatched to its const column count.
#[inline(always)]
unsafe fn pv_cols<S: FlashSimd, const N: usize>(
    cols: usize,
    v: *const f32,
    vs: isize,
    vd: isize,
    nk: usize,
    p: *const f32,
    ot: *mut f32,
    alpha: *const f32,
    rescale: bool,
) {
    match cols {
        0 => {}
        1 => pv_tile::<S, 1, N>(v, vs, vd, nk, p, ot, alpha, rescale),
        2 => pv_tile::<S, 2, N>(v, vs, vd, nk, p, ot, alpha, rescale),
        3 => pv_tile::<S, 3, N>(v, vs, vd, nk, p, ot, alpha, rescale),
        4 => pv_tile::<S, 4, N>(v, vs, vd, nk, p, ot, alpha, rescale),
        5 => pv_tile::<S, 5, N>(v, vs, vd, nk, p, ot, alpha, rescale),
        6 => pv_tile::<S, 6, N>(v, vs, vd, nk, p, ot, alpha, rescale),
        7 => pv_tile::<S, 7, N>(v, vs, vd, nk, p, ot, alpha, rescale),
        8 => pv_tile::<S, 8, N>(v, vs, vd, nk, p, ot, alpha, rescale),
        _ => unreachable!("MR is at most 8"),
    }
}

/// Online softmax over one score tile: updates the running max `m` and sum `l`, turns the
/// scores into `2^((s − max)·log2 e)` (see the module docs) in place and leaves the rescale
/// factor of the old partial results in `alpha`. A lane whose max is still `−inf` (no
/// attendable key so far) uses 0 as its reference so that no `−inf − (−inf)` NaN appears; its
/// probabilities are 0. `tile_max`: the running max already folded with the tile's scores (by
/// `qk_block`). Returns whether any rescale factor differs from 1.
#[inline(always)]
pub(super) unsafe fn softmax_block<S: FlashSimd, const N: usize>(
    s: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
    tile_max: Option<[S::V; N]>,
) -> bool {
    let mx = match tile_max {
        Some(mx) => mx,
        None => {
            let mut mx = load_max::<S, N>(m);
            for j in 0..nk {
                for (n, x) in mx.iter_mut().enumerate() {
                    *x = S::max(*x, S::load(s.add(j * S::BQ + n * S::LANES)));
                }
            }
            mx
        }
    };
    let mut rescale = false;
    let log2e = S::splat(std::f32::consts::LOG2_E);
    let mut ms = [S::zero(); N];
    for n in 0..N {
        ms[n] = S::zero_if_neg_inf(mx[n]);
        let old = S::load(m.add(n * S::LANES));
        let a = S::exp2(S::mul(S::sub(old, ms[n]), log2e));
        rescale |= !S::all_one(a);
        S::store(alpha.add(n * S::LANES), a);
        S::store(m.add(n * S::LANES), mx[n]);
    }
    let mut sum = [S::zero(); N];
    for j in 0..nk {
        for n in 0..N {
            let ptr = s.add(j * S::BQ + n * S::LANES);
            let e = S::exp2(S::mul(S::sub(S::load(ptr), ms[n]), log2e));
            S::store(ptr, e);
            sum[n] = S::add(sum[n], e);
        }
    }
    for (n, x) in sum.iter().enumerate() {
        let lp = l.add(n * S::LANES);
        S::store(
            lp,
            S::fma(S::load(lp), S::load(alpha.add(n * S::LANES)), *x),
        );
    }
    rescale
}

/// The running max of `N` query vectors at `m`.
#[inline(always)]
pub(super) unsafe fn load_max<S: FlashSimd, const N: usize>(m: *const f32) -> [S::V; N] {
    let mut mx = [S::zero(); N];
    for (n, x) in mx.iter_mut().enumerate() {
        *x = S::load(m.add(n * S::LANES));
    }
    mx
}
