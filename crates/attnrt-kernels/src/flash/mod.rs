//! The flash-style kernel.
//!
//! Layout trick: each task owns a block of `BQ = NR·LANES` queries and keeps everything
//! *query-major in the vector lanes*:
//!
//! * `Qᵀ` block packed once per task, `[D][BQ]`, pre-multiplied by `scale`;
//! * scores computed transposed, `Sᵀ[key][BQ] = K_block · Qᵀ` — a register-blocked GEMM whose
//!   A operand is read straight from K's rows (broadcast loads) and whose B operand is the packed
//!   `Qᵀ`, so K never needs packing or transposing, whatever its strides;
//! * the online softmax is then *vertical*: the running max and sum of each query are vector
//!   lanes, updated with element-wise max/add over key rows — no horizontal reductions;
//! * the output accumulates transposed too, `Oᵀ[Dv][BQ] = α·Oᵀ + Vᵀ·Pᵀ`, again with broadcast
//!   loads from V's rows; the rescale by α is folded into the accumulator load.
//!
//! Scratch per task: `BQ·(D + Dv + BK + 3)` floats, independent of the sequence lengths.
//! Keys past the causal frontier of a block's last query are never visited.

use crate::view::effective_strides;
use crate::{AttentionParams, Isa, Mask, Problem, View4, ViewMut4};

/// Mask pointer and effective (broadcast-aware) strides.
#[derive(Clone, Copy)]
pub(crate) enum JobMask {
    None,
    Additive(*const f32, [isize; 4]),
    Boolean(*const bool, [isize; 4]),
}

/// One validated call, as raw pointers for the tasks.
pub(crate) struct Job {
    pub q: *const f32,
    pub qs: [isize; 4],
    pub k: *const f32,
    pub ks: [isize; 4],
    pub v: *const f32,
    pub vs: [isize; 4],
    pub out: *mut f32,
    pub os: [isize; 4],
    pub mask: JobMask,
    pub batch: usize,
    pub q_heads: usize,
    pub group: usize,
    pub q_len: usize,
    /// Keys `0..live_keys` may be attended (mask padding already applied).
    pub live_keys: usize,
    pub d: usize,
    pub dv: usize,
    pub scale: f32,
    pub causal: Option<isize>,
    pub softcap: Option<f32>,
}

// SAFETY: the pointers come from validated views borrowed for the whole call (`run` does not
// return before every task has finished). Inputs are only read. Each task writes only the output
// rows of its own (batch, q-head, query block), and `ViewMut4` validation guarantees distinct
// indices map to distinct elements, so concurrent writes never touch the same memory.
unsafe impl Sync for Job {}
unsafe impl Send for Job {}

/// A 64-byte aligned f32 buffer (aligned vector loads never split cache lines).
pub(crate) struct AlignedBuf {
    buf: Vec<f32>,
    off: usize,
}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> Self {
        let buf = vec![0.0f32; len + 16];
        let addr = buf.as_ptr() as usize;
        let off = ((64 - addr % 64) % 64) / std::mem::size_of::<f32>();
        AlignedBuf { buf, off }
    }

    pub(crate) fn ptr(&mut self) -> *mut f32 {
        // SAFETY: off < 16 and the buffer has len + 16 elements.
        unsafe { self.buf.as_mut_ptr().add(self.off) }
    }
}

/// Per-thread scratch of one task: packed `Qᵀ`, the score tile, the output accumulator and the
/// softmax state of each query lane.
pub(crate) struct Scratch {
    pub qt: AlignedBuf,
    pub s: AlignedBuf,
    pub ot: AlignedBuf,
    /// running max, running sum, rescale factor of the last tile — `BQ` each
    pub m: AlignedBuf,
    pub l: AlignedBuf,
    pub alpha: AlignedBuf,
}

impl Scratch {
    pub(crate) fn new(d: usize, dv: usize, bq: usize, bk: usize) -> Self {
        Scratch {
            qt: AlignedBuf::new(d * bq),
            s: AlignedBuf::new(bk * bq),
            ot: AlignedBuf::new(dv * bq),
            m: AlignedBuf::new(bq),
            l: AlignedBuf::new(bq),
            alpha: AlignedBuf::new(bq),
        }
    }
}

