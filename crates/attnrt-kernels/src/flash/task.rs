//! One task of the kernel — `job.qsub` consecutive query blocks of one (batch, q-head) against
//! every key block they can see — and the rayon loop over a call's tasks.

// The task's steps pass raw pointers and strides; bundling them would obscure the loops.
#![allow(clippy::too_many_arguments)]

use rayon::prelude::*;

use super::bias::bias_block;
use super::pack::{pack_q_block, pack_rows, prefetch_rows, unpack_o_block};
use super::simd::{check_tiles, FlashSimd, MAX_QSUB};
use super::tiles::{load_max, pv_block, qk_block, softmax_block};
use super::{Job, JobMask, RowPrefetch, Scratch, PREFETCH_WINDOW};

/// Where a task sits: q-head `h` (kv-head `hk`) of batch `b`, queries `t0..` in `nsub` blocks.
struct TaskPos {
    b: usize,
    h: usize,
    hk: usize,
    t0: usize,
    nsub: usize,
    /// queries per task (`BQ·qsub`) and tasks per (batch, q-head)
    span: usize,
    ntq: usize,
}

impl TaskPos {
    fn of(job: &Job, task: usize, bq: usize) -> Self {
        let span = bq * job.qsub;
        let ntq = job.q_len.div_ceil(span);
        let (tq, bh) = (task % ntq, task / ntq);
        let (h, b) = (bh % job.q_heads, bh / job.q_heads);
        let t0 = tq * span;
        TaskPos {
            b,
            h,
            hk: h / job.group,
            t0,
            nsub: (job.q_len - t0).min(span).div_ceil(bq),
            span,
            ntq,
        }
    }
}

/// One task: `job.qsub` consecutive query blocks (`qsub·BQ` queries) of q-head `h` of batch
/// `b`. Each packed key block is used by all of them before moving on, which divides the K/V
/// traffic (the kernel's memory cost) by `qsub`. `NR` is `S::NR` (a const generic argument
/// must be given by the caller, who knows `S`).
///
/// # Safety
/// The CPU must have `S`'s ISA, and the caller must be compiled for it; `job` must come from
/// views validated by `Problem::check`; `sc` must be sized for `job` and `S`.
#[inline(always)]
pub(crate) unsafe fn run_task<S: FlashSimd, const NR: usize>(
    job: &Job,
    task: usize,
    sc: &mut Scratch,
) {
    const {
        assert!(NR == S::NR);
        check_tiles(S::LANES, S::NR, S::MR, S::BK, S::QSUB_MAX);
    }
    let pos = TaskPos::of(job, task, S::BQ);
    let mut sub_kend = [0usize; MAX_QSUB];
    prepare_blocks::<S>(job, &pos, sc, &mut sub_kend);
    let obase = job
        .out
        .offset(pos.b as isize * job.os[0] + pos.h as isize * job.os[1]);
    let mut ahead = plan_ahead::<S>(job, task, &pos, obase, &sub_kend[..pos.nsub]);
    attend_keys::<S, NR>(job, &pos, sc, &sub_kend[..pos.nsub], &mut ahead);

    // Normalize and scatter Oᵀ into the caller's layout. l == 0: every key masked → 0.
    let (bq, dv) = (S::BQ, job.dv);
    for sub in 0..pos.nsub {
        let i0 = pos.t0 + sub * bq;
        let nq = bq.min(job.q_len - i0);
        // The next sub-block's output rows are fetched while this one is stored: a store to a
        // line not in cache waits for the line, and a line read by no other core arrives
        // exclusive, ready to be written.
        if sub + 1 < pos.nsub && job.os[3] == 1 && dv > 0 {
            let i1 = i0 + bq;
            let next = obase.offset(i1 as isize * job.os[2]);
            prefetch_rows::<S>(next, job.os[2], bq.min(job.q_len - i1), dv);
        }
        let (ot, l) = (sc.ot.ptr().add(sub * dv * bq), sc.l.ptr().add(sub * bq));
        unpack_o_block::<S>(ot, l, obase, job.os[2], job.os[3], i0, nq, dv);
    }
}

