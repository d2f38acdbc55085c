//! The decode path: a few queries (`Lq ≤` [`MAX_QUERIES`]) against a long key/value cache, where
//! attention is bounded by reading K and V from memory, not by arithmetic (flash-decoding).
//!
//! * **One read of each K/V row per KV head.** A task owns one `(batch, kv-head)` and a split of
//!   its keys, and serves every query row of the GQA group at once: the `R = (Hq/Hkv)·Lq` rows
//!   of q-heads `h` with `h / (Hq/Hkv) == kv-head`. Each K and V row is loaded from memory once
//!   and used by all `R` rows from L1.
//! * **Keys split across threads.** The keys of a head are cut into [`Plan::splits`] contiguous
//!   splits, so that even one KV head keeps every thread busy; each split keeps its own running
//!   max, sum and un-normalized output per row (online softmax over blocks of [`KB`] keys), and
//!   one merge per output row combines the splits afterwards.
//! * **No copy of the cache, no `Lq×Lk` scratch.** K and V are read in place through their
//!   strides; scratch is one `R×KB` score tile and the `R×(Dv+2)` partial state per task.
//! * **`present` built in the same pass** ([`run_appending`], see `crate::cache`): the past
//!   rows are read from `past_*`, used, and stored into `present_*` by the task that read them
//!   (non-temporal stores), so a step reads the past once and writes present once.
//!
//! Scores and masks are in natural units (`scale` folded into the packed queries) as in the
//! flash kernel, which adds a mask to a score with the float32 graph's rounding; the softmax
//! takes `x − max` to base 2 and needs `2^x`. The arithmetic is written once, over fixed-size lane
//! arrays, in [`block`]; it is compiled for AVX-512 (zmm tiles for the loops over K and V, where
//! the head size is a multiple of 16), for AVX2+FMA and for the baseline target (the portable
//! path), and the [`DecodeKernel`] of the session's `KernelSet` picks one ([`DecodeLanes`]).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod block;
mod route;

use rayon::prelude::*;

use crate::cache::CacheAppend;
use crate::flash::JobMask;
use crate::problem::{AttentionParams, Mask, Problem};
use crate::threads::ThreadPolicy;
use crate::view::{effective_strides, View4, ViewMut4};

use block::Rows;
pub use route::Route;

/// The decode path serves calls with at most this many queries. Past it the flash kernel's
/// register tiles over queries win (and its traffic is already shared by up to 1024 queries).
pub(crate) const MAX_QUERIES: usize = 4;

/// Keys per block: the block's K and V rows (16 KB each at D = 128) stay in L1 while every row
/// of the group uses them.
pub(crate) const KB: usize = 32;

/// A split is never shorter than this many keys (shorter splits cost more merging than they
/// gain in balance).
const MIN_SPLIT: usize = 256;

/// The decode path's part of a [`crate::KernelSet`]: when it serves a call, and which build of
/// its arithmetic runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeKernel {
    route: Route,
    /// [`Route::Auto`] takes the decode path up to this many queries.
    max_queries: usize,
    lanes: DecodeLanes,
}

/// Which build of the decode arithmetic (`block`) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeLanes {
    /// Compiled for AVX-512F (with AVX2 and FMA), with the zmm tiles of `decode/avx512.rs` for
    /// head sizes that are a multiple of 16 and `decode/avx2.rs`'s for the rest.
    Avx512,
    /// Compiled for AVX2+FMA, with the intrinsic tiles of `decode/avx2.rs`.
    Fma,
    /// Compiled for the baseline target, separate multiplies and adds.
    Portable,
}

impl DecodeKernel {
    /// The decode path on `route` with `lanes`; `Fma` only where the CPU has AVX2 and FMA, and
    /// `Avx512` only where it also has AVX-512F (the resolver's promise).
    pub(crate) fn new(route: Route, lanes: DecodeLanes) -> Self {
        DecodeKernel {
            route,
            max_queries: MAX_QUERIES,
            lanes,
        }
    }

    /// This choice on another route.
    pub(crate) fn with_route(self, route: Route) -> Self {
        DecodeKernel { route, ..self }
    }

    /// Which calls take the decode path.
    pub fn route(&self) -> Route {
        self.route
    }

    /// Which build of the arithmetic runs.
    pub fn lanes(&self) -> DecodeLanes {
        self.lanes
    }

    /// Whether [`run`] serves a validated problem of this shape (on [`Route::Auto`]: at most
    /// [`MAX_QUERIES`] queries).
    pub(crate) fn serves(&self, p: &Problem) -> bool {
        match self.route {
            Route::Auto => p.q_len <= self.max_queries,
            Route::Flash => false,
            Route::Decode => true,
        }
    }
}

