//! The macro-expanded kernel the generic one replaces, kept for the A/B comparison only.
#![allow(dead_code)]

pub(crate) use crate::lanes::EXP2_C;

/// The ISA-independent part of the kernel, expanded inside each ISA module. The module provides
/// `V`, `LANES`, `NR`, `MR`, `BK`, `BQ`, `QSUB` and the vector primitives `vzero vsplat vload
/// vstore vfma vmul vadd vsub vmax vexp2 vzero_if_neg_inf vprefetch vgather vtranspose`; `$attr` is its
/// `#[target_feature]` (empty for the scalar path), put on every function so that the whole
/// kernel is compiled for — and inlined within — that ISA.
/// The tile functions take the number of live query vectors `N` (1 or `NR`) as a const generic.
macro_rules! flash_core {
    ($(#[$attr:meta])*) => {
        use rayon::prelude::*;
        use $crate::flash::{Job, JobMask, RowPrefetch, Scratch, PREFETCH_WINDOW};

        // The remainder dispatch below covers tiles of 1..=7 rows.
        const _: () = assert!(MR >= 1 && MR <= 8 && NR >= 1 && QSUB_MAX >= 1 && BK >= 1);

        /// `Sᵀ[m][·] = Σ_d K[row m][d] · Qᵀ[d][·]` for `M` consecutive keys.
        $(#[$attr])*
        #[inline]
        unsafe fn qk_tile<const M: usize, const N: usize>(k0: *const f32, ks: isize, kd: isize, d: usize, qt: *const f32, s: *mut f32, mx: Option<&mut [V; N]>) {
            let mut acc = [[vzero(); N]; M];
            let mut rows = [k0; M];
            for m in 1..M {
                rows[m] = k0.offset(m as isize * ks);
            }
            for dd in 0..d {
                let qrow = qt.add(dd * BQ);
                let mut qv = [vzero(); N];
                for n in 0..N {
                    qv[n] = vload(qrow.add(n * LANES));
                }
                let off = dd as isize * kd;
                for m in 0..M {
                    let kb = vsplat(*rows[m].offset(off));
                    for n in 0..N {
                        acc[m][n] = vfma(kb, qv[n], acc[m][n]);
                    }
                }
            }
            for m in 0..M {
                for n in 0..N {
                    vstore(s.add(m * BQ + n * LANES), acc[m][n]);
                }
            }
            if let Some(mx) = mx {
                for m in 0..M {
                    for n in 0..N {
                        mx[n] = vmax(mx[n], acc[m][n]);
                    }
                }
            }
        }

        /// Scores of `nk` keys (rows from `k0`, strides `ks`/`kd`) against the packed query block;
        /// with `mx`, also folds them into the running max, key by key (the same order as the
        /// softmax's own pass, so the same result), which saves that pass a read of the tile.
        $(#[$attr])*
        #[inline]
        unsafe fn qk_block<const N: usize>(k0: *const f32, ks: isize, kd: isize, d: usize, nk: usize, qt: *const f32, s: *mut f32, ahead: &mut [RowPrefetch; 2], mut mx: Option<&mut [V; N]>) {
            let mut j = 0;
            while j + MR <= nk {
                ahead[0].step();
                ahead[1].step();
                qk_tile::<MR, N>(k0.offset(j as isize * ks), ks, kd, d, qt, s.add(j * BQ), mx.as_deref_mut());
                j += MR;
            }
            let k1 = k0.offset(j as isize * ks);
            let s1 = s.add(j * BQ);
            match nk - j {
                0 => {}
                1 => qk_tile::<1, N>(k1, ks, kd, d, qt, s1, mx),
                2 => qk_tile::<2, N>(k1, ks, kd, d, qt, s1, mx),
                3 => qk_tile::<3, N>(k1, ks, kd, d, qt, s1, mx),
                4 => qk_tile::<4, N>(k1, ks, kd, d, qt, s1, mx),
                5 => qk_tile::<5, N>(k1, ks, kd, d, qt, s1, mx),
                6 => qk_tile::<6, N>(k1, ks, kd, d, qt, s1, mx),
                7 => qk_tile::<7, N>(k1, ks, kd, d, qt, s1, mx),
                _ => unreachable!("MR is at most 8"),
            }
        }

        /// `Oᵀ[m][·] = α·Oᵀ[m][·] + Σ_j V[j][m] · Pᵀ[j][·]` for `M` consecutive value columns.
        $(#[$attr])*
        #[inline]
        unsafe fn pv_tile<const M: usize, const N: usize>(v0: *const f32, vs: isize, vd: isize, nk: usize, p: *const f32, ot: *mut f32, alpha: *const f32, rescale: bool) {
            let mut al = [vzero(); N];
            for n in 0..N {
                al[n] = vload(alpha.add(n * LANES));
            }
            let mut acc = [[vzero(); N]; M];
            for m in 0..M {
                for n in 0..N {
                    acc[m][n] = vload(ot.add(m * BQ + n * LANES));
                    if rescale {
                        acc[m][n] = vmul(acc[m][n], al[n]);
                    }
                }
            }
            let mut cols = [v0; M];
            for m in 1..M {
                cols[m] = v0.offset(m as isize * vd);
            }
            for j in 0..nk {
                let prow = p.add(j * BQ);
                let mut pv = [vzero(); N];
                for n in 0..N {
                    pv[n] = vload(prow.add(n * LANES));
                }
                let off = j as isize * vs;
                for m in 0..M {
                    let vb = vsplat(*cols[m].offset(off));
                    for n in 0..N {
                        acc[m][n] = vfma(vb, pv[n], acc[m][n]);
                    }
                }
            }
            for m in 0..M {
                for n in 0..N {
                    vstore(ot.add(m * BQ + n * LANES), acc[m][n]);
                }
            }
        }

        /// Accumulates `nk` keys' values (rows from `v0`, strides `vs`/`vd`) weighted by the
        /// probabilities in `p`, after rescaling the accumulator by `alpha` (skipped when `rescale`
        /// is false: every factor is exactly 1, as after most tiles once the row maxima settle).
        $(#[$attr])*
        #[inline]
        unsafe fn pv_block<const N: usize>(v0: *const f32, vs: isize, vd: isize, dv: usize, nk: usize, p: *const f32, ot: *mut f32, alpha: *const f32, rescale: bool, ahead: &mut [RowPrefetch; 2]) {
            let mut c = 0;
            while c + MR <= dv {
                ahead[0].step();
                ahead[1].step();
                pv_tile::<MR, N>(v0.offset(c as isize * vd), vs, vd, nk, p, ot.add(c * BQ), alpha, rescale);
                c += MR;
            }
            let v1 = v0.offset(c as isize * vd);
            let o1 = ot.add(c * BQ);
            match dv - c {
                0 => {}
                1 => pv_tile::<1, N>(v1, vs, vd, nk, p, o1, alpha, rescale),
                2 => pv_tile::<2, N>(v1, vs, vd, nk, p, o1, alpha, rescale),
                3 => pv_tile::<3, N>(v1, vs, vd, nk, p, o1, alpha, rescale),
                4 => pv_tile::<4, N>(v1, vs, vd, nk, p, o1, alpha, rescale),
                5 => pv_tile::<5, N>(v1, vs, vd, nk, p, o1, alpha, rescale),
                6 => pv_tile::<6, N>(v1, vs, vd, nk, p, o1, alpha, rescale),
                7 => pv_tile::<7, N>(v1, vs, vd, nk, p, o1, alpha, rescale),
                _ => unreachable!("MR is at most 8"),
            }
        }

        /// Online softmax over one score tile: updates the running max `m` and sum `l`, turns the
        /// scores into `2^((s − max)·log2 e)` (see the module docs) in place and leaves the rescale factor of the old partial
        /// results in `alpha`. A lane whose max is still `−inf` (no attendable key so far) uses 0
        /// as its reference so that no `−inf − (−inf)` NaN appears; its probabilities are 0.
        /// `tile_max`: the running max already folded with the tile's scores (by `qk_block`).
        /// Returns whether any rescale factor differs from 1.
        $(#[$attr])*
        #[inline]
        unsafe fn softmax_block<const N: usize>(s: *mut f32, nk: usize, m: *mut f32, l: *mut f32, alpha: *mut f32, tile_max: Option<[V; N]>) -> bool {
            let mx = match tile_max {
                Some(mx) => mx,
                None => {
                    let mut mx = load_max::<N>(m);
                    for j in 0..nk {
                        for n in 0..N {
                            mx[n] = vmax(mx[n], vload(s.add(j * BQ + n * LANES)));
                        }
                    }
                    mx
                }
            };
            let mut rescale = false;
            let log2e = vsplat(std::f32::consts::LOG2_E);
            let mut ms = [vzero(); N];
            for n in 0..N {
                ms[n] = vzero_if_neg_inf(mx[n]);
                let old = vload(m.add(n * LANES));
                let a = vexp2(vmul(vsub(old, ms[n]), log2e));
                rescale |= !vall_one(a);
                vstore(alpha.add(n * LANES), a);
                vstore(m.add(n * LANES), mx[n]);
            }
            let mut sum = [vzero(); N];
            for j in 0..nk {
                for n in 0..N {
                    let ptr = s.add(j * BQ + n * LANES);
                    let e = vexp2(vmul(vsub(vload(ptr), ms[n]), log2e));
                    vstore(ptr, e);
                    sum[n] = vadd(sum[n], e);
                }
            }
            for n in 0..N {
                let lp = l.add(n * LANES);
                vstore(lp, vfma(vload(lp), vload(alpha.add(n * LANES)), sum[n]));
            }
            rescale
        }

        /// The running max of `N` query vectors at `m`.
        $(#[$attr])*
        #[inline]
        unsafe fn load_max<const N: usize>(m: *const f32) -> [V; N] {
            let mut mx = [vzero(); N];
            for n in 0..N {
                mx[n] = vload(m.add(n * LANES));
            }
            mx
        }

        /// Soft-cap, mask and causal rule on one score tile (`nq` live query lanes in `N` vectors).
        $(#[$attr])*
        #[inline]
        unsafe fn bias_block<const N: usize>(job: &Job, b: usize, h: usize, i0: usize, nq: usize, j0: usize, nk: usize, s: *mut f32) {
            if let Some(c) = job.softcap {
                for j in 0..nk {
                    for q in 0..nq {
                        let x = s.add(j * BQ + q);
                        *x = c * (*x / c).tanh();
                    }
                }
            }
            // A tile where the mask is all zeros (below the triangle of a causal mask) is not read.
            let zero = job.key_ends.as_ref().is_some_and(|e| e.zero_tile(b, h, i0, j0));
            match if zero { JobMask::None } else { job.mask } {
                JobMask::None => {}
                JobMask::Additive(ptr, st) if st[2] == 0 => {
                    // One value per key for all queries (e.g. a `[B, 1, 1, Lk]` padding mask):
                    // a vector add per key row. Dead lanes get it too, harmlessly.
                    let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
                    for j in 0..nk {
                        let mv = vsplat(*base.offset((j0 + j) as isize * st[3]));
                        for n in 0..N {
                            let x = s.add(j * BQ + n * LANES);
                            vstore(x, vadd(vload(x), mv));
                        }
                    }
                }
                JobMask::Boolean(ptr, st) if st[2] == 0 => {
                    let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
                    let neg_inf = vsplat(f32::NEG_INFINITY);
                    for j in 0..nk {
                        if !*base.offset((j0 + j) as isize * st[3]) {
                            for n in 0..N {
                                vstore(s.add(j * BQ + n * LANES), neg_inf);
                            }
                        }
                    }
                }
                JobMask::Additive(ptr, st) if st[3] == 1 => {
                    // A mask that varies along queries (e.g. `[B, 1, Lq, Lk]`) is stored query-
                    // major, the tile key-major: LANES×LANES pieces (LANES queries' runs of LANES
                    // keys, contiguous) are transposed in registers, the key tail element-wise.
                    let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
                    let nk_full = nk - nk % LANES;
                    for q0 in (0..nq).step_by(LANES) {
                        let live = (nq - q0).min(LANES);
                        let rows = base.offset((i0 + q0) as isize * st[2] + j0 as isize);
                        let mut jg = 0;
                        while jg < nk_full {
                            let mut t = [vzero(); LANES];
                            for (r, x) in t.iter_mut().enumerate().take(live) {
                                *x = vload(rows.offset(r as isize * st[2]).add(jg));
                            }
                            vtranspose(&mut t);
                            for (k, x) in t.iter().enumerate() {
                                let sp = s.add((jg + k) * BQ + q0);
                                vstore(sp, vadd(vload(sp), *x));
                            }
                            jg += LANES;
                        }
                        for j in nk_full..nk {
                            for r in 0..live {
                                *s.add(j * BQ + q0 + r) += *rows.offset(r as isize * st[2]).add(j);
                            }
                        }
                    }
                }
                JobMask::Additive(ptr, st) => {
                    let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
                    for j in 0..nk {
                        let col = base.offset((j0 + j) as isize * st[3]);
                        for q in 0..nq {
                            *s.add(j * BQ + q) += *col.offset((i0 + q) as isize * st[2]);
                        }
                    }
                }
                JobMask::Boolean(ptr, st) => {
                    let base = ptr.offset(b as isize * st[0] + h as isize * st[1]);
                    for j in 0..nk {
                        let col = base.offset((j0 + j) as isize * st[3]);
                        for q in 0..nq {
                            if !*col.offset((i0 + q) as isize * st[2]) {
                                *s.add(j * BQ + q) = f32::NEG_INFINITY;
                            }
                        }
                    }
                }
            }
            if let Some(off) = job.causal {
                // Query i0+q may see keys j <= i0+q+off; only tiles crossing the frontier of the
                // block's first query need work.
                let first_limit = (i0 as isize).saturating_add(off);
                if (j0 + nk - 1) as isize > first_limit {
                    for j in 0..nk {
                        let key = (j0 + j) as isize;
                        for q in 0..nq {
                            if key > ((i0 + q) as isize).saturating_add(off) {
                                *s.add(j * BQ + q) = f32::NEG_INFINITY;
                            }
                        }
                    }
                }
            }
        }

        /// Copies `nk` rows of `n` elements (strides `rs`, `cs`) densely into `dst`. Inline
        /// vector copies: a `memcpy` call per 256-byte row cost more than the copy itself.
        $(#[$attr])*
        #[inline]
        unsafe fn pack_rows(src: *const f32, rs: isize, cs: isize, nk: usize, n: usize, dst: *mut f32) {
            for j in 0..nk {
                let row = src.offset(j as isize * rs);
                let out = dst.add(j * n);
                if cs == 1 {
                    let mut e = 0;
                    while e + LANES <= n {
                        vstore(out.add(e), vload(row.add(e)));
                        e += LANES;
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
        $(#[$attr])*
        #[inline]
        unsafe fn prefetch_rows(src: *const f32, rs: isize, nk: usize, n: usize) {
            for j in 0..nk {
                let row = src.offset(j as isize * rs);
                let mut e = 0;
                while e < n {
                    vprefetch(row.add(e));
                    e += 16;
                }
                vprefetch(row.add(n - 1));
            }
        }

        /// Packs `Qᵀ[d][q] = scale·Q[i0+q][d]` (dead lanes 0). With unit element stride, each
        /// `LANES` queries × `LANES` elements piece is read as contiguous row runs and transposed
        /// in registers (gathers cost ~2 cycles per element on recent Intel cores, microcode
        /// mitigations included, and were ~3 % of the kernel's time at L = 512); other strides use
        /// one gather per `LANES` queries and element, or the portable transpose when the row
        /// offsets overflow the gathers' i32 indices.
        $(#[$attr])*
        #[inline]
        unsafe fn pack_q_block(qbase: *const f32, row_stride: isize, col_stride: isize, scale: f32, i0: usize, nq: usize, d: usize, qt: *mut f32) {
            let first = qbase.offset(i0 as isize * row_stride);
            let sc = vsplat(scale);
            if col_stride == 1 {
                // Rows `H·D` floats apart (3-D layout) would otherwise be fetched one miss at a time.
                if d > 0 {
                    prefetch_rows(first, row_stride, nq, d);
                }
                let d_full = d - d % LANES;
                for q0 in (0..BQ).step_by(LANES) {
                    let live = nq.saturating_sub(q0).min(LANES);
                    let rows = first.offset(q0 as isize * row_stride);
                    let mut e0 = 0;
                    while e0 < d_full {
                        let mut t = [vzero(); LANES];
                        for (r, x) in t.iter_mut().enumerate().take(live) {
                            *x = vload(rows.offset(r as isize * row_stride).add(e0));
                        }
                        vtranspose(&mut t);
                        for (k, x) in t.iter().enumerate() {
                            vstore(qt.add((e0 + k) * BQ + q0), vmul(*x, sc));
                        }
                        e0 += LANES;
                    }
                    for e in d_full..d {
                        for r in 0..LANES {
                            *qt.add(e * BQ + q0 + r) =
                                if r < live { *rows.offset(r as isize * row_stride).add(e) * scale } else { 0.0 };
                        }
                    }
                }
                return;
            }
            let fits = row_stride.checked_mul(BQ as isize).is_some_and(|x| x.unsigned_abs() <= i32::MAX as usize);
            if !fits {
                $crate::flash::pack::pack_qt(qbase, row_stride, col_stride, scale, i0, nq, d, BQ, qt);
                return;
            }
            let mut idx = [[0i32; LANES]; NR];
            for n in 0..NR {
                for lane in 0..LANES {
                    // Fits: |row_stride|·BQ ≤ i32::MAX was checked above.
                    idx[n][lane] = ((n * LANES + lane) as isize * row_stride) as i32;
                }
            }
            for dd in 0..d {
                let col = first.offset(dd as isize * col_stride);
                for n in 0..NR {
                    let live = nq.saturating_sub(n * LANES).min(LANES);
                    let v = if live > 0 { vmul(vgather(col, idx[n].as_ptr(), live), sc) } else { vzero() };
                    vstore(qt.add(dd * BQ + n * LANES), v);
                }
            }
        }

        /// Writes `out[i0+q][c] = Oᵀ[c][q] / l[q]` (0 when `l[q] == 0`: no attendable key, per the
        /// ONNX errata): `LANES` columns × `LANES` queries of `Oᵀ` transposed in registers, one
        /// contiguous store per query (the portable loop for other element strides).
        $(#[$attr])*
        #[inline]
        unsafe fn unpack_o_block(ot: *const f32, l: *const f32, obase: *mut f32, row_stride: isize, col_stride: isize, i0: usize, nq: usize, dv: usize) {
            if col_stride != 1 {
                $crate::flash::pack::unpack_ot(ot, l, obase, row_stride, col_stride, i0, nq, dv, BQ);
                return;
            }
            let dv_full = dv - dv % LANES;
            for q0 in (0..nq).step_by(LANES) {
                let live = (nq - q0).min(LANES);
                let mut inv = [0.0f32; LANES];
                for (r, x) in inv.iter_mut().enumerate().take(live) {
                    let sum = *l.add(q0 + r);
                    // `sum == 0` only when every key of the row was masked; NaN propagates.
                    *x = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                }
                let rows = obase.offset((i0 + q0) as isize * row_stride);
                let mut c0 = 0;
                while c0 < dv_full {
                    // Lanes past `nq` hold finite scratch values and are never stored.
                    let mut t = [vzero(); LANES];
                    for (k, x) in t.iter_mut().enumerate() {
                        *x = vload(ot.add((c0 + k) * BQ + q0));
                    }
                    vtranspose(&mut t);
                    for (r, x) in t.iter().enumerate().take(live) {
                        vstore(rows.offset(r as isize * row_stride).add(c0), vmul(*x, vsplat(inv[r])));
                    }
                    c0 += LANES;
                }
                for c in dv_full..dv {
                    for (r, &iv) in inv.iter().enumerate().take(live) {
                        *rows.offset(r as isize * row_stride).add(c) = *ot.add(c * BQ + q0 + r) * iv;
                    }
                }
            }
        }

        /// One task: `job.qsub` consecutive query blocks (`qsub·BQ` queries) of q-head `h` of
        /// batch `b`. Each packed key block is used by all of them before moving on, which divides
        /// the K/V traffic (the kernel's memory cost) by `qsub`.
        $(#[$attr])*
        unsafe fn run_task(job: &Job, task: usize, sc: &mut Scratch) {
            let span = BQ * job.qsub;
            let ntq = job.q_len.div_ceil(span);
            let tq = task % ntq;
            let bh = task / ntq;
            let h = bh % job.q_heads;
            let b = bh / job.q_heads;
            let hk = h / job.group;
            let t0 = tq * span;
            let nsub = (job.q_len - t0).min(span).div_ceil(BQ);
            let (d, dv) = (job.d, job.dv);
            let s = sc.s.ptr();

            // Per sub-block: packed Qᵀ (scaled; dead lanes zero so they stay finite and harmless),
            // running max/sum, output accumulator, and the last key each one can see.
            let qbase = job.q.offset(b as isize * job.qs[0] + h as isize * job.qs[1]);
            let mut sub_kend = [0usize; QSUB_MAX];
            for sub in 0..nsub {
                let i0 = t0 + sub * BQ;
                let nq = BQ.min(job.q_len - i0);
                // The next sub-block's rows are fetched while this one is packed.
                if sub + 1 < nsub && job.qs[3] == 1 && d > 0 {
                    let i1 = i0 + BQ;
                    prefetch_rows(qbase.offset(i1 as isize * job.qs[2]), job.qs[2], BQ.min(job.q_len - i1), d);
                }
                pack_q_block(qbase, job.qs[2], job.qs[3], job.scale, i0, nq, d, sc.qt.ptr().add(sub * d * BQ));
                for q in 0..BQ {
                    *sc.m.ptr().add(sub * BQ + q) = f32::NEG_INFINITY;
                    *sc.l.ptr().add(sub * BQ + q) = 0.0;
                }
                for x in 0..dv * BQ {
                    *sc.ot.ptr().add(sub * dv * BQ + x) = 0.0;
                }
                // Keys past the causal frontier of the sub-block's last query are masked for all
                // of its queries: never visited.
                sub_kend[sub] = job.live_keys;
                if let Some(off) = job.causal {
                    let limit = ((i0 + nq - 1) as isize).saturating_add(off).saturating_add(1);
                    sub_kend[sub] = if limit <= 0 { 0 } else { job.live_keys.min(limit as usize) };
                }
                // Likewise keys after the last one the mask leaves any of its queries.
                if let Some(ends) = &job.key_ends {
                    let last = (i0..i0 + nq).map(|i| ends.end(b, h, i)).max().unwrap_or(0);
                    sub_kend[sub] = sub_kend[sub].min(last);
                }
            }
            let kend = sub_kend[..nsub].iter().copied().max().unwrap_or(0);
            let obase = job.out.offset(b as isize * job.os[0] + h as isize * job.os[1]);

            // Prefetches paced over the tiles (one step per full tile of Q·Kᵀ and of P·V):
            // `ahead[0]` fetches, during the task's last `PREFETCH_WINDOW` sub-block tiles, the
            // query rows and first key/value block of task + 1 (what rayon most likely runs next
            // on this thread: each thread works through a contiguous range) and then this task's
            // output rows; `ahead[1]`, during each key block, the next key block's K and V rows.
            let mut ahead = [RowPrefetch::new(), RowPrefetch::new()];
            if task + 1 < job.batch * job.q_heads * ntq {
                let next = task + 1;
                let (tq2, bh2) = (next % ntq, next / ntq);
                let (h2, b2) = (bh2 % job.q_heads, bh2 / job.q_heads);
                let hk2 = h2 / job.group;
                let t2 = tq2 * span;
                if job.qs[3] == 1 {
                    let q2 = job.q.offset(b2 as isize * job.qs[0] + h2 as isize * job.qs[1] + t2 as isize * job.qs[2]);
                    ahead[0].push(q2, job.qs[2], (job.q_len - t2).min(span), d);
                }
                let nk2 = BK.min(job.live_keys);
                if job.ks[3] == 1 {
                    ahead[0].push(job.k.offset(b2 as isize * job.ks[0] + hk2 as isize * job.ks[1]), job.ks[2], nk2, d);
                }
                if job.vs[3] == 1 {
                    ahead[0].push(job.v.offset(b2 as isize * job.vs[0] + hk2 as isize * job.vs[1]), job.vs[2], nk2, dv);
                }
            }
            if job.os[3] == 1 {
                ahead[0].push(obase.offset(t0 as isize * job.os[2]), job.os[2], (job.q_len - t0).min(span), dv);
            }
            let tiles_per_block = BK / MR + dv / MR;
            let blocks: usize = sub_kend[..nsub].iter().map(|&e| e.div_ceil(BK)).sum();
            ahead[0].pace(blocks * tiles_per_block, PREFETCH_WINDOW * tiles_per_block);

            let kbase = job.k.offset(b as isize * job.ks[0] + hk as isize * job.ks[1]);
            let vbase = job.v.offset(b as isize * job.vs[0] + hk as isize * job.vs[1]);
            let needs_bias = job.softcap.is_some() || !matches!(job.mask, JobMask::None) || job.causal.is_some();
            let (kp, vp) = (sc.kp.ptr(), sc.vp.ptr());
            let mut j0 = 0;
            while j0 < kend {
                let nk = BK.min(kend - j0);
                pack_rows(kbase.offset(j0 as isize * job.ks[2]), job.ks[2], job.ks[3], nk, d, kp);
                pack_rows(vbase.offset(j0 as isize * job.vs[2]), job.vs[2], job.vs[3], nk, dv, vp);
                // The next key block is fetched while this one serves all sub-blocks.
                let next = j0 + nk;
                if next < kend {
                    let nk2 = BK.min(kend - next);
                    ahead[1] = RowPrefetch::new();
                    if job.ks[3] == 1 {
                        ahead[1].push(kbase.offset(next as isize * job.ks[2]), job.ks[2], nk2, d);
                    }
                    if job.vs[3] == 1 {
                        ahead[1].push(vbase.offset(next as isize * job.vs[2]), job.vs[2], nk2, dv);
                    }
                    let steps = sub_kend[..nsub].iter().filter(|&&e| j0 < e).count() * tiles_per_block;
                    ahead[1].pace(steps, steps);
                }
                for sub in 0..nsub {
                    if j0 >= sub_kend[sub] {
                        continue;
                    }
                    let nk_sub = nk.min(sub_kend[sub] - j0);
                    let i0 = t0 + sub * BQ;
                    let nq = BQ.min(job.q_len - i0);
                    let (m, l, ot) = (sc.m.ptr().add(sub * BQ), sc.l.ptr().add(sub * BQ), sc.ot.ptr().add(sub * dv * BQ));
                    let qt = sc.qt.ptr().add(sub * d * BQ);
                    let alpha = sc.alpha.ptr();
                    // Without a mask, soft-cap or causal rule the scores are final as Q·Kᵀ
                    // computes them, which folds them into the running max on the way.
                    let fuse = !needs_bias;
                    // A block with at most LANES live queries (decoding, short tails) computes one
                    // vector column instead of NR.
                    if nq <= LANES {
                        let mut mx = load_max::<1>(m);
                        qk_block::<1>(kp, d as isize, 1, d, nk_sub, qt, s, &mut ahead, fuse.then_some(&mut mx));
                        if needs_bias {
                            bias_block::<1>(job, b, h, i0, nq, j0, nk_sub, s);
                        }
                        let rescale = softmax_block::<1>(s, nk_sub, m, l, alpha, fuse.then_some(mx));
                        pv_block::<1>(vp, dv as isize, 1, dv, nk_sub, s, ot, alpha, rescale, &mut ahead);
                    } else {
                        let mut mx = load_max::<NR>(m);
                        qk_block::<NR>(kp, d as isize, 1, d, nk_sub, qt, s, &mut ahead, fuse.then_some(&mut mx));
                        if needs_bias {
                            bias_block::<NR>(job, b, h, i0, nq, j0, nk_sub, s);
                        }
                        let rescale = softmax_block::<NR>(s, nk_sub, m, l, alpha, fuse.then_some(mx));
                        pv_block::<NR>(vp, dv as isize, 1, dv, nk_sub, s, ot, alpha, rescale, &mut ahead);
                    }
                }
                j0 += nk;
            }

            // Normalize and scatter Oᵀ into the caller's layout. l == 0: every key masked → 0.
            for sub in 0..nsub {
                let i0 = t0 + sub * BQ;
                let nq = BQ.min(job.q_len - i0);
                // The next sub-block's output rows are fetched while this one is stored: a store
                // to a line not in cache waits for the line, and a line read by no other core
                // arrives exclusive, ready to be written.
                if sub + 1 < nsub && job.os[3] == 1 && dv > 0 {
                    let i1 = i0 + BQ;
                    prefetch_rows(obase.offset(i1 as isize * job.os[2]), job.os[2], BQ.min(job.q_len - i1), dv);
                }
                unpack_o_block(sc.ot.ptr().add(sub * dv * BQ), sc.l.ptr().add(sub * BQ), obase, job.os[2], job.os[3], i0, nq, dv);
            }
        }

        /// Runs every task of `job` on the current rayon pool.
        ///
        /// # Safety
        /// The CPU must support this module's target features, and `job` must come from views
        /// validated by `Problem::check`.
        pub(crate) unsafe fn run(job: &Job) {
            thread_local! {
                /// This thread's scratch for the last `(D, Dv, qsub)` it ran, kept across calls: a
                /// model runs many attention calls, and fresh 0.2–1 MB buffers per call cost
                /// page faults that matter at short sequence lengths.
                static SCRATCH: std::cell::RefCell<Option<((usize, usize, usize), Scratch)>> =
                    const { std::cell::RefCell::new(None) };
            }
            let tasks = job.batch * job.q_heads * job.q_len.div_ceil(BQ * job.qsub);
            (0..tasks).into_par_iter().for_each(|t| {
                SCRATCH.with(|cell| {
                    let key = (job.d, job.dv, job.qsub);
                    // `run_task` never re-enters rayon, so the borrow cannot be nested; should
                    // that ever change, a private scratch keeps it correct instead of panicking.
                    match cell.try_borrow_mut() {
                        Ok(mut slot) => {
                            if slot.as_ref().map(|(k, _)| *k) != Some(key) {
                                *slot = Some((key, Scratch::new(job.d, job.dv, BQ, BK, job.qsub)));
                            }
                            if let Some((_, sc)) = slot.as_mut() {
                                // SAFETY: forwarded from this function's contract.
                                unsafe { run_task(job, t, sc) }
                            }
                        }
                        Err(_) => {
                            let mut sc = Scratch::new(job.d, job.dv, BQ, BK, job.qsub);
                            // SAFETY: forwarded from this function's contract.
                            unsafe { run_task(job, t, &mut sc) }
                        }
                    }
                })
            });
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod scalar;