/// Per query block of the task: packed `Qᵀ` (scaled; dead lanes zero so they stay finite and
/// harmless), running max and sum, output accumulator, and in `sub_kend` the end of the keys
/// any of its queries can see.
#[inline(always)]
unsafe fn prepare_blocks<S: FlashSimd>(
    job: &Job,
    pos: &TaskPos,
    sc: &mut Scratch,
    sub_kend: &mut [usize; MAX_QSUB],
) {
    let (bq, d, dv) = (S::BQ, job.d, job.dv);
    let qbase = job
        .q
        .offset(pos.b as isize * job.qs[0] + pos.h as isize * job.qs[1]);
    for (sub, kend) in sub_kend.iter_mut().enumerate().take(pos.nsub) {
        let i0 = pos.t0 + sub * bq;
        let nq = bq.min(job.q_len - i0);
        // The next sub-block's rows are fetched while this one is packed.
        if sub + 1 < pos.nsub && job.qs[3] == 1 && d > 0 {
            let i1 = i0 + bq;
            let next = qbase.offset(i1 as isize * job.qs[2]);
            prefetch_rows::<S>(next, job.qs[2], bq.min(job.q_len - i1), d);
        }
        let qt = sc.qt.ptr().add(sub * d * bq);
        pack_q_block::<S>(qbase, job.qs[2], job.qs[3], job.scale, i0, nq, d, qt);
        for q in 0..bq {
            *sc.m.ptr().add(sub * bq + q) = f32::NEG_INFINITY;
            *sc.l.ptr().add(sub * bq + q) = 0.0;
        }
        for x in 0..dv * bq {
            *sc.ot.ptr().add(sub * dv * bq + x) = 0.0;
        }
        // Keys past the causal frontier of the sub-block's last query are masked for all of its
        // queries: never visited.
        *kend = job.live_keys;
        if let Some(off) = job.causal {
            let limit = ((i0 + nq - 1) as isize)
                .saturating_add(off)
                .saturating_add(1);
            *kend = if limit <= 0 {
                0
            } else {
                job.live_keys.min(limit as usize)
            };
        }
        // Likewise keys after the last one the mask leaves any of its queries.
        if let Some(ends) = &job.key_ends {
            let last = (i0..i0 + nq)
                .map(|i| ends.end(pos.b, pos.h, i))
                .max()
                .unwrap_or(0);
            *kend = (*kend).min(last);
        }
    }
}

/// Prefetches paced over the tiles (one step per full tile of Q·Kᵀ and of P·V): `ahead[0]`
/// fetches, during the task's last `PREFETCH_WINDOW` sub-block tiles, the query rows and first
/// key/value block of task + 1 (what rayon most likely runs next on this thread: each thread
/// works through a contiguous range) and then this task's output rows; `ahead[1]` is filled
/// during each key block with the next key block's K and V rows ([`attend_keys`]).
#[inline(always)]
unsafe fn plan_ahead<S: FlashSimd>(
    job: &Job,
    task: usize,
    pos: &TaskPos,
    obase: *mut f32,
    sub_kend: &[usize],
) -> [RowPrefetch; 2] {
    let (d, dv, span) = (job.d, job.dv, pos.span);
    let mut ahead = [RowPrefetch::new(), RowPrefetch::new()];
    if task + 1 < job.batch * job.q_heads * pos.ntq {
        let next = task + 1;
        let (tq2, bh2) = (next % pos.ntq, next / pos.ntq);
        let (h2, b2) = (bh2 % job.q_heads, bh2 / job.q_heads);
        let hk2 = h2 / job.group;
        let t2 = tq2 * span;
        if job.qs[3] == 1 {
            let q2 = job.q.offset(
                b2 as isize * job.qs[0] + h2 as isize * job.qs[1] + t2 as isize * job.qs[2],
            );
            ahead[0].push(q2, job.qs[2], (job.q_len - t2).min(span), d);
        }
        let nk2 = S::BK.min(job.live_keys);
        if job.ks[3] == 1 {
            let k2 = job
                .k
                .offset(b2 as isize * job.ks[0] + hk2 as isize * job.ks[1]);
            ahead[0].push(k2, job.ks[2], nk2, d);
        }
        if job.vs[3] == 1 {
            let v2 = job
                .v
                .offset(b2 as isize * job.vs[0] + hk2 as isize * job.vs[1]);
            ahead[0].push(v2, job.vs[2], nk2, dv);
        }
    }
    if job.os[3] == 1 {
        let rows = (job.q_len - pos.t0).min(span);
        ahead[0].push(
            obase.offset(pos.t0 as isize * job.os[2]),
            job.os[2],
            rows,
            dv,
        );
    }
    let tiles_per_block = S::BK / S::MR + dv / S::MR;
    let blocks: usize = sub_kend.iter().map(|&e| e.div_ceil(S::BK)).sum();
    ahead[0].pace(blocks * tiles_per_block, PREFETCH_WINDOW * tiles_per_block);
    ahead
}

