//! The bridge to the kernel: one evaluation's inputs as the kernel sees them, run per batch
//! where `nonpad_kv_seqlen` cuts keys, with the causal offset the ONNX spec gives.

use attnrt_kernels::reference::{self, ScoreStage};
use attnrt_kernels::{AttentionParams, KernelSet, Mask, View4};
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use super::layout::{batch_mask, batch_view, y_view};

/// The inputs of one `Attention` evaluation, as the kernel sees them.
pub(super) struct Problem<'a> {
    pub(super) q: View4<'a, f32>,
    pub(super) k: View4<'a, f32>,
    pub(super) v: View4<'a, f32>,
    pub(super) mask: Mask<'a>,
    /// Scale and softcap; `causal` is set per call.
    pub(super) params: AttentionParams,
    pub(super) is_causal: bool,
    /// Keys before the current ones (`past_key`), the causal offset without `nonpad_kv_seqlen`.
    pub(super) past_len: usize,
    /// Per batch, the number of valid leading keys (`nonpad_kv_seqlen`).
    pub(super) nonpad: Option<Vec<usize>>,
}

impl Problem<'_> {
    /// Kernel parameters for a call whose causal offset is `offset`.
    pub(super) fn params(&self, offset: isize) -> AttentionParams {
        AttentionParams {
            causal: self.is_causal.then_some(offset),
            ..self.params
        }
    }

    /// Y = attention(Q, K, V) written into `y` (the output tensor's data, zero-filled).
    ///
    /// With `nonpad_kv_seqlen`, each batch `b` runs on its first `n_b` keys: the padding keys
    /// would get a `−inf` bias, which is the same as leaving them out, and the causal offset
    /// is `n_b − Lq` (ONNX Attention-24, external cache). A batch with `n_b = 0` has every row
    /// fully masked and keeps its zeros (the errata's fully-masked rule).
    pub(super) fn run(&self, kernels: &KernelSet, y: &mut [f32], rank: usize) -> TractResult<()> {
        let [batch, q_heads, q_len, _] = self.q.dims;
        let v_head = self.v.dims[3];
        let Some(lens) = &self.nonpad else {
            let mut out = y_view(y, rank, [batch, q_heads, q_len, v_head])?;
            let params = self.params(self.past_len as isize);
            let (q, k, v) = (&self.q, &self.k, &self.v);
            attnrt_kernels::attention(kernels, q, k, v, &self.mask, &params, &mut out)?;
            return Ok(());
        };
        let per_batch = q_heads * q_len * v_head;
        if per_batch == 0 {
            return Ok(());
        }
        for (b, (y_b, &n)) in y.chunks_mut(per_batch).zip(lens).enumerate() {
            if n == 0 {
                continue;
            }
            let mut out = y_view(y_b, rank, [1, q_heads, q_len, v_head])?;
            let q = batch_view(&self.q, b, None)?;
            let k = batch_view(&self.k, b, Some((2, n)))?;
            let v = batch_view(&self.v, b, Some((2, n)))?;
            let mask = batch_mask(&self.mask, b, n)?;
            let params = self.params(n as isize - q_len as isize);
            attnrt_kernels::attention(kernels, &q, &k, &v, &mask, &params, &mut out)
                .with_context(|| format!("batch {b} (nonpad_kv_seqlen {n})"))?;
        }
        Ok(())
    }

    /// `qk_matmul_output` `[B, Hq, Lq, total]` at `stage`, written into `out` (zero-filled).
    pub(super) fn scores(&self, stage: ScoreStage, out: &mut [f32]) -> TractResult<()> {
        let [_, q_heads, q_len, _] = self.q.dims;
        let total = self.k.dims[2];
        let Some(lens) = &self.nonpad else {
            let params = self.params(self.past_len as isize);
            let s = reference::scores(&self.q, &self.k, &self.mask, &params, stage)?;
            if s.len() != out.len() {
                bail!(
                    "qk_matmul_output: {} scores for a [{:?}] output",
                    s.len(),
                    [self.q.dims[0], q_heads, q_len, total]
                );
            }
            out.copy_from_slice(&s);
            return Ok(());
        };
        let per_batch = q_heads * q_len * total;
        if per_batch == 0 {
            return Ok(());
        }
        for (b, (out_b, &n)) in out.chunks_mut(per_batch).zip(lens).enumerate() {
            let q = batch_view(&self.q, b, None)?;
            match stage {
                // Before the bias is added nothing is masked: every key, padding included.
                ScoreStage::QkMatmul | ScoreStage::Softcapped => {
                    let k = batch_view(&self.k, b, None)?;
                    let s = reference::scores(&q, &k, &Mask::None, &self.params(0), stage)?;
                    out_b.copy_from_slice(&s);
                }
                // After it, padding keys are −inf (biased) or 0 (softmax): compute the valid
                // keys only and fill the rest.
                _ => {
                    let fill = if stage == ScoreStage::Biased {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    };
                    out_b.fill(fill);
                    if n == 0 {
                        continue;
                    }
                    let k = batch_view(&self.k, b, Some((2, n)))?;
                    let mask = batch_mask(&self.mask, b, n)?;
                    let params = self.params(n as isize - q_len as isize);
                    let s = reference::scores(&q, &k, &mask, &params, stage)?;
                    for (row, src) in out_b.chunks_mut(total).zip(s.chunks(n)) {
                        row[..n].copy_from_slice(src);
                    }
                }
            }
        }
        Ok(())
    }
}
