//! The arithmetic of one split: blocks of [`KB`] keys, scores of every row of the group against
//! the block (register tiles of rows × keys), the online softmax per row, and `P·V` accumulated
//! into each row's output (register tiles of rows × 16 value columns).
//!
//! Written once over fixed-size lane arrays (`[f32; 8]`, `[f32; 16]`) that LLVM turns into
//! vector registers, and instantiated three times by [`run_split`]: inside an AVX2+FMA
//! `#[target_feature]` function (`FMA = true`: fused multiply-adds), inside an AVX-512 one
//! (`WIDE = true` too) and for the baseline target (`FMA = false`: separate multiply and add,
//! since `mul_add` without the instruction is a library call). With `FMA` the two tiles that
//! read K and V (`dot_tile`, `pv_rows`) and the softmax use the intrinsic versions in
//! `super::avx2`; with `WIDE` the two tiles take `super::avx512`'s where the head size is a
//! multiple of 16.

// Raw pointers into validated views are passed with their strides; bundling them obscures it.
#![allow(clippy::too_many_arguments)]

use super::{Append, DecodeLanes, Plan, KB};
use crate::flash::JobMask;
use crate::lanes::{exp2_lanes, load, madd, madd_lanes};

/// Per-thread scratch of the decode tasks.
pub(crate) struct Rows {
    /// packed queries, `R×D`, times `scale`
    qp: Vec<f32>,
    /// the score tile of the current block, `R×KB`
    s: Vec<f32>,
    /// un-normalized outputs, `R×Dv`
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
    /// K and V rows of a block, copied only when a row is not contiguous
    kbuf: Vec<f32>,
    vbuf: Vec<f32>,
    kptr: [*const f32; KB],
    vptr: [*const f32; KB],
}

impl Rows {
    pub(crate) fn new(plan: &Plan) -> Rows {
        let r = plan.rows();
        Rows {
            qp: vec![0.0; r * plan.d],
            s: vec![0.0; r * KB],
            o: vec![0.0; r * plan.dv],
            m: vec![0.0; r],
            l: vec![0.0; r],
            alpha: vec![0.0; r],
            kbuf: vec![
                0.0;
                if unit(plan.ks, &plan.append, |a| a.pks) {
                    0
                } else {
                    KB * plan.d
                }
            ],
            vbuf: vec![
                0.0;
                if unit(plan.vs, &plan.append, |a| a.pvs) {
                    0
                } else {
                    KB * plan.dv
                }
            ],
            kptr: [std::ptr::null(); KB],
            vptr: [std::ptr::null(); KB],
        }
    }
}

/// Whether every row read (from K or V, and from the past when appending) has adjacent elements.
fn unit(st: [isize; 4], append: &Option<Append>, past: impl Fn(&Append) -> [isize; 4]) -> bool {
    st[3] == 1 && append.as_ref().is_none_or(|a| past(a)[3] == 1)
}

