//! Fused multi-head attention for CPUs: a flash-style kernel (online softmax, no `Lq×Lk` buffer,
//! run-time selected AVX-512 / AVX2+FMA / scalar micro-kernels, rayon tasks per
//! `(batch, q-head, block of up to 256 queries)`), a decode path for a few queries against a
//! long key/value cache (flash-decoding: keys split across threads, each K/V row read once for
//! the whole GQA group, one merge), chosen per call by [`Route`], and a naive
//! [`reference`](mod@reference) used by the tests. How each is laid out, and why, is described in
//! `src/flash/mod.rs` and `src/decode/mod.rs`.
//!
//! The semantics are those of the ONNX `Attention` operator (opset 23, with the post-release
//! errata), restricted to what a kernel needs; the caller (the runtime) handles the ONNX-level
//! parts (3-D reshapes are expressed as strided views, `past_key`/`past_value` concatenation
//! unless it calls [`attention_appending`], which builds `present` in the same pass,
//! the default scale):
//!
//! ```text
//! scores = scale · Q·Kᵀ                     (ONNX: (Q·√scale)·(K·√scale)ᵀ, equal up to rounding)
//! scores = softcap · tanh(scores / softcap)  if softcap > 0  (before the mask, as the spec's graph)
//! scores = scores + bias                     bias = float mask, or 0/−inf from a bool mask, plus
//!                                            −inf where the causal rule forbids the key
//! P      = softmax(scores) over keys;  Y = P·V
//! ```
//!
//! **Fully-masked rows.** The errata of opset 23 say a query row whose combined additive bias is
//! `−inf` for every key yields a zero row in `Y` (and in the mode-3 `qk_matmul_output`), not NaN.
//! The reference implements exactly that rule (decided on the bias). The fast kernel decides on
//! the biased scores: a row whose `scores + bias` are all `−inf` yields zeros. The two rules agree
//! whenever `Q·Kᵀ` is finite; with infinite inputs the kernel may give NaN where the spec gives 0.
//! A problem with no keys at all (`Lk == 0`, or a causal offset that excludes every key) is the
//! same case: zero rows.
//!
//! **Rows masked by a finite fill.** Scores and bias are added in float32, as a float32 graph
//! adds them. transformers fills masked keys with `finfo(float32).min`, which absorbs every score
//! (`s + min == min`), so a query row whose every key carries that fill (a padding query of a
//! left-padded batch) softmaxes to equal weights over those keys: `Y` is their mean of `V`, in
//! the kernel, the reference, ONNX Runtime and the unfused graph alike (the kernels add masks in
//! natural units and convert to base 2 only after subtracting the row's maximum).
//!
//! Besides attention, the other kernels a transformer's run spends its time in: [`panel`] (the
//! projections, against weights packed once, with the activation that follows them applied as
//! they store, [`act`]) and [`norm`] (layer normalization over rows).

#![warn(missing_docs)]

use std::sync::atomic::{AtomicU8, Ordering};

pub mod act;
mod cache;
mod decode;
mod error;
mod flash;
mod isa;
pub mod norm;
pub mod panel;
pub mod reference;
mod view;

pub use cache::{append_rows, attention_appending, attention_appending_with_isa, CacheAppend};
pub use error::KernelError;
pub use flash::scratch_bytes;
pub use isa::{Isa, ISA_ENV};
pub use view::{View4, ViewMut4};

/// The attention mask, broadcast to `[B, Hq, Lq, Lk]`.
///
/// Axes 0–2 (batch, q-head, query) broadcast when their extent is 1 (the stride is then ignored).
/// The key axis follows the ONNX reference: a mask whose last extent `Lm` is *shorter* than `Lk`
/// is padded, i.e. keys `j ≥ Lm` are masked out (`−inf` / `false`); it is never broadcast from
/// extent 1. To broadcast one value over all keys, give the key axis extent `Lk` and stride 0.
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// No mask.
    None,
    /// Added to the scaled (and soft-capped) scores; `−inf` removes a key.
    Additive(View4<'a, f32>),
    /// `true` = may attend (ONNX `Attention` bool `attn_mask` semantics); `false` adds `−inf`.
    Boolean(View4<'a, bool>),
}

/// Scalar parameters of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Multiplies `Q·Kᵀ` (ONNX default `1/√head_dim`, see [`AttentionParams::default_scale`]).
    pub scale: f32,
    /// `Some(offset)`: query `i` may attend key `j` only if `j <= i + offset`. ONNX opset 23 uses
    /// `offset = past_sequence_length` (0 without a cache; bottom-right alignment).
    pub causal: Option<isize>,
    /// `Some(c)` with `c > 0`: `scores = c · tanh(scores / c)` before the mask is added (as in the
    /// ONNX graph). `None`, `c <= 0` or NaN: no soft-capping (ONNX applies it only for `c > 0`).
    pub softcap: Option<f32>,
}

