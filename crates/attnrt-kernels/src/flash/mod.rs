//! The flash-style kernel.
//!
//! Each task owns `qsub` blocks of `BQ = NR·LANES` queries of one (batch, q-head) — up to 1024
//! queries with AVX-512, fewer when that would leave too few tasks for the threads; every packed
//! K/V key block serves all of them before the next is loaded, which divides the K/V memory
//! traffic by `qsub` (the traffic, not the FMAs, bounds the kernel at long sequences). Within a query block everything is *query-major in the vector lanes*:
//!
//! * `Qᵀ` block packed once per task, `[D][BQ]`, pre-multiplied by `scale`: scores, soft-cap and
//!   mask are in natural units, as the float32 graph computes them, so that a mask adds to a score
//!   with the graph's rounding (transformers' `finfo(float32).min` fill absorbs the score: a query
//!   row that sees no key gets equal weights, as in the graph). The softmax takes `x − max` to
//!   base 2 (one multiply by `log2 e`, after the subtraction, where it is exact enough) and needs
//!   `2^x` (a cheaper polynomial than `e^x`);
//! * scores computed transposed, `Sᵀ[key][BQ] = K_block · Qᵀ` — a register-blocked GEMM whose
//!   A operand is K's rows (broadcast loads, so K is never transposed) and whose B operand is the
//!   packed `Qᵀ`. The key block's K and V rows are first copied densely into scratch: with the
//!   3-D `[B, L, H·D]` layout consecutive rows are `H·D` floats apart, and broadcasts from rows
//!   scattered over L2 ran ~25% slower than from a dense block in L1;
//! * the online softmax is then *vertical*: the running max and sum of each query are vector
//!   lanes, updated with element-wise max/add over key rows — no horizontal reductions;
//! * the output accumulates transposed too, `Oᵀ[Dv][BQ] = α·Oᵀ + Vᵀ·Pᵀ`, again with broadcast
//!   loads from V's rows; the rescale by α is folded into the accumulator load.
//!
//! Scratch per task: `qsub·BQ·(D + Dv + 2) + BQ·(BK + 1) + BK·(D + Dv)` floats, independent of
//! the sequence lengths (≤ 0.6 MB with AVX-512 at D = Dv = 64 or 128).
//! Keys past the causal frontier of a block's last query are never visited.
//!
//! The code is written once, generic over [`simd::FlashSimd`] (a vector type, its operations and
//! the tile shapes): a task in `task.rs`, the register tiles and the online softmax in
//! `tiles.rs`, soft-cap/mask/causal rule in `bias.rs`, packing and unpacking in `pack.rs`. Each
//! ISA module (`avx512.rs`, `avx2.rs`, `portable.rs`) implements the trait and compiles a task
//! inside its own `#[target_feature]` function, into which everything generic inlines.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
mod bias;
mod key_ends;
mod pack;
mod portable;
mod simd;
mod task;
mod tiles;

use self::key_ends::KeyEnds;
use self::simd::FlashSimd;
use crate::isa::Isa;
use crate::problem::{AttentionParams, Mask, Problem};
use crate::threads::ThreadPolicy;
use crate::view::{effective_strides, View4, ViewMut4};

/// The flash kernel's part of a [`crate::KernelSet`]: which ISA module runs, its tiles, and
/// whether a mask's key ends are used to skip key blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashKernel {
    isa: Isa,
    tiles: FlashTiles,
    key_ends: bool,
}

/// The tiles of a flash kernel's ISA module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashTiles {
    /// Queries per block (the register tile's lanes × vectors).
    pub bq: usize,
    /// Keys per packed K/V block.
    pub bk: usize,
    /// The most query blocks one task takes.
    pub qsub_max: usize,
}

impl FlashKernel {
    /// The kernel of `isa`'s module; `isa` must be available (the resolver's promise). With
    /// `key_ends`, a mask's rows are scanned once per call for the last key each can see
    /// ([`KeyEnds`]) and the key blocks after it are skipped.
    pub(crate) fn new(isa: Isa, key_ends: bool) -> Self {
        FlashKernel {
            isa,
            tiles: tiles(isa),
            key_ends,
        }
    }

    /// The ISA module that runs.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Its tiles.
    pub fn tiles(&self) -> FlashTiles {
        self.tiles
    }

    /// Whether masks' key ends are used to skip key blocks.
    pub fn key_ends(&self) -> bool {
        self.key_ends
    }
}

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
    /// Query blocks per task (`1..=QSUB_MAX` of the ISA), see [`choose_qsub`].
    pub qsub: usize,
    /// Where each query row's visible keys end under the mask (key blocks after it are skipped).
    pub key_ends: Option<KeyEnds>,
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
    /// the current key block of K and of V, rows packed densely (`BK·D`, `BK·Dv`)
    pub kp: AlignedBuf,
    pub vp: AlignedBuf,
    pub s: AlignedBuf,
    pub ot: AlignedBuf,
    /// running max, running sum, rescale factor of the last tile — `BQ` each
    pub m: AlignedBuf,
    pub l: AlignedBuf,
    pub alpha: AlignedBuf,
}