/// One validated call, as raw pointers and sizes for the tasks.
pub(crate) struct Plan {
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
    pub kv_heads: usize,
    pub group: usize,
    pub q_len: usize,
    pub d: usize,
    pub dv: usize,
    /// the scale of `Q·Kᵀ`
    pub scale: f32,
    /// the soft-cap, if soft-capping applies
    pub softcap: Option<f32>,
    pub causal: Option<isize>,
    /// Keys any row may attend: `live_keys`, cut at the causal frontier of the last query.
    pub keys: usize,
    /// Key splits per (batch, kv-head), each of `split_len` keys (the last may be shorter).
    pub splits: usize,
    pub split_len: usize,
    /// Set when the call builds `present` (which `k`/`v` point at) from the past as it goes.
    pub append: Option<Append>,
}

/// The past of an appending call: keys `j < past_len` are read here instead of from `k`/`v`
/// and stored into `k_out`/`v_out` (the same buffers as `k`/`v`, strides `ks`/`vs`) once the
/// block that read them is done.
pub(crate) struct Append {
    pub past_len: usize,
    pub pk: *const f32,
    pub pks: [isize; 4],
    pub pv: *const f32,
    pub pvs: [isize; 4],
    pub k_out: *mut f32,
    pub v_out: *mut f32,
    /// Store `present` with non-temporal stores (it is at least [`STREAM_MIN_BYTES`]).
    pub stream: bool,
}

/// From this size of `present_key` + `present_value` on, the decode path writes them with
/// non-temporal stores. A smaller cache stays in the caches from one step to the next, where
/// bypassing them would make the next step read it from memory (the shipped tiny decoders, a
/// few hundred KB per layer, took twice as long per token); a larger one is evicted anyway.
pub(crate) const STREAM_MIN_BYTES: usize = 4 << 20;

// SAFETY: the pointers come from validated views borrowed for the whole call (`run` does not
// return before every task has finished). Tasks only read Q, K, V and the mask, and write their
// own partial buffers; only the merge, on the calling thread, writes `out`. An appending call's
// tasks also write the `present` rows of their own keys, which no other task reads.
unsafe impl Sync for Plan {}
unsafe impl Send for Plan {}

impl Plan {
    /// Query rows served per KV head.
    pub(crate) fn rows(&self) -> usize {
        self.group * self.q_len
    }

    /// q-head and query index of row `r` of kv-head `kvh`.
    pub(crate) fn row_head_query(&self, kvh: usize, r: usize) -> (usize, usize) {
        (kvh * self.group + r / self.q_len, r % self.q_len)
    }

    /// Keys row `i` (query index) may attend: `0..limit`.
    pub(crate) fn row_limit(&self, i: usize) -> usize {
        match self.causal {
            None => self.keys,
            Some(off) => (i as isize + off + 1).clamp(0, self.keys as isize) as usize,
        }
    }
}

/// Runs a validated problem on the decode path.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    kernel: &DecodeKernel,
    threads: &ThreadPolicy,
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
    let plan = plan(p, q, k, v, mask, params, out, threads.decode_task_target());
    run_plan(kernel.lanes, &plan);
}

/// [`run`] over `present = past ++ current` (see [`CacheAppend`]): K and V rows before the
/// past's end are read from the past and stored into `present` by the task that visits them;
/// rows no task visits (past the last query's causal frontier or the mask's keys) are copied
/// afterwards. `cache` was checked against `p` by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_appending(
    kernel: &DecodeKernel,
    threads: &ThreadPolicy,
    p: &Problem,
    q: &View4,
    cache: CacheAppend,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
) {
    let past_len = cache.past_key.dims[2];
    let (k_out, v_out) = (
        cache.present_key.as_mut_ptr(),
        cache.present_value.as_mut_ptr(),
    );
    let present = |data: *mut f32, d: usize| -> View4 {
        let dims = [p.batch, p.kv_heads, p.kv_len, d];
        let len = dims.iter().product();
        // SAFETY: the caller checked the buffer holds exactly `dims` elements; the view only
        // feeds pointers and strides to the plan, whose reads and writes go through `k_out`.
        let data = unsafe { std::slice::from_raw_parts(data as *const f32, len) };
        View4::contiguous(data, dims).expect("present dims checked by the caller")
    };
    let (k, v) = (present(k_out, p.head_dim), present(v_out, p.v_head_dim));
    let mut plan = plan(
        p,
        q,
        &k,
        &v,
        mask,
        params,
        out,
        threads.decode_task_target(),
    );
    plan.k = k_out as *const f32;
    plan.v = v_out as *const f32;
    plan.append = Some(Append {
        past_len,
        pk: cache.past_key.data.as_ptr(),
        pks: effective_strides(&cache.past_key.dims, &cache.past_key.strides),
        pv: cache.past_value.data.as_ptr(),
        pvs: effective_strides(&cache.past_value.dims, &cache.past_value.strides),
        k_out,
        v_out,
        stream: (k.num_elements() + v.num_elements()) * 4 >= STREAM_MIN_BYTES,
    });
    if out.num_elements() == 0 {
        plan.keys = 0;
    } else {
        run_plan(kernel.lanes, &plan);
    }
    // SAFETY: the tasks have finished; rows `plan.keys..past_len` were not written by them.
    unsafe { block::store_past_rows(&plan, plan.keys.min(past_len)..past_len) };
}