impl AttentionParams {
    /// Plain attention with the given scale: no causal mask, no softcap.
    pub fn new(scale: f32) -> Self {
        AttentionParams {
            scale,
            causal: None,
            softcap: None,
        }
    }

    /// The ONNX default scale `1/√head_dim` (1 for `head_dim == 0`).
    pub fn default_scale(head_dim: usize) -> f32 {
        if head_dim == 0 {
            1.0
        } else {
            1.0 / (head_dim as f32).sqrt()
        }
    }

    /// The soft-cap value that is actually applied (`c > 0`), if any.
    pub(crate) fn effective_softcap(&self) -> Option<f32> {
        self.softcap.filter(|c| *c > 0.0)
    }
}

/// Fused attention on the ISA chosen by [`Isa::selected`] (the best the CPU has, unless
/// `ATTNRT_KERNEL_ISA=avx512|avx2|scalar` forces one), on the route of [`Route::current`]
/// (by default the decode path for `Lq ≤ 4`, else the flash kernel).
///
/// Shapes: Q `[B, Hq, Lq, D]`, K `[B, Hkv, Lk, D]`, V `[B, Hkv, Lk, Dv]`, out `[B, Hq, Lq, Dv]`,
/// `Hq % Hkv == 0` (GQA: q-head `h` uses kv-head `h / (Hq/Hkv)`). Runs on the current rayon pool
/// (wrap the call in `pool.install(..)` to choose the threads). Scratch memory is one buffer
/// per pool thread of [`scratch_bytes`] (≤ 0.6 MB at D = 64–128), independent of the sequence
/// lengths: no `Lq×Lk` score matrix is ever formed. Each thread keeps its buffer for the next
/// call with the same head sizes. The decode path allocates per call its partial results,
/// `splits·B·Hq·Lq·(Dv + 2)` floats, and per task a `Hq/Hkv·Lq × (D + Dv + 32)` scratch.
pub fn attention(
    q: &View4,
    k: &View4,
    v: &View4,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
) -> Result<(), KernelError> {
    attention_with_isa(Isa::selected()?, q, k, v, mask, params, out)
}

/// [`attention`] on an explicit ISA path (used by tests and benchmarks to cover every path);
/// fails with [`KernelError::IsaUnavailable`] if the CPU lacks it.
pub fn attention_with_isa(
    isa: Isa,
    q: &View4,
    k: &View4,
    v: &View4,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
) -> Result<(), KernelError> {
    attention_routed(isa, Route::current(), q, k, v, mask, params, out)
}

/// The process-wide route of [`attention`] and [`attention_with_isa`], see [`Route::set_current`].
static CURRENT_ROUTE: AtomicU8 = AtomicU8::new(0);

/// Which algorithm serves a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// The decode path when `Lq ≤ 4`, else the flash path (what [`attention`] does).
    Auto,
    /// The flash-style kernel: tasks per (batch, q-head, query blocks), register tiles over
    /// queries; made for long query sequences (prefill, encoders).
    Flash,
    /// Flash-decoding for a few queries against a long cache: the keys split across threads,
    /// each K/V row read once for every q-head of its GQA group, one merge of the splits.
    Decode,
}

impl Route {
    /// Makes [`attention`] and [`attention_with_isa`] (and so the runtime's `Attention` op) take
    /// `route` for every call in this process; [`Route::Auto`] restores the default. For
    /// benchmarks that time the paths through the whole runtime in one process.
    pub fn set_current(route: Route) {
        let code = match route {
            Route::Auto => 0,
            Route::Flash => 1,
            Route::Decode => 2,
        };
        CURRENT_ROUTE.store(code, Ordering::Relaxed);
    }

    /// The route set by [`Route::set_current`] ([`Route::Auto`] unless changed).
    pub fn current() -> Route {
        match CURRENT_ROUTE.load(Ordering::Relaxed) {
            1 => Route::Flash,
            2 => Route::Decode,
            _ => Route::Auto,
        }
    }

    /// The name used in reports and benchmark labels.
    pub fn name(self) -> &'static str {
        match self {
            Route::Auto => "auto",
            Route::Flash => "flash",
            Route::Decode => "decode",
        }
    }
}