impl Scratch {
    pub(crate) fn new(d: usize, dv: usize, bq: usize, bk: usize, qsub: usize) -> Self {
        Scratch {
            qt: AlignedBuf::new(qsub * d * bq),
            kp: AlignedBuf::new(bk * d),
            vp: AlignedBuf::new(bk * dv),
            s: AlignedBuf::new(bk * bq),
            ot: AlignedBuf::new(qsub * dv * bq),
            m: AlignedBuf::new(qsub * bq),
            l: AlignedBuf::new(qsub * bq),
            alpha: AlignedBuf::new(bq),
        }
    }
}

/// Bytes of scratch one task of `kernel` needs at most (one per pool thread); independent of the
/// sequence lengths.
pub fn scratch_bytes(kernel: &FlashKernel, head_dim: usize, v_head_dim: usize) -> usize {
    let FlashTiles { bq, bk, qsub_max } = kernel.tiles;
    let qsub = qsub_cap(bq, qsub_max, head_dim, v_head_dim);
    let floats =
        qsub * bq * (head_dim + v_head_dim + 2) + bq * (bk + 1) + bk * (head_dim + v_head_dim);
    (floats + 7 * 16) * std::mem::size_of::<f32>()
}

/// The tiles of the module that runs `isa`.
fn tiles(isa: Isa) -> FlashTiles {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => tiles_of::<avx512::Avx512>(),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => tiles_of::<avx2::Avx2>(),
        _ => tiles_of::<portable::Portable>(),
    }
}

/// The tiles of `S`'s build.
fn tiles_of<S: FlashSimd>() -> FlashTiles {
    FlashTiles {
        bq: S::BQ,
        bk: S::BK,
        qsub_max: S::QSUB_MAX,
    }
}

/// Runs a validated problem.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    kernel: &FlashKernel,
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
    let FlashTiles { bq, bk, qsub_max } = kernel.tiles;
    let mask_strides = match mask {
        Mask::None => [0; 4],
        Mask::Additive(m) => shared_rows(m, |a, b| a.to_bits() == b.to_bits()),
        Mask::Boolean(m) => shared_rows(m, |a, b| a == b),
    };
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
            Mask::Additive(m) => JobMask::Additive(m.data.as_ptr(), mask_strides),
            Mask::Boolean(m) => JobMask::Boolean(m.data.as_ptr(), mask_strides),
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
        qsub: choose_qsub(
            p.batch * p.q_heads,
            p.q_len,
            bq,
            qsub_max,
            p.head_dim,
            p.v_head_dim,
            threads.flash_min_tasks(),
        ),
        key_ends: kernel
            .key_ends
            .then(|| KeyEnds::of(mask, mask_strides, p.live_keys, (bq, bk)))
            .flatten(),
    };
    // SAFETY: a `FlashKernel` is made only for an ISA this CPU has; `job` holds pointers of
    // validated views.
    unsafe {
        match kernel.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::run(&job),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::run(&job),
            _ => portable::run(&job),
        }
    }
}

/// The mask's effective strides, with the query axis' stride set to 0 when every (batch, head)
/// slice it stores holds the same bits in all its query rows. Masks widened from one row per
/// batch to `[B, 1, Lq, Lk]` — by Hugging Face exports, and by attnrt's own fusion, which expands
/// for ONNX Runtime's sake — are then read as row masks (one vector add per key) instead of an
/// `Lq×Lk` block read and transposed for every head (up to 40 % more time at L = 2048 in the
/// kernel bench, depending on the memory traffic around). Exact: equal bits are equal values.
/// The check reads the mask at most once and stops at the first differing row.
fn shared_rows<T: BytewiseEq>(m: &View4<T>, same: impl Fn(&T, &T) -> bool) -> [isize; 4] {
    let mut st = effective_strides(&m.dims, &m.strides);
    if st[2] == 0 {
        return st;
    }
    let [nb, nh, nq, nk] = m.dims;
    // Offsets are in bounds: the view was validated against its buffer.
    let at = |b: usize, h: usize, q: usize, j: usize| {
        (b as isize * st[0] + h as isize * st[1] + q as isize * st[2] + j as isize * st[3]) as usize
    };
    for b in 0..nb {
        for h in 0..nh {
            for q in 1..nq {
                let equal = if st[3] == 1 {
                    // Compared as bytes (a `memcmp`, several times faster than element by
                    // element with an early exit: 0.08 ms a call at L = 512 before).
                    let (r0, r) = (at(b, h, 0, 0), at(b, h, q, 0));
                    bytes(&m.data[r0..r0 + nk]) == bytes(&m.data[r..r + nk])
                } else {
                    (0..nk).all(|j| same(&m.data[at(b, h, 0, j)], &m.data[at(b, h, q, j)]))
                };
                if !equal {
                    return st;
                }
            }
        }
    }
    st[2] = 0;
    st
}

/// Mask element types whose values are the same for [`shared_rows`] exactly when their bytes
/// are: no padding, f32 compared by its bits, bool stored as 0 or 1.
trait BytewiseEq: Copy {}
impl BytewiseEq for f32 {}
impl BytewiseEq for bool {}