/// Bytes of scratch one task of `isa` needs (for reports and the memory budget test).
pub fn scratch_bytes(isa: Isa, head_dim: usize, v_head_dim: usize) -> usize {
    let (bq, bk) = match isa {
        Isa::Avx512 => avx512_tiles(),
        Isa::Avx2 => avx2_tiles(),
        Isa::Scalar => (scalar::BQ, scalar::BK),
    };
    (bq * (head_dim + v_head_dim + bk + 3) + 6 * 16) * std::mem::size_of::<f32>()
}

#[cfg(target_arch = "x86_64")]
fn avx512_tiles() -> (usize, usize) {
    (avx512::BQ, avx512::BK)
}
#[cfg(target_arch = "x86_64")]
fn avx2_tiles() -> (usize, usize) {
    (avx2::BQ, avx2::BK)
}
#[cfg(not(target_arch = "x86_64"))]
fn avx512_tiles() -> (usize, usize) {
    (scalar::BQ, scalar::BK)
}
#[cfg(not(target_arch = "x86_64"))]
fn avx2_tiles() -> (usize, usize) {
    (scalar::BQ, scalar::BK)
}

/// Runs a validated problem. `isa` must be available (checked by the caller).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    isa: Isa,
    p: &Problem,
    q: &View4,
    k: &View4,
    v: &View4,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
) {
    if out.num_elements() == 0 {
        return;
    }
    let job = Job {
        q: q.data.as_ptr(),
        qs: effective_strides(&q.dims, &q.strides),
        k: k.data.as_ptr(),
        ks: effective_strides(&k.dims, &k.strides),
        v: v.data.as_ptr(),
        vs: effective_strides(&v.dims, &v.strides),
        out: out.data.as_mut_ptr(),
        os: effective_strides(&out.dims, &out.strides),
        mask: match mask {
            Mask::None => JobMask::None,
            Mask::Additive(m) => JobMask::Additive(m.data.as_ptr(), effective_strides(&m.dims, &m.strides)),
            Mask::Boolean(m) => JobMask::Boolean(m.data.as_ptr(), effective_strides(&m.dims, &m.strides)),
        },
        batch: p.batch,
        q_heads: p.q_heads,
        group: p.group(),
        q_len: p.q_len,
        live_keys: p.live_keys,
        d: p.head_dim,
        dv: p.v_head_dim,
        scale: params.scale,
        causal: params.causal,
        softcap: params.effective_softcap(),
    };
    // SAFETY: `isa` was checked available by the caller; `job` holds pointers of validated views.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::run(&job),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::run(&job),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => scalar::run(&job),
            Isa::Scalar => scalar::run(&job),
        }
    }
}