/// [`attention_with_isa`] on an explicit [`Route`] (benchmarks and tests compare the paths).
/// Every route accepts every valid problem.
#[allow(clippy::too_many_arguments)]
pub fn attention_routed(
    isa: Isa,
    route: Route,
    q: &View4,
    k: &View4,
    v: &View4,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
) -> Result<(), KernelError> {
    isa.ensure_available()?;
    let problem = Problem::check(q, k, Some(v), mask, Some(out))?;
    let decode = match route {
        Route::Auto => decode::suits(&problem),
        Route::Flash => false,
        Route::Decode => true,
    };
    if decode {
        decode::run(isa, &problem, q, k, v, mask, params, out);
    } else {
        flash::run(isa, &problem, q, k, v, mask, params, out);
    }
    Ok(())
}

/// The sizes of one validated attention call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Problem {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    /// Keys that can be attended at all: `kv_len`, cut to the mask's key extent (ONNX pads a
    /// shorter mask with `−inf`/`false`).
    pub live_keys: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
}

impl Problem {
    /// Validates every view and the shape relations between them.
    pub(crate) fn check(
        q: &View4,
        k: &View4,
        v: Option<&View4>,
        mask: &Mask,
        out: Option<&ViewMut4>,
    ) -> Result<Problem, KernelError> {
        q.validate("Q")?;
        k.validate("K")?;
        let [batch, q_heads, q_len, head_dim] = q.dims;
        let [kb, kv_heads, kv_len, kd] = k.dims;
        if kb != batch {
            return Err(KernelError::Shape(format!(
                "Q has batch {batch} but K has batch {kb} (Q {:?}, K {:?})",
                q.dims, k.dims
            )));
        }
        if kd != head_dim {
            return Err(KernelError::Shape(format!(
                "Q head size {head_dim} differs from K head size {kd} (Q {:?}, K {:?})",
                q.dims, k.dims
            )));
        }
        if kv_heads == 0 {
            if q_heads != 0 {
                return Err(KernelError::Shape(format!(
                    "K has 0 heads but Q has {q_heads}"
                )));
            }
        } else if q_heads % kv_heads != 0 {
            return Err(KernelError::Shape(format!(
                "Q heads ({q_heads}) must be a multiple of K/V heads ({kv_heads}) for grouped-query attention"
            )));
        }
        let mut v_head_dim = 0;
        if let Some(v) = v {
            v.validate("V")?;
            let [vb, vh, vl, vd] = v.dims;
            if vb != batch || vh != kv_heads || vl != kv_len {
                return Err(KernelError::Shape(format!(
                    "V dims {:?} must be [{batch}, {kv_heads}, {kv_len}, Dv] to match K {:?}",
                    v.dims, k.dims
                )));
            }
            v_head_dim = vd;
        }
        if let Some(out) = out {
            out.validate("out")?;
            let want = [batch, q_heads, q_len, v_head_dim];
            if out.dims != want {
                return Err(KernelError::Shape(format!(
                    "out dims {:?} must be {want:?} (from Q {:?} and V)",
                    out.dims, q.dims
                )));
            }
        }
        let mask_dims = match mask {
            Mask::None => None,
            Mask::Additive(m) => {
                m.validate("mask")?;
                Some(m.dims)
            }
            Mask::Boolean(m) => {
                m.validate("mask")?;
                Some(m.dims)
            }
        };
        let mut live_keys = kv_len;
        if let Some(md) = mask_dims {
            let target = [batch, q_heads, q_len];
            for (axis, name) in ["batch", "q heads", "query length"].iter().enumerate() {
                if md[axis] != 1 && md[axis] != target[axis] {
                    return Err(KernelError::Shape(format!(
                        "mask dims {md:?} do not broadcast to [B={batch}, Hq={q_heads}, Lq={q_len}, Lk={kv_len}]: {name} is {} (must be 1 or {})",
                        md[axis], target[axis]
                    )));
                }
            }
            if md[3] > kv_len {
                return Err(KernelError::Shape(format!(
                    "mask dims {md:?} have {} keys but K/V have only {kv_len}",
                    md[3]
                )));
            }
            live_keys = md[3];
        }
        Ok(Problem {
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len,
            live_keys,
            head_dim,
            v_head_dim,
        })
    }

    /// Number of q-heads sharing one kv-head.
    pub(crate) fn group(&self) -> usize {
        self.q_heads.checked_div(self.kv_heads).unwrap_or(1)
    }
}