/// Every key block up to the last key any query block can see: packed once, then attended by
/// each query block that sees into it.
#[inline(always)]
unsafe fn attend_keys<S: FlashSimd, const NR: usize>(
    job: &Job,
    pos: &TaskPos,
    sc: &mut Scratch,
    sub_kend: &[usize],
    ahead: &mut [RowPrefetch; 2],
) {
    let (bq, bk, d, dv) = (S::BQ, S::BK, job.d, job.dv);
    let kend = sub_kend.iter().copied().max().unwrap_or(0);
    let kbase = job
        .k
        .offset(pos.b as isize * job.ks[0] + pos.hk as isize * job.ks[1]);
    let vbase = job
        .v
        .offset(pos.b as isize * job.vs[0] + pos.hk as isize * job.vs[1]);
    let tiles_per_block = bk / S::MR + dv / S::MR;
    let (kp, vp) = (sc.kp.ptr(), sc.vp.ptr());
    let mut j0 = 0;
    while j0 < kend {
        let nk = bk.min(kend - j0);
        pack_rows::<S>(
            kbase.offset(j0 as isize * job.ks[2]),
            job.ks[2],
            job.ks[3],
            nk,
            d,
            kp,
        );
        pack_rows::<S>(
            vbase.offset(j0 as isize * job.vs[2]),
            job.vs[2],
            job.vs[3],
            nk,
            dv,
            vp,
        );
        // The next key block is fetched while this one serves all sub-blocks.
        let next = j0 + nk;
        if next < kend {
            let nk2 = bk.min(kend - next);
            ahead[1] = RowPrefetch::new();
            if job.ks[3] == 1 {
                ahead[1].push(kbase.offset(next as isize * job.ks[2]), job.ks[2], nk2, d);
            }
            if job.vs[3] == 1 {
                ahead[1].push(vbase.offset(next as isize * job.vs[2]), job.vs[2], nk2, dv);
            }
            let steps = sub_kend.iter().filter(|&&e| j0 < e).count() * tiles_per_block;
            ahead[1].pace(steps, steps);
        }
        for (sub, &end) in sub_kend.iter().enumerate() {
            if j0 >= end {
                continue;
            }
            let i0 = pos.t0 + sub * bq;
            let tile = Tile {
                i0,
                nq: bq.min(job.q_len - i0),
                j0,
                nk: nk.min(end - j0),
                sub,
            };
            // A block with at most LANES live queries (decoding, short tails) computes one
            // vector column instead of NR.
            if tile.nq <= S::LANES {
                attend_tile::<S, 1>(job, pos, sc, &tile, ahead);
            } else {
                attend_tile::<S, NR>(job, pos, sc, &tile, ahead);
            }
        }
        j0 += nk;
    }
}