/// Packs `Qᵀ[d][q] = scale·Q[i0+q][d]` for `q < nq`, zero for the dead lanes up to `bq`.
///
/// Deliberately not inlined into the SIMD tasks: compiled for the baseline ISA it stays a simple
/// scalar transpose, where the AVX-512 auto-vectorizer would emit (very slow) scatters.
///
/// # Safety
/// `qbase` must address rows `i0..i0+nq` × `d` elements with the given strides; `qt` holds `d·bq`.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_qt(qbase: *const f32, row_stride: isize, col_stride: isize, scale: f32, i0: usize, nq: usize, d: usize, bq: usize, qt: *mut f32) {
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
pub(crate) unsafe fn unpack_ot(ot: *const f32, l: *const f32, obase: *mut f32, row_stride: isize, col_stride: isize, i0: usize, nq: usize, dv: usize, bq: usize) {
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

/// The ISA-independent part of the kernel, expanded inside each ISA module. The module provides
/// `V`, `LANES`, `NR`, `MR`, `BK`, `BQ` and the vector primitives `vzero vsplat vload vstore vfma
/// vmul vadd vsub vmax vexp vzero_if_neg_inf`; `$attr` is its `#[target_feature]` (empty for the scalar path), put
/// on every function so that the whole kernel is compiled for — and inlined within — that ISA.
macro_rules! flash_core {
    ($(#[$attr:meta])*) => {
        use rayon::prelude::*;
        use $crate::flash::{Job, JobMask, Scratch};

        /// `Sᵀ[m][·] = Σ_d K[row m][d] · Qᵀ[d][·]` for `M` consecutive keys.
        $(#[$attr])*
        #[inline]
        unsafe fn qk_tile<const M: usize>(k0: *const f32, ks: isize, kd: isize, d: usize, qt: *const f32, s: *mut f32) {
            let mut acc = [[vzero(); NR]; M];
            let mut rows = [k0; M];
            for m in 1..M {
                rows[m] = k0.offset(m as isize * ks);
            }
            for dd in 0..d {
                let qrow = qt.add(dd * BQ);
                let mut qv = [vzero(); NR];
                for n in 0..NR {
                    qv[n] = vload(qrow.add(n * LANES));
                }
                let off = dd as isize * kd;
                for m in 0..M {
                    let kb = vsplat(*rows[m].offset(off));
                    for n in 0..NR {
                        acc[m][n] = vfma(kb, qv[n], acc[m][n]);
                    }
                }
            }
            for m in 0..M {
                for n in 0..NR {
                    vstore(s.add(m * BQ + n * LANES), acc[m][n]);
                }
            }
        }

        /// Scores of `nk` keys starting at `k0` against the packed query block.
        $(#[$attr])*
        #[inline]
        unsafe fn qk_block(k0: *const f32, ks: isize, kd: isize, d: usize, nk: usize, qt: *const f32, s: *mut f32) {
            // Rows with unit element stride (every dense or 3-D layout) get their own copy with
            // the stride a constant, which frees the inner loop from index multiplications.
            if kd == 1 {
                qk_block_strided(k0, ks, 1, d, nk, qt, s)
            } else {
                qk_block_strided(k0, ks, kd, d, nk, qt, s)
            }
        }

        $(#[$attr])*
        #[inline]
        unsafe fn qk_block_strided(k0: *const f32, ks: isize, kd: isize, d: usize, nk: usize, qt: *const f32, s: *mut f32) {
            let mut j = 0;
            while j + MR <= nk {
                qk_tile::<MR>(k0.offset(j as isize * ks), ks, kd, d, qt, s.add(j * BQ));
                j += MR;
            }
            let k1 = k0.offset(j as isize * ks);
            let s1 = s.add(j * BQ);
            match nk - j {
                0 => {}
                1 => qk_tile::<1>(k1, ks, kd, d, qt, s1),
                2 => qk_tile::<2>(k1, ks, kd, d, qt, s1),
                3 => qk_tile::<3>(k1, ks, kd, d, qt, s1),
                4 => qk_tile::<4>(k1, ks, kd, d, qt, s1),
                5 => qk_tile::<5>(k1, ks, kd, d, qt, s1),
                6 => qk_tile::<6>(k1, ks, kd, d, qt, s1),
                7 => qk_tile::<7>(k1, ks, kd, d, qt, s1),
                _ => unreachable!("MR is at most 8"),
            }
        }

        /// `Oᵀ[m][·] = α·Oᵀ[m][·] + Σ_j V[j][m] · Pᵀ[j][·]` for `M` consecutive value columns.
        $(#[$attr])*
        #[inline]
        unsafe fn pv_tile<const M: usize>(v0: *const f32, vs: isize, vd: isize, nk: usize, p: *const f32, ot: *mut f32, alpha: *const f32) {
            let mut al = [vzero(); NR];
            for n in 0..NR {
                al[n] = vload(alpha.add(n * LANES));
            }
            let mut acc = [[vzero(); NR]; M];
            for m in 0..M {
                for n in 0..NR {
                    acc[m][n] = vmul(vload(ot.add(m * BQ + n * LANES)), al[n]);
                }
            }
            let mut cols = [v0; M];
            for m in 1..M {
                cols[m] = v0.offset(m as isize * vd);
            }
            for j in 0..nk {
                let prow = p.add(j * BQ);
                let mut pv = [vzero(); NR];
                for n in 0..NR {
                    pv[n] = vload(prow.add(n * LANES));
                }
                let off = j as isize * vs;
                for m in 0..M {
                    let vb = vsplat(*cols[m].offset(off));
                    for n in 0..NR {
                        acc[m][n] = vfma(vb, pv[n], acc[m][n]);
                    }
                }
            }
            for m in 0..M {
                for n in 0..NR {
                    vstore(ot.add(m * BQ + n * LANES), acc[m][n]);
                }
            }
        }

        /// Accumulates `nk` keys' values (starting at `v0`) weighted by the probabilities in `p`.
        $(#[$attr])*
        #[inline]
        unsafe fn pv_block(v0: *const f32, vs: isize, vd: isize, dv: usize, nk: usize, p: *const f32, ot: *mut f32, alpha: *const f32) {
            if vd == 1 {
                pv_block_strided(v0, vs, 1, dv, nk, p, ot, alpha)
            } else {
                pv_block_strided(v0, vs, vd, dv, nk, p, ot, alpha)
            }
        }

        $(#[$attr])*
        #[inline]
        unsafe fn pv_block_strided(v0: *const f32, vs: isize, vd: isize, dv: usize, nk: usize, p: *const f32, ot: *mut f32, alpha: *const f32) {
            let mut c = 0;
            while c + MR <= dv {
                pv_tile::<MR>(v0.offset(c as isize * vd), vs, vd, nk, p, ot.add(c * BQ), alpha);
                c += MR;
            }
            let v1 = v0.offset(c as isize * vd);
            let o1 = ot.add(c * BQ);
            match dv - c {
                0 => {}
                1 => pv_tile::<1>(v1, vs, vd, nk, p, o1, alpha),
                2 => pv_tile::<2>(v1, vs, vd, nk, p, o1, alpha),
                3 => pv_tile::<3>(v1, vs, vd, nk, p, o1, alpha),
                4 => pv_tile::<4>(v1, vs, vd, nk, p, o1, alpha),
                5 => pv_tile::<5>(v1, vs, vd, nk, p, o1, alpha),
                6 => pv_tile::<6>(v1, vs, vd, nk, p, o1, alpha),
                7 => pv_tile::<7>(v1, vs, vd, nk, p, o1, alpha),
                _ => unreachable!("MR is at most 8"),
            }
        }

        /// Online softmax over one score tile: updates the running max `m` and sum `l`, turns the
        /// scores into `exp(s − max)` in place and leaves the rescale factor of the old partial
        /// results in `alpha`. A lane whose max is still `−inf` (no attendable key so far) uses 0
        /// as its reference so that no `−inf − (−inf)` NaN appears; its probabilities are 0.
        $(#[$attr])*
        #[inline]
        unsafe fn softmax_block(s: *mut f32, nk: usize, sc: &mut Scratch) {
            let m = sc.m.ptr();
            let l = sc.l.ptr();
            let alpha = sc.alpha.ptr();
            let mut mx = [vzero(); NR];
            for n in 0..NR {
                mx[n] = vload(m.add(n * LANES));
            }
            for j in 0..nk {
                for n in 0..NR {
                    mx[n] = vmax(mx[n], vload(s.add(j * BQ + n * LANES)));
                }
            }
            let mut ms = [vzero(); NR];
            for n in 0..NR {
                ms[n] = vzero_if_neg_inf(mx[n]);
                let old = vload(m.add(n * LANES));
                vstore(alpha.add(n * LANES), vexp(vsub(old, ms[n])));
                vstore(m.add(n * LANES), mx[n]);
            }
            let mut sum = [vzero(); NR];
            for j in 0..nk {
                for n in 0..NR {
                    let ptr = s.add(j * BQ + n * LANES);
                    let e = vexp(vsub(vload(ptr), ms[n]));
                    vstore(ptr, e);
                    sum[n] = vadd(sum[n], e);
                }
            }
            for n in 0..NR {
                let lp = l.add(n * LANES);
                vstore(lp, vfma(vload(lp), vload(alpha.add(n * LANES)), sum[n]));
            }
        }

        /// Soft-cap, mask and causal rule on one score tile (only the `nq` live query lanes).
        #[inline]
        unsafe fn bias_block(job: &Job, b: usize, h: usize, i0: usize, nq: usize, j0: usize, nk: usize, s: *mut f32) {
            if let Some(c) = job.softcap {
                for j in 0..nk {
                    for q in 0..nq {
                        let x = s.add(j * BQ + q);
                        *x = c * (*x / c).tanh();
                    }
                }
            }
            match job.mask {
                JobMask::None => {}
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

        /// One task: query block `qb` of q-head `h` of batch `b`.
        $(#[$attr])*
        unsafe fn run_task(job: &Job, task: usize, sc: &mut Scratch) {
            let nqb = job.q_len.div_ceil(BQ);
            let qb = task % nqb;
            let bh = task / nqb;
            let h = bh % job.q_heads;
            let b = bh / job.q_heads;
            let hk = h / job.group;
            let i0 = qb * BQ;
            let nq = BQ.min(job.q_len - i0);
            let (d, dv) = (job.d, job.dv);
            let qt = sc.qt.ptr();
            let s = sc.s.ptr();
            let ot = sc.ot.ptr();

            // Pack Qᵀ (scaled); dead lanes are zero so they stay finite and harmless.
            let qbase = job.q.offset(b as isize * job.qs[0] + h as isize * job.qs[1]);
            $crate::flash::pack_qt(qbase, job.qs[2], job.qs[3], job.scale, i0, nq, d, BQ, qt);
            for q in 0..BQ {
                *sc.m.ptr().add(q) = f32::NEG_INFINITY;
                *sc.l.ptr().add(q) = 0.0;
            }
            for x in 0..dv * BQ {
                *ot.add(x) = 0.0;
            }

            // Keys beyond the causal frontier of the block's last query are never needed.
            let mut kend = job.live_keys;
            if let Some(off) = job.causal {
                let limit = ((i0 + nq - 1) as isize).saturating_add(off).saturating_add(1);
                kend = if limit <= 0 { 0 } else { kend.min(limit as usize) };
            }
            let kbase = job.k.offset(b as isize * job.ks[0] + hk as isize * job.ks[1]);
            let vbase = job.v.offset(b as isize * job.vs[0] + hk as isize * job.vs[1]);
            let needs_bias = job.softcap.is_some() || !matches!(job.mask, JobMask::None) || job.causal.is_some();
            let mut j0 = 0;
            while j0 < kend {
                let nk = BK.min(kend - j0);
                qk_block(kbase.offset(j0 as isize * job.ks[2]), job.ks[2], job.ks[3], d, nk, qt, s);
                if needs_bias {
                    bias_block(job, b, h, i0, nq, j0, nk, s);
                }
                softmax_block(s, nk, sc);
                pv_block(vbase.offset(j0 as isize * job.vs[2]), job.vs[2], job.vs[3], dv, nk, s, ot, sc.alpha.ptr());
                j0 += nk;
            }

            // Normalize and scatter Oᵀ into the caller's layout. l == 0: every key masked → 0.
            let obase = job.out.offset(b as isize * job.os[0] + h as isize * job.os[1]);
            $crate::flash::unpack_ot(ot, sc.l.ptr(), obase, job.os[2], job.os[3], i0, nq, dv, BQ);
        }

        /// Runs every task of `job` on the current rayon pool.
        ///
        /// # Safety
        /// The CPU must support this module's target features, and `job` must come from views
        /// validated by `Problem::check`.
        pub(crate) unsafe fn run(job: &Job) {
            let tasks = job.batch * job.q_heads * job.q_len.div_ceil(BQ);
            (0..tasks).into_par_iter().for_each_init(
                || Scratch::new(job.d, job.dv, BQ, BK),
                // SAFETY: forwarded from this function's contract.
                |sc, t| unsafe { run_task(job, t, sc) },
            );
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod scalar;