/// The bytes of `s`.
fn bytes<T: BytewiseEq>(s: &[T]) -> &[u8] {
    // SAFETY: `BytewiseEq` types have no padding, so every byte of the slice is initialized.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// How many query blocks of `bq` queries one task takes: as many as possible up to `max` — every
/// task streams all of its head's K and V once, so the K/V traffic is divided by this number, and
/// past L ≈ 1024 that traffic (rows from L2/L3) is what bounds the kernel — while keeping at least
/// `want` tasks (the thread policy's, for rayon's load balancing).
pub(crate) fn choose_qsub(
    heads_total: usize,
    q_len: usize,
    bq: usize,
    max: usize,
    d: usize,
    dv: usize,
    want: usize,
) -> usize {
    let mut qsub = qsub_cap(bq, max, d, dv);
    while qsub > 1 && heads_total.saturating_mul(q_len.div_ceil(bq * qsub)) < want {
        qsub /= 2;
    }
    qsub
}

/// The largest power-of-two share of `max` query blocks whose packed `Qᵀ`, `Oᵀ` and softmax
/// state fit in 640 KB: they are re-read for every key block, so they must stay in L2.
pub(crate) fn qsub_cap(bq: usize, max: usize, d: usize, dv: usize) -> usize {
    let per_block =
        bq.saturating_mul(d.saturating_add(dv).saturating_add(2)) * std::mem::size_of::<f32>();
    let mut qsub = max.max(1);
    while qsub > 1 && qsub.saturating_mul(per_block) > 640 * 1024 {
        qsub /= 2;
    }
    qsub
}

/// Rows a task will read or write later — its own output rows, and the query rows and first
/// key/value block of the task this thread most likely runs next — fetched into L2 a few rows at a
/// time while the task computes. Rows `H·D` floats apart (the 3-D layout) defeat the hardware
/// prefetcher, and a burst of prefetches stalls on the core's few fill buffers: paced over the
/// task's tiles, the misses overlap the FMAs instead of stalling the packing and the stores.
pub(crate) struct RowPrefetch {
    /// `(first row, row stride, rows, elements per row)`, fetched in this order
    ranges: [(*const f32, isize, usize, usize); 4],
    len: usize,
    cur: usize,
    row: usize,
    /// Pacing: each step adds `rows` to `credit` and fetches a row per `steps` of credit, so the
    /// rows spread evenly over the task (the last ones, its output rows, arrive near its end).
    rows: usize,
    steps: usize,
    credit: usize,
    /// steps to let pass before the first fetch
    skip: usize,
}

impl RowPrefetch {
    pub(crate) fn new() -> Self {
        RowPrefetch {
            ranges: [(std::ptr::null(), 0, 0, 0); 4],
            len: 0,
            cur: 0,
            row: 0,
            rows: 0,
            steps: 1,
            credit: 0,
            skip: 0,
        }
    }

    /// Adds `rows` rows of `n` unit-stride elements; ignored when full or empty.
    pub(crate) fn push(&mut self, first: *const f32, row_stride: isize, rows: usize, n: usize) {
        if self.len < self.ranges.len() && rows > 0 && n > 0 {
            self.ranges[self.len] = (first, row_stride, rows, n);
            self.len += 1;
        }
    }

    /// Spreads the rows over the last `window` of `steps` calls of [`RowPrefetch::step`].
    pub(crate) fn pace(&mut self, steps: usize, window: usize) {
        self.rows = self.ranges[..self.len].iter().map(|r| r.2).sum();
        self.steps = steps.min(window).max(1);
        self.skip = steps.saturating_sub(window);
    }

    /// Asks for the next share of rows.
    ///
    /// # Safety
    /// Every pushed range must address rows inside one allocation.
    #[inline]
    pub(crate) unsafe fn step(&mut self) {
        if self.skip > 0 {
            self.skip -= 1;
            return;
        }
        if self.cur >= self.len {
            return;
        }
        self.credit += self.rows;
        while self.credit >= self.steps {
            self.credit -= self.steps;
            let (first, stride, rows, n) = self.ranges[self.cur];
            let row = first.offset(self.row as isize * stride);
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                let mut e = 0;
                while e < n {
                    _mm_prefetch::<_MM_HINT_T1>(row.add(e) as *const i8);
                    e += 16;
                }
                _mm_prefetch::<_MM_HINT_T1>(row.add(n - 1) as *const i8);
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (row, n);
            self.row += 1;
            if self.row == rows {
                self.cur += 1;
                self.row = 0;
                if self.cur >= self.len {
                    return;
                }
            }
        }
    }
}

/// Sub-block tiles (key block × query block pairs) at the end of a task over which `RowPrefetch`
/// spreads the next task's rows and the task's output rows: early enough to hide the misses,
/// late enough that a long task's streaming of K and V does not evict them from L2 first (over
/// the whole task, L = 2048 measured no better than without them).
pub(crate) const PREFETCH_WINDOW: usize = 64;