/// Computes split `s` of `(b, kvh)` into `part` = `m[R]`, `l[R]`, `o[R][Dv]` (running max,
/// sum of `2^(score − m)`, and the un-normalized output of every row).
///
/// # Safety
/// `lanes` runnable on this CPU (a `DecodeKernel`'s promise); `plan` built from validated views
/// still borrowed.
pub(crate) unsafe fn run_split(
    lanes: DecodeLanes,
    plan: &Plan,
    rows: &mut Rows,
    b: usize,
    kvh: usize,
    s: usize,
    part: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match lanes {
        DecodeLanes::Avx512 => return split_avx512(plan, rows, b, kvh, s, part),
        DecodeLanes::Fma => return split_fma(plan, rows, b, kvh, s, part),
        DecodeLanes::Portable => {}
    }
    let _ = lanes;
    split::<false, false>(plan, rows, b, kvh, s, part)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn split_fma(
    plan: &Plan,
    rows: &mut Rows,
    b: usize,
    kvh: usize,
    s: usize,
    part: &mut [f32],
) {
    split::<true, false>(plan, rows, b, kvh, s, part)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn split_avx512(
    plan: &Plan,
    rows: &mut Rows,
    b: usize,
    kvh: usize,
    s: usize,
    part: &mut [f32],
) {
    split::<true, true>(plan, rows, b, kvh, s, part)
}

#[inline(always)]
unsafe fn split<const FMA: bool, const WIDE: bool>(
    plan: &Plan,
    rows: &mut Rows,
    b: usize,
    kvh: usize,
    s: usize,
    part: &mut [f32],
) {
    let nrows = plan.rows();
    let j0 = s * plan.split_len;
    let j1 = (j0 + plan.split_len).min(plan.keys);
    // The blocks before the first lookahead's, at once: nothing runs yet to spread them over.
    prefetch_rows(plan, b, kvh, j0..j1.min(j0 + PREFETCH_AHEAD * KB));
    pack_queries(plan, rows, b, kvh);
    rows.m.fill(f32::NEG_INFINITY);
    rows.l.fill(0.0);
    rows.o.fill(0.0);
    let mut jb = j0;
    while jb < j1 {
        let nb = KB.min(j1 - jb);
        let mut ahead = Lookahead::new(b, kvh, jb, j1);
        block_rows(plan, rows, b, kvh, jb, nb);
        scores::<FMA, WIDE>(plan, rows, nb, &mut ahead);
        ahead.advance(plan, KB);
        for r in 0..nrows {
            let srow = &mut rows.s[r * KB..(r + 1) * KB];
            bias_row(plan, srow, b, kvh, r, jb, nb);
            let (m, l) = (&mut rows.m[r], &mut rows.l[r]);
            rows.alpha[r] = softmax_row::<FMA>(srow, m, l);
        }
        accumulate_pv::<FMA, WIDE>(plan, rows, nb);
        if let Some(a) = &plan.append {
            store_block(plan, a, rows, b, kvh, jb, nb);
        }
        jb += nb;
    }
    if plan.append.as_ref().is_some_and(|a| a.stream) {
        fence_stores();
    }
    part[..nrows].copy_from_slice(&rows.m);
    part[nrows..2 * nrows].copy_from_slice(&rows.l);
    part[2 * nrows..].copy_from_slice(&rows.o);
}

/// How many blocks ahead the K and V rows are asked for ([`Lookahead`]).
const PREFETCH_AHEAD: usize = 2;

/// The K and V rows of the block [`PREFETCH_AHEAD`] blocks ahead, asked to be fetched into L2 a
/// few keys at a time while the current block's scores are computed. The decode path does
/// little arithmetic per byte, so the hardware prefetcher alone (which stops at page boundaries
/// and sees two interleaved streams) leaves the core waiting on memory. Asking for a whole block
/// at once (256 lines at a head size of 64) stalled the core on full miss buffers; spread over
/// the score tiles, the requests keep misses in flight while the arithmetic goes on
/// (benches/README.md, "Decode attention at batch 4").
struct Lookahead {
    b: usize,
    kvh: usize,
    /// the next key to ask for
    next: usize,
    /// the end of the block ahead (or of the split)
    end: usize,
}

impl Lookahead {
    /// The block ahead of the one at `jb`, in a split ending at `j1`.
    fn new(b: usize, kvh: usize, jb: usize, j1: usize) -> Lookahead {
        let next = jb + PREFETCH_AHEAD * KB;
        Lookahead {
            b,
            kvh,
            next,
            end: (next + KB).min(j1),
        }
    }

    /// Asks for the rows of the next `keys` keys of the block ahead (none once it is covered).
    #[inline(always)]
    unsafe fn advance(&mut self, plan: &Plan, keys: usize) {
        let to = self.end.min(self.next + keys);
        if self.next < to {
            prefetch_rows(plan, self.b, self.kvh, self.next..to);
            self.next = to;
        }
    }
}

/// Asks for the K and V rows of keys `keys` of `(b, kvh)` to be fetched into L2.
#[inline(always)]
unsafe fn prefetch_rows(plan: &Plan, b: usize, kvh: usize, keys: std::ops::Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        for j in keys {
            let (k, v) = (key_row(plan, b, kvh, j), value_row(plan, b, kvh, j));
            for ((row, st3), n) in [(k, plan.d), (v, plan.dv)] {
                let span = (n.max(1) - 1) as isize * st3;
                let mut e = 0;
                while e <= span {
                    _mm_prefetch::<_MM_HINT_T1>(row.offset(e) as *const i8);
                    e += 16;
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (plan, b, kvh, keys);
}

/// Where key `j` of `(b, kvh)` is read, and its element stride: the past for an appending
/// call's past rows, else K (`present` when appending).
#[inline(always)]
unsafe fn key_row(plan: &Plan, b: usize, kvh: usize, j: usize) -> (*const f32, isize) {
    let past = plan.append.as_ref().map(|a| (a.past_len, a.pk, a.pks));
    row_of((plan.k, plan.ks), past, b, kvh, j)
}

/// [`key_row`] for values.
#[inline(always)]
unsafe fn value_row(plan: &Plan, b: usize, kvh: usize, j: usize) -> (*const f32, isize) {
    let past = plan.append.as_ref().map(|a| (a.past_len, a.pv, a.pvs));
    row_of((plan.v, plan.vs), past, b, kvh, j)
}

/// Row `j` of `(b, kvh)` of a tensor (base, strides), or of `past` (its length, base,
/// strides) when `j` is inside it.
#[inline(always)]
unsafe fn row_of(
    tensor: (*const f32, [isize; 4]),
    past: Option<(usize, *const f32, [isize; 4])>,
    b: usize,
    kvh: usize,
    j: usize,
) -> (*const f32, isize) {
    let (base, st) = match past {
        Some((len, p, ps)) if j < len => (p, ps),
        _ => tensor,
    };
    let at = b as isize * st[0] + kvh as isize * st[1] + j as isize * st[2];
    (base.offset(at), st[3])
}

/// Stores the block's past rows (already gathered densely behind `kptr`/`vptr`) into
/// `present`, while they are still in L1.
#[inline(always)]
unsafe fn store_block(
    plan: &Plan,
    a: &Append,
    rows: &Rows,
    b: usize,
    kvh: usize,
    jb: usize,
    nb: usize,
) {
    let n = nb.min(a.past_len.saturating_sub(jb));
    if n == 0 {
        return;
    }
    let (kd, vd) = present_rows(plan, a, b, kvh, jb);
    // Rows adjacent in the past and in present (a dense past): the block is one run of floats,
    // copied at once (per row, a small head size paid a call per 64 bytes).
    if dense_rows(a.pks, plan.ks, plan.d) && dense_rows(a.pvs, plan.vs, plan.dv) {
        store_row(rows.kptr[0], kd, n * plan.d, a.stream);
        store_row(rows.vptr[0], vd, n * plan.dv, a.stream);
        return;
    }
    for t in 0..n {
        let (kd, vd) = present_rows(plan, a, b, kvh, jb + t);
        store_row(rows.kptr[t], kd, plan.d, a.stream);
        store_row(rows.vptr[t], vd, plan.dv, a.stream);
    }
}

/// Whether rows of `n` elements follow each other without gaps in both the source (strides
/// `src`) and `present` (strides `dst`).
#[inline(always)]
fn dense_rows(src: [isize; 4], dst: [isize; 4], n: usize) -> bool {
    src[3] == 1 && dst[3] == 1 && src[2] == n as isize && dst[2] == n as isize
}

/// Copies `n` floats from `src` to `dst`. With `stream`, on x86-64 with `dst` 16-byte aligned,
/// with non-temporal stores: a large `present` is not read again in this step, so the stores
/// skip reading its lines first (which ordinary stores do, a third of the step's traffic).
/// [`fence_stores`] orders them before the task ends.
#[inline(always)]
unsafe fn store_row(src: *const f32, dst: *mut f32, n: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && (dst as usize).is_multiple_of(16) {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        let mut e = 0;
        while e + 4 <= n {
            _mm_stream_ps(dst.add(e), _mm_loadu_ps(src.add(e)));
            e += 4;
        }
        std::ptr::copy_nonoverlapping(src.add(e), dst.add(e), n - e);
        return;
    }
    std::ptr::copy_nonoverlapping(src, dst, n);
}

/// Makes the non-temporal stores of [`store_row`] visible before anything after it.
#[inline(always)]
fn fence_stores() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// `present_key` and `present_value` row `j` of `(b, kvh)`.
#[inline(always)]
unsafe fn present_rows(
    plan: &Plan,
    a: &Append,
    b: usize,
    kvh: usize,
    j: usize,
) -> (*mut f32, *mut f32) {
    let at = |st: [isize; 4]| b as isize * st[0] + kvh as isize * st[1] + j as isize * st[2];
    (a.k_out.offset(at(plan.ks)), a.v_out.offset(at(plan.vs)))
}

/// Copies past rows `keys` of every `(batch, kv-head)` into `present` (the rows no task
/// visited).
///
/// # Safety
/// `plan` from a live appending call whose tasks have finished.
pub(crate) unsafe fn store_past_rows(plan: &Plan, keys: std::ops::Range<usize>) {
    let Some(a) = &plan.append else { return };
    for b in 0..plan.batch {
        for kvh in 0..plan.kv_heads {
            for j in keys.clone() {
                let (kd, vd) = present_rows(plan, a, b, kvh, j);
                let (ks, kst) = key_row(plan, b, kvh, j);
                let (vs, vst) = value_row(plan, b, kvh, j);
                for e in 0..plan.d {
                    *kd.add(e) = *ks.offset(e as isize * kst);
                }
                for e in 0..plan.dv {
                    *vd.add(e) = *vs.offset(e as isize * vst);
                }
            }
        }
    }
}

/// `qp[r][e] = scale · Q[b, h, i, e]` for every row `r = (h, i)` of the group.
#[inline(always)]
unsafe fn pack_queries(plan: &Plan, rows: &mut Rows, b: usize, kvh: usize) {
    let [s0, s1, s2, s3] = plan.qs;
    for (r, dst) in rows.qp.chunks_exact_mut(plan.d.max(1)).enumerate() {
        let (h, i) = plan.row_head_query(kvh, r);
        let row = plan
            .q
            .offset(b as isize * s0 + h as isize * s1 + i as isize * s2);
        for (e, x) in dst.iter_mut().enumerate() {
            *x = *row.offset(e as isize * s3) * plan.scale;
        }
    }
}

/// Points `kptr`/`vptr` at the block's K and V rows (in place when contiguous, else copied).
#[inline(always)]
unsafe fn block_rows(plan: &Plan, rows: &mut Rows, b: usize, kvh: usize, jb: usize, nb: usize) {
    for t in 0..nb {
        let (k, kst) = key_row(plan, b, kvh, jb + t);
        let (v, vst) = value_row(plan, b, kvh, jb + t);
        rows.kptr[t] = row_ptr(k, kst, plan.d, &mut rows.kbuf, t);
        rows.vptr[t] = row_ptr(v, vst, plan.dv, &mut rows.vbuf, t);
    }
}

/// The row itself when its elements are adjacent, else a copy in slot `t` of `buf`.
#[inline(always)]
unsafe fn row_ptr(
    row: *const f32,
    stride: isize,
    n: usize,
    buf: &mut [f32],
    t: usize,
) -> *const f32 {
    if stride == 1 {
        return row;
    }
    let dst = &mut buf[t * n..(t + 1) * n];
    for (e, x) in dst.iter_mut().enumerate() {
        *x = *row.offset(e as isize * stride);
    }
    dst.as_ptr()
}

/// `s[r][t] = qp[r] · K[t]` for the block, in tiles of up to 4 rows × 2 keys (× 4 keys with
/// `WIDE` and a head size a multiple of 16); `ahead` moves on by each tile's keys.
#[inline(always)]
unsafe fn scores<const FMA: bool, const WIDE: bool>(
    plan: &Plan,
    rows: &mut Rows,
    nb: usize,
    ahead: &mut Lookahead,
) {
    let (nrows, d) = (plan.rows(), plan.d);
    let (qp, s) = (rows.qp.as_ptr(), rows.s.as_mut_ptr());
    let mut r = 0;
    while r < nrows {
        let (q, srow) = (qp.add(r * d), s.add(r * KB));
        match nrows - r {
            1 => score_rows::<FMA, WIDE, 1>(plan, ahead, q, &rows.kptr, nb, srow),
            2 => score_rows::<FMA, WIDE, 2>(plan, ahead, q, &rows.kptr, nb, srow),
            3 => score_rows::<FMA, WIDE, 3>(plan, ahead, q, &rows.kptr, nb, srow),
            _ => score_rows::<FMA, WIDE, 4>(plan, ahead, q, &rows.kptr, nb, srow),
        }
        r += 4;
    }
}

#[inline(always)]
unsafe fn score_rows<const FMA: bool, const WIDE: bool, const NR: usize>(
    plan: &Plan,
    ahead: &mut Lookahead,
    q: *const f32,
    k: &[*const f32; KB],
    nb: usize,
    s: *mut f32,
) {
    let d = plan.d;
    let mut t = 0;
    #[cfg(target_arch = "x86_64")]
    if WIDE && d.is_multiple_of(16) {
        while t + 4 <= nb {
            ahead.advance(plan, 4);
            let keys = [k[t], k[t + 1], k[t + 2], k[t + 3]];
            super::avx512::dot_tile4::<NR>(q, d, keys, s.add(t));
            t += 4;
        }
    }
    while t + 2 <= nb {
        ahead.advance(plan, 2);
        dot_tile::<FMA, NR, 2>(q, d, [k[t], k[t + 1]], s.add(t));
        t += 2;
    }
    if t < nb {
        dot_tile::<FMA, NR, 1>(q, d, [k[t]], s.add(t));
    }
}

/// `s[r·KB + kk] = q[r] · k[kk]` for an `NR × NK` tile: `NR·NK` 8-lane accumulators.
#[inline(always)]
unsafe fn dot_tile<const FMA: bool, const NR: usize, const NK: usize>(
    q: *const f32,
    d: usize,
    k: [*const f32; NK],
    s: *mut f32,
) {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        return super::avx2::dot_tile::<NR, NK>(q, d, k, s);
    }
    let mut acc = [[[0.0f32; 8]; NK]; NR];
    let chunks = d / 8;
    for c in 0..chunks {
        let kc: [[f32; 8]; NK] = std::array::from_fn(|kk| load::<8>(k[kk].add(c * 8)));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let qc = load::<8>(q.add(r * d + c * 8));
            for kk in 0..NK {
                acc_r[kk] = madd_lanes::<FMA, 8>(qc, kc[kk], acc_r[kk]);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for kk in 0..NK {
            let mut total = acc_r[kk].iter().sum::<f32>();
            for e in chunks * 8..d {
                total = madd::<FMA>(*q.add(r * d + e), *k[kk].add(e), total);
            }
            *s.add(r * KB + kk) = total;
        }
    }
}

/// Soft-cap, mask and causal frontier applied to row `r`'s scores of the block; keys past the
/// block's end (`t ≥ nb`) become `−inf` so that the softmax can run over whole lanes.
#[inline(always)]
unsafe fn bias_row(
    plan: &Plan,
    srow: &mut [f32],
    b: usize,
    kvh: usize,
    r: usize,
    jb: usize,
    nb: usize,
) {
    let (h, i) = plan.row_head_query(kvh, r);
    if let Some(c) = plan.softcap {
        for x in &mut srow[..nb] {
            *x = c * (*x / c).tanh();
        }
    }
    let at = |st: [isize; 4], t: usize| {
        b as isize * st[0] + h as isize * st[1] + i as isize * st[2] + (jb + t) as isize * st[3]
    };
    match plan.mask {
        JobMask::None => {}
        JobMask::Additive(m, st) => {
            for (t, x) in srow[..nb].iter_mut().enumerate() {
                *x += *m.offset(at(st, t));
            }
        }
        JobMask::Boolean(m, st) => {
            for (t, x) in srow[..nb].iter_mut().enumerate() {
                if !*m.offset(at(st, t)) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
    let live = plan.row_limit(i).saturating_sub(jb).min(nb);
    for x in &mut srow[live..] {
        *x = f32::NEG_INFINITY;
    }
}

/// One block of the online softmax of a row: updates the running max `m` and sum `l`, turns
/// the scores into `p = 2^((s − m)·log2 e)` and returns the factor `α = 2^((m_old − m)·log2 e)` for the
/// output accumulated so far. While every score seen is `−inf`, `m` stays `−inf` and `p = 0`.
#[inline(always)]
fn softmax_row<const FMA: bool>(srow: &mut [f32], m: &mut f32, l: &mut f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: `FMA` is only set inside the AVX2+FMA instantiation; `srow` holds KB scores.
        return unsafe { super::avx2::softmax_row(srow.as_mut_ptr(), m, l) };
    }
    let mut mx = [f32::NEG_INFINITY; 8];
    for c in srow.chunks_exact(8) {
        for (a, x) in mx.iter_mut().zip(c) {
            *a = a.max(*x);
        }
    }
    let m_new = mx.iter().fold(*m, |a, x| a.max(*x));
    let m_use = if m_new == f32::NEG_INFINITY {
        0.0
    } else {
        m_new
    };
    let log2e = std::f32::consts::LOG2_E;
    let alpha = exp2_lanes::<FMA, 8>([(*m - m_use) * log2e; 8])[0];
    let mut sum = [0.0f32; 8];
    for c in srow.chunks_exact_mut(8) {
        let x: [f32; 8] = std::array::from_fn(|e| (c[e] - m_use) * log2e);
        let p = exp2_lanes::<FMA, 8>(x);
        c.copy_from_slice(&p);
        for (a, x) in sum.iter_mut().zip(p) {
            *a += x;
        }
    }
    *l = alpha * *l + sum.iter().sum::<f32>();
    *m = m_new;
    alpha
}

/// `o[r] = α[r]·o[r] + Σₜ p[r][t]·V[t]` for every row, in tiles of up to 4 rows.
#[inline(always)]
unsafe fn accumulate_pv<const FMA: bool, const WIDE: bool>(
    plan: &Plan,
    rows: &mut Rows,
    nb: usize,
) {
    let (nrows, dv) = (plan.rows(), plan.dv);
    let mut r = 0;
    while r < nrows {
        let p = rows.s.as_ptr().add(r * KB);
        let o = rows.o.as_mut_ptr().add(r * dv);
        let alpha = rows.alpha.as_ptr().add(r);
        match nrows - r {
            1 => pv_rows::<FMA, WIDE, 1>(p, &rows.vptr, nb, alpha, o, dv),
            2 => pv_rows::<FMA, WIDE, 2>(p, &rows.vptr, nb, alpha, o, dv),
            3 => pv_rows::<FMA, WIDE, 3>(p, &rows.vptr, nb, alpha, o, dv),
            _ => pv_rows::<FMA, WIDE, 4>(p, &rows.vptr, nb, alpha, o, dv),
        }
        r += 4;
    }
}

/// `NR` rows of [`accumulate_pv`]: 16 value columns at a time, `NR` 16-lane accumulators held
/// over the block's keys, each V row loaded once for all rows; the columns past the last 16
/// one at a time.
#[inline(always)]
unsafe fn pv_rows<const FMA: bool, const WIDE: bool, const NR: usize>(
    p: *const f32,
    v: &[*const f32; KB],
    nb: usize,
    alpha: *const f32,
    o: *mut f32,
    dv: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if WIDE && dv.is_multiple_of(16) {
        return super::avx512::pv_rows::<NR>(p, v, nb, alpha, o, dv);
    }
    #[cfg(target_arch = "x86_64")]
    if FMA {
        return super::avx2::pv_rows::<NR>(p, v, nb, alpha, o, dv);
    }
    let chunks = dv / 16;
    for c in 0..chunks {
        let mut acc = [[0.0f32; 16]; NR];
        for (t, vt) in v.iter().enumerate().take(nb) {
            let vc = load::<16>(vt.add(c * 16));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                *acc_r = madd_lanes::<FMA, 16>([*p.add(r * KB + t); 16], vc, *acc_r);
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            let dst = o.add(r * dv + c * 16);
            let old = load::<16>(dst);
            let new = madd_lanes::<FMA, 16>([*alpha.add(r); 16], old, *acc_r);
            std::ptr::write_unaligned(dst as *mut [f32; 16], new);
        }
    }
    for e in chunks * 16..dv {
        for r in 0..NR {
            let mut total = 0.0f32;
            for (t, vt) in v.iter().enumerate().take(nb) {
                total = madd::<FMA>(*p.add(r * KB + t), *vt.add(e), total);
            }
            let dst = o.add(r * dv + e);
            *dst = madd::<FMA>(*alpha.add(r), *dst, total);
        }
    }
}