/// The tasks of a plan (one per batch, kv-head and split) and the merge of their splits.
fn run_plan(lanes: DecodeLanes, plan: &Plan) {
    let part_len = plan.rows() * (plan.dv + 2);
    let tasks = plan.batch * plan.kv_heads * plan.splits;
    let mut parts = vec![0.0f32; tasks * part_len];
    parts.par_chunks_mut(part_len).enumerate().for_each_init(
        || Rows::new(plan),
        |rows, (t, part)| {
            let (bh, s) = (t / plan.splits, t % plan.splits);
            let (b, kvh) = (bh / plan.kv_heads, bh % plan.kv_heads);
            // SAFETY: lanes only where the CPU runs them (a `DecodeKernel`'s promise).
            unsafe { block::run_split(lanes, plan, rows, b, kvh, s, part) };
        },
    );
    merge(plan, &parts);
}

/// The plan of one call: pointers, constants, visited keys and the split of the keys.
#[allow(clippy::too_many_arguments)]
fn plan(
    p: &Problem,
    q: &View4,
    k: &View4,
    v: &View4,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
    task_target: usize,
) -> Plan {
    let mut plan = Plan {
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
            Mask::Additive(m) => {
                JobMask::Additive(m.data.as_ptr(), effective_strides(&m.dims, &m.strides))
            }
            Mask::Boolean(m) => {
                JobMask::Boolean(m.data.as_ptr(), effective_strides(&m.dims, &m.strides))
            }
        },
        batch: p.batch,
        kv_heads: p.kv_heads,
        group: p.group(),
        q_len: p.q_len,
        d: p.head_dim,
        dv: p.v_head_dim,
        scale: params.scale,
        softcap: params.effective_softcap(),
        causal: params.causal,
        keys: p.live_keys,
        splits: 1,
        split_len: 0,
        append: None,
    };
    plan.keys = plan.row_limit(p.q_len.saturating_sub(1)).min(p.live_keys);
    plan.splits = choose_splits(p.batch * p.kv_heads, plan.keys, task_target);
    plan.split_len = plan.keys.div_ceil(plan.splits).div_ceil(KB) * KB;
    plan
}

/// Splits per (batch, kv-head): enough for `task_target` tasks over all heads (the thread
/// policy's, so that rayon can balance them), but no split shorter than [`MIN_SPLIT`] keys.
pub(crate) fn choose_splits(heads: usize, keys: usize, task_target: usize) -> usize {
    let want = task_target.max(1).div_ceil(heads.max(1));
    want.min(keys.div_ceil(MIN_SPLIT)).max(1)
}

/// Combines the splits of every output row: with `M = max mₛ` and `wₛ = 2^(mₛ−M)`,
/// `Y = Σ wₛ·oₛ / Σ wₛ·lₛ`. A row no split could attend (`M = −inf`) is zeros.
fn merge(plan: &Plan, parts: &[f32]) {
    let (rows, dv) = (plan.rows(), plan.dv);
    let part_len = rows * (dv + 2);
    let mut acc = vec![0.0f32; dv];
    for b in 0..plan.batch {
        for kvh in 0..plan.kv_heads {
            let first = (b * plan.kv_heads + kvh) * plan.splits;
            let splits = &parts[first * part_len..(first + plan.splits) * part_len];
            for r in 0..rows {
                merge_row(splits, part_len, r, dv, &mut acc);
                let (h, i) = plan.row_head_query(kvh, r);
                let base =
                    b as isize * plan.os[0] + h as isize * plan.os[1] + i as isize * plan.os[2];
                for (c, y) in acc.iter().enumerate() {
                    // SAFETY: (b, h, i, c) is inside the validated output view.
                    unsafe { *plan.out.offset(base + c as isize * plan.os[3]) = *y };
                }
            }
        }
    }
}

/// Row `r` of one (batch, kv-head) merged over its splits into `acc`. A split's part holds
/// `m[rows]`, `l[rows]`, then `o[rows][dv]`.
fn merge_row(splits: &[f32], part_len: usize, r: usize, dv: usize, acc: &mut [f32]) {
    let rows = part_len / (dv + 2);
    let m_max = splits
        .chunks(part_len)
        .map(|part| part[r])
        .fold(f32::NEG_INFINITY, f32::max);
    acc.fill(0.0);
    if m_max == f32::NEG_INFINITY {
        return;
    }
    let mut sum = 0.0f32;
    for part in splits.chunks(part_len) {
        let w = ((part[r] - m_max) * std::f32::consts::LOG2_E).exp2();
        if w == 0.0 {
            continue;
        }
        sum += w * part[rows + r];
        let o = &part[2 * rows + r * dv..2 * rows + (r + 1) * dv];
        for (a, x) in acc.iter_mut().zip(o) {
            *a += w * x;
        }
    }
    let inv = 1.0 / sum;
    for a in acc.iter_mut() {
        *a *= inv;
    }
}