/// A query block (`nq` live queries from `i0`, the task's block `sub`) against the keys
/// `j0..j0 + nk` of the packed key block.
struct Tile {
    i0: usize,
    nq: usize,
    j0: usize,
    nk: usize,
    sub: usize,
}

/// Scores, bias, online softmax and output update of one [`Tile`], over `N` query vectors.
#[inline(always)]
unsafe fn attend_tile<S: FlashSimd, const N: usize>(
    job: &Job,
    pos: &TaskPos,
    sc: &mut Scratch,
    t: &Tile,
    ahead: &mut [RowPrefetch; 2],
) {
    let (bq, d, dv, sub) = (S::BQ, job.d, job.dv, t.sub);
    let (m, l) = (sc.m.ptr().add(sub * bq), sc.l.ptr().add(sub * bq));
    let (ot, qt) = (
        sc.ot.ptr().add(sub * dv * bq),
        sc.qt.ptr().add(sub * d * bq),
    );
    let (s, alpha, kp, vp) = (sc.s.ptr(), sc.alpha.ptr(), sc.kp.ptr(), sc.vp.ptr());
    let needs_bias =
        job.softcap.is_some() || !matches!(job.mask, JobMask::None) || job.causal.is_some();
    // Without a mask, soft-cap or causal rule the scores are final as Q·Kᵀ computes them,
    // which folds them into the running max on the way.
    let fuse = !needs_bias;
    let mut mx = load_max::<S, N>(m);
    qk_block::<S, N>(
        kp,
        d as isize,
        1,
        d,
        t.nk,
        qt,
        s,
        ahead,
        fuse.then_some(&mut mx),
    );
    if needs_bias {
        bias_block::<S, N>(job, pos.b, pos.h, t.i0, t.nq, t.j0, t.nk, s);
    }
    let rescale = softmax_block::<S, N>(s, t.nk, m, l, alpha, fuse.then_some(mx));
    pv_block::<S, N>(vp, dv as isize, 1, dv, t.nk, s, ot, alpha, rescale, ahead);
}

/// Runs every task of `job` on the current rayon pool, each by `task` (the ISA module's
/// function compiled for its target features, calling [`run_task`] for `S`).
///
/// # Safety
/// `task` must be safe to call on this CPU for `job`, with a scratch sized for `S`; `job` must
/// come from views validated by `Problem::check`.
pub(crate) unsafe fn run<S: FlashSimd>(job: &Job, task: unsafe fn(&Job, usize, &mut Scratch)) {
    thread_local! {
        /// This thread's scratch for the last `(D, Dv, qsub, BQ, BK)` it ran, kept across calls:
        /// a model runs many attention calls, and fresh 0.2–1 MB buffers per call cost page
        /// faults that matter at short sequence lengths.
        static SCRATCH: std::cell::RefCell<Option<([usize; 5], Scratch)>> =
            const { std::cell::RefCell::new(None) };
    }
    let (bq, bk) = (S::BQ, S::BK);
    let tasks = job.batch * job.q_heads * job.q_len.div_ceil(bq * job.qsub);
    (0..tasks).into_par_iter().for_each(|t| {
        SCRATCH.with(|cell| {
            let key = [job.d, job.dv, job.qsub, bq, bk];
            // `task` never re-enters rayon, so the borrow cannot be nested; should that ever
            // change, a private scratch keeps it correct instead of panicking.
            match cell.try_borrow_mut() {
                Ok(mut slot) => {
                    if slot.as_ref().map(|(k, _)| *k) != Some(key) {
                        *slot = Some((key, Scratch::new(job.d, job.dv, bq, bk, job.qsub)));
                    }
                    if let Some((_, sc)) = slot.as_mut() {
                        // SAFETY: forwarded from this function's contract.
                        unsafe { task(job, t, sc) }
                    }
                }
                Err(_) => {
                    let mut sc = Scratch::new(job.d, job.dv, bq, bk, job.qsub);
                    // SAFETY: forwarded from this function's contract.
                    unsafe { task(job, t, &mut sc) }
                }
            }
        })
    });
}
