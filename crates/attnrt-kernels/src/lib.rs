//! Fused multi-head attention for CPUs: a flash-style kernel (online softmax, no `Lq×Lk` buffer,
//! AVX-512 / AVX2+FMA / scalar micro-kernels, rayon tasks per
//! `(batch, q-head, block of up to 256 queries)`), a decode path for a few queries against a
//! long key/value cache (flash-decoding: keys split across threads, each K/V row read once for
//! the whole GQA group, one merge), chosen per call by [`Route`], and a naive
//! [`reference`](mod@reference) used by the tests. How each is laid out, and why, is described in
//! `src/flash/mod.rs` and `src/decode/mod.rs`.
//!
//! **One set of kernels per session.** [`KernelSet::resolve`] probes the CPU and reads
//! `ATTNRT_KERNEL_ISA` once and decides every op's kernel on that ISA (the flash tiles, the
//! decode route and build, panel kernel or `gemm` for projections, the activation epilogue,
//! the layer-norm build) and the [`ThreadPolicy`] that splits work over threads. Every entry
//! point ([`attention`], [`attention_appending`], [`projection::project`],
//! [`norm::layer_norm`], [`act::apply_rows`], [`append_rows`]) takes the set or its part for the
//! op; every op has a portable path, so forcing `scalar` runs no SIMD of attnrt's at all.
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
//! Besides attention, the other kernels a transformer's run spends its time in: [`projection`]
//! (weights packed once, tiled into tasks on the [`panel`] kernel or the `gemm` crate, with the
//! activation that follows them applied as they store, [`act`]), [`norm`] (layer
//! normalization over rows) and [`broadcast`] (element-wise arithmetic of two tensors of any
//! shapes that broadcast).

#![warn(missing_docs)]

pub mod act;
pub mod broadcast;
mod cache;
mod decode;
mod dispatch;
mod error;
mod flash;
mod isa;
mod kernel_set;
mod lanes;
pub mod norm;
pub mod panel;
mod problem;
pub mod projection;
pub mod quant;
pub mod reference;
#[cfg(test)]
mod testing;
mod threads;
mod view;

pub use cache::{append_rows, append_rows_here, CacheAppend};
pub use decode::{DecodeKernel, DecodeLanes, Route};
pub use dispatch::{attention, attention_appending};
pub use error::KernelError;
pub use flash::{scratch_bytes, FlashKernel, FlashTiles};
pub use isa::{Isa, ISA_ENV};
pub use kernel_set::{KernelSet, StandaloneAct};
pub use problem::{AttentionParams, Mask};
pub use threads::ThreadPolicy;
pub use view::{View4, ViewMut4};
