//! One evaluation of the op: tract's input values to the node's outputs.
//!
//! The steps, each a function below: Q/K/V as head views ([`head_views`]), the cache
//! (`present_*` = past ++ current, built in the output tensors, [`Cache`]), the mask as the
//! kernel's [`Mask`] ([`attn_mask`]), the kernel call ([`Problem`]), and the outputs in the
//! node's element type ([`collect_outputs`]).

use attnrt_kernels::reference::ScoreStage;
use attnrt_kernels::{AttentionParams, KernelSet, Mask, View4};
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use super::layout::*;
use super::problem::Problem;
use super::semantics::{check_float, AttentionOp};
use crate::kv_store::KvStore;

pub(super) fn eval_attention(
    op: &AttentionOp,
    kernels: &KernelSet,
    inputs: &[TValue],
    store: Option<&KvStore>,
) -> TractResult<TVec<TValue>> {
    if inputs.len() != op.input_count() {
        bail!("expected {} inputs, got {}", op.input_count(), inputs.len());
    }
    let dt = inputs[0].datum_type();
    check_float(dt, "Q")?;
    if let Some(store) = store.filter(|_| op.kv_store) {
        return eval_in_store(op, kernels, inputs, store);
    }
    let [q, k, v] = qkv_f32(inputs)?;
    let rank = q.shape().len();
    let (qv, kv, vv) = head_views(op, &q, &k, &v)?;
    let [batch, q_heads, q_len, head] = qv.dims;

    let past = past_inputs(op, inputs)?;
    let mut cache = Cache::build(past.as_ref(), op, kernels, &kv, &vv)?;
    let total = cache.past_len + kv.dims[2];

    let additive = additive_mask(op, inputs)?;
    let target = [batch, q_heads, q_len, total];
    let mask = mask_of(op, inputs, additive.as_ref(), target)?;
    let nonpad = op
        .nonpad_index()
        .map(|i| nonpad_lengths(&inputs[i], batch, total))
        .transpose()?;
    let params = params_of(op, head);
    let appended =
        cache.attend_or_fill(&qv, &mask, &params, op.is_causal, nonpad.is_some(), rank)?;
    let (k_view, v_view) = cache.key_value_views(kv, vv)?;
    let problem = Problem {
        q: qv,
        k: k_view,
        v: v_view,
        mask,
        params,
        is_causal: op.is_causal,
        past_len: cache.past_len,
        nonpad,
    };
    let y = match appended {
        Some(y) => y,
        None => run_y(&problem, kernels, rank)?,
    };
    let scores = op.outputs[3]
        .then(|| run_scores(op, &problem))
        .transpose()?;
    // Ends the borrows of `present_k`/`present_v` before they move into the outputs.
    drop(problem);
    collect_outputs(op, dt, y, cache.into_present(), scores)
}

/// Store mode (`crate::kv_store`): this step's keys and values appended to the node's slot at
/// the past length `P` the stand-in `past_key` `[B, Hkv, P, 0]` carries, Y over the slot's rows
/// `0..P + L`, and `present_*` as stand-ins `[B, Hkv, P + L, 0]`.
fn eval_in_store(
    op: &AttentionOp,
    kernels: &KernelSet,
    inputs: &[TValue],
    store: &KvStore,
) -> TractResult<TVec<TValue>> {
    let dt = inputs[0].datum_type();
    if dt != DatumType::F32 {
        bail!("the in-place cache holds float32 only; Q is {dt:?}");
    }
    let p = op.past_index().context("store mode without a past")?;
    let past_len = match inputs[p].shape() {
        [_, _, len, 0] => *len,
        s => {
            bail!("store mode: past_key is {s:?}, expected the stand-in [batch, kv_heads, past, 0]")
        }
    };
    let [q, k, v] = qkv_f32(inputs)?;
    let rank = q.shape().len();
    let (qv, kv, vv) = head_views(op, &q, &k, &v)?;
    let [batch, q_heads, q_len, head] = qv.dims;
    let slot = store.slot(&op.node);
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    let threads = Some(kernels.threads());
    slot.append(&op.node, past_len, store.capacity(), &kv, &vv, threads)?;
    let (k_view, v_view) = slot.views()?;
    let total = k_view.dims[2];
    let additive = additive_mask(op, inputs)?;
    let target = [batch, q_heads, q_len, total];
    let mask = mask_of(op, inputs, additive.as_ref(), target)?;
    let problem = Problem {
        q: qv,
        k: k_view,
        v: v_view,
        mask,
        params: params_of(op, head),
        is_causal: op.is_causal,
        past_len,
        nonpad: None,
    };
    let y = run_y(&problem, kernels, rank)?;
    let scores = op.outputs[3]
        .then(|| run_scores(op, &problem))
        .transpose()?;
    let stand_in = || f32_output(&[batch, kv.dims[1], total, 0]);
    let present = Present {
        k: Some(stand_in()?),
        v: Some(stand_in()?),
    };
    collect_outputs(op, dt, y, present, scores)
}

/// Q, K and V as f32 (borrowed from tract's tensors when they are f32 already).
fn qkv_f32(inputs: &[TValue]) -> TractResult<[F32Input<'_>; 3]> {
    Ok([
        to_f32(&inputs[0], "Q")?,
        to_f32(&inputs[1], "K")?,
        to_f32(&inputs[2], "V")?,
    ])
}

/// The kernel's parameters from the node's attributes (no causal offset yet).
fn params_of(op: &AttentionOp, head: usize) -> AttentionParams {
    AttentionParams {
        scale: op
            .scale
            .unwrap_or_else(|| AttentionParams::default_scale(head)),
        causal: None,
        softcap: (op.softcap > 0.0).then_some(op.softcap),
    }
}

/// The mask in f32 when it is additive (of Q's type), for [`mask_of`] to borrow.
fn additive_mask<'a>(op: &AttentionOp, inputs: &'a [TValue]) -> TractResult<Option<F32Input<'a>>> {
    let dt = inputs[0].datum_type();
    match op.mask_index().map(|m| &inputs[m]) {
        Some(m) if m.datum_type() == dt && dt != DatumType::Bool => {
            Ok(Some(to_f32(m, "attn_mask")?))
        }
        _ => Ok(None),
    }
}

/// The node's mask broadcast onto `target` = `[B, Hq, Lq, total]` (`additive`: its f32 form).
fn mask_of<'a>(
    op: &AttentionOp,
    inputs: &'a [TValue],
    additive: Option<&'a F32Input<'_>>,
    target: [usize; 4],
) -> TractResult<Mask<'a>> {
    match op.mask_index().map(|m| &inputs[m]) {
        None => Ok(Mask::None),
        Some(m) => attn_mask(m, additive, target),
    }
}

/// `past_key` and `past_value` as f32, when the node has them.
fn past_inputs<'a>(
    op: &AttentionOp,
    inputs: &'a [TValue],
) -> TractResult<Option<(F32Input<'a>, F32Input<'a>)>> {
    op.past_index()
        .map(|p| -> TractResult<_> {
            Ok((
                to_f32(&inputs[p], "past_key")?,
                to_f32(&inputs[p + 1], "past_value")?,
            ))
        })
        .transpose()
}

/// Q, K and V as `[B, H, L, D]` views (3-D inputs split into heads by the node's attributes).
fn head_views<'a>(
    op: &AttentionOp,
    q: &'a F32Input<'_>,
    k: &'a F32Input<'_>,
    v: &'a F32Input<'_>,
) -> TractResult<(View4<'a, f32>, View4<'a, f32>, View4<'a, f32>)> {
    let rank = q.shape().len();
    if k.shape().len() != rank || v.shape().len() != rank {
        bail!(
            "Q, K and V must have the same rank: {:?}, {:?}, {:?}",
            q.shape(),
            k.shape(),
            v.shape()
        );
    }
    let (q_heads, kv_heads) = match rank {
        3 => (
            op.q_num_heads
                .context("3-D inputs need the q_num_heads attribute")?,
            op.kv_num_heads
                .context("3-D inputs need the kv_num_heads attribute")?,
        ),
        4 => (q.shape()[1], k.shape()[1]),
        r => bail!("Q, K and V must be 3-D or 4-D, got rank {r}"),
    };
    Ok((
        heads_view(q.data()?, q.shape(), q_heads, "Q")?,
        heads_view(k.data()?, k.shape(), kv_heads, "K")?,
        heads_view(v.data()?, v.shape(), kv_heads, "V")?,
    ))
}

/// `present_key`/`present_value` = past ++ current, built in their output tensors when the node
/// has a past or outputs them; with a past they are also what the kernel reads (a temporary
/// only when the node does not output them). Built with the current rows only; the past rows
/// are written by [`Cache::attend`] (the kernel, in the same pass that reads them) or by
/// [`Cache::fill_past`].
struct Cache<'a> {
    kernels: &'a KernelSet,
    past: Option<(View4<'a, f32>, View4<'a, f32>)>,
    past_len: usize,
    present_k: Option<Tensor>,
    present_v: Option<Tensor>,
}

/// The present tensors of a finished evaluation.
struct Present {
    k: Option<Tensor>,
    v: Option<Tensor>,
}

impl<'a> Cache<'a> {
    fn build(
        past: Option<&'a (F32Input<'_>, F32Input<'_>)>,
        op: &AttentionOp,
        kernels: &'a KernelSet,
        kv: &View4<f32>,
        vv: &View4<f32>,
    ) -> TractResult<Cache<'a>> {
        let past = past
            .map(|(pk, pv)| -> TractResult<_> {
                Ok((
                    past_view(pk, kv.dims, "past_key")?,
                    past_view(pv, vv.dims, "past_value")?,
                ))
            })
            .transpose()?;
        let past_len = past.as_ref().map_or(0, |(pk, _)| pk.dims[2]);
        let present = |on: bool, p: Option<&View4<f32>>, cur: &View4<f32>| {
            (past.is_some() || on)
                .then(|| present_tensor(kernels.threads(), p, cur, false))
                .transpose()
        };
        Ok(Cache {
            kernels,
            present_k: present(op.outputs[1], past.as_ref().map(|p| &p.0), kv)?,
            present_v: present(op.outputs[2], past.as_ref().map(|p| &p.1), vv)?,
            past,
            past_len,
        })
    }

    /// With a past and no per-batch key counts, Y from [`Cache::attend`] (the kernel builds
    /// present's past rows itself, reading each once); otherwise the past is copied into present
    /// for the call over present that follows, and there is no Y yet.
    fn attend_or_fill(
        &mut self,
        q: &View4<f32>,
        mask: &Mask,
        params: &AttentionParams,
        is_causal: bool,
        per_batch_keys: bool,
        rank: usize,
    ) -> TractResult<Option<Tensor>> {
        if self.past.is_none() || per_batch_keys {
            self.fill_past()?;
            return Ok(None);
        }
        let params = AttentionParams {
            causal: is_causal.then_some(self.past_len as isize),
            ..*params
        };
        Ok(Some(self.attend(q, mask, &params, rank)?))
    }

    /// Y over `present`, the kernel writing present's past rows as it reads them.
    fn attend(
        &mut self,
        q: &View4<f32>,
        mask: &Mask,
        params: &AttentionParams,
        rank: usize,
    ) -> TractResult<Tensor> {
        let (pk, pv) = self.past.as_ref().context("attend needs a past")?;
        let (tk, tv) = (
            self.present_k
                .as_mut()
                .context("present_key was not built")?,
            self.present_v
                .as_mut()
                .context("present_value was not built")?,
        );
        let total = tk.shape()[2];
        let [batch, q_heads, q_len, _] = q.dims;
        let v_head = pv.dims[3];
        let mut y = f32_output(&out_shape(rank, [batch, q_heads, q_len, v_head]))?;
        let mut out = y_view(f32_data_mut(&mut y)?, rank, [batch, q_heads, q_len, v_head])?;
        let cache = attnrt_kernels::CacheAppend {
            past_key: pk,
            past_value: pv,
            present_key: f32_data_mut(tk)?,
            present_value: f32_data_mut(tv)?,
            total,
        };
        attnrt_kernels::attention_appending(self.kernels, q, cache, mask, params, &mut out)?;
        Ok(y)
    }

    /// Copies the past into present's first rows (the calls [`Cache::attend`] does not serve).
    fn fill_past(&mut self) -> TractResult<()> {
        let Some((pk, pv)) = &self.past else {
            return Ok(());
        };
        for (p, t, what) in [
            (pk, &mut self.present_k, "present_key"),
            (pv, &mut self.present_v, "present_value"),
        ] {
            let t = t
                .as_mut()
                .with_context(|| format!("{what} was not built"))?;
            let total = t.shape()[2];
            attnrt_kernels::append_rows(self.kernels.threads(), p, f32_data_mut(t)?, total, 0);
        }
        Ok(())
    }

    /// The keys and values the kernel reads: `present_*` with a past, the current ones without.
    fn key_value_views<'b>(
        &'b self,
        kv: View4<'b, f32>,
        vv: View4<'b, f32>,
    ) -> TractResult<(View4<'b, f32>, View4<'b, f32>)> {
        let view = |t: &'b Option<Tensor>, what: &str| -> TractResult<View4<'b, f32>> {
            let t = t
                .as_ref()
                .with_context(|| format!("{what} was not built"))?;
            Ok(View4::contiguous(
                t.try_as_plain_ram()?.as_slice::<f32>()?,
                dims4(t.shape(), what)?,
            )?)
        };
        if self.past.is_none() {
            return Ok((kv, vv));
        }
        Ok((
            view(&self.present_k, "present_key")?,
            view(&self.present_v, "present_value")?,
        ))
    }

    fn into_present(self) -> Present {
        Present {
            k: self.present_k,
            v: self.present_v,
        }
    }
}

/// The mask as bool or f32 (borrowed from tract's tensor, or from `additive`, its f32 form),
/// broadcast by strides onto `target` = `[B, Hq, Lq, total]`.
fn attn_mask<'a>(
    m: &'a Tensor,
    additive: Option<&'a F32Input<'_>>,
    target: [usize; 4],
) -> TractResult<Mask<'a>> {
    let (dims, strides) = mask_geometry(m.shape(), target)?;
    match additive {
        Some(f) => Ok(Mask::Additive(View4::new(f.data()?, dims, strides)?)),
        None if m.datum_type() == DatumType::Bool => {
            let data = m.try_as_plain_ram()?.as_slice::<bool>()?;
            Ok(Mask::Boolean(View4::new(data, dims, strides)?))
        }
        None => bail!(
            "attn_mask is {:?}; it must be bool or the type of Q",
            m.datum_type()
        ),
    }
}

/// Y, written by the kernel straight into the output tensor (3-D: `[B, Lq, Hq·Dv]`).
fn run_y(problem: &Problem, kernels: &KernelSet, rank: usize) -> TractResult<Tensor> {
    let [batch, q_heads, q_len, _] = problem.q.dims;
    let v_head = problem.v.dims[3];
    let mut y = f32_output(&out_shape(rank, [batch, q_heads, q_len, v_head]))?;
    problem.run(kernels, f32_data_mut(&mut y)?, rank)?;
    Ok(y)
}

/// Y's shape: `[B, Lq, Hq·Dv]` for 3-D inputs, else `[B, Hq, Lq, Dv]`.
fn out_shape(rank: usize, [batch, q_heads, q_len, v_head]: [usize; 4]) -> Vec<usize> {
    if rank == 3 {
        vec![batch, q_len, q_heads * v_head]
    } else {
        vec![batch, q_heads, q_len, v_head]
    }
}

/// `qk_matmul_output` at the stage the node's mode asks for.
fn run_scores(op: &AttentionOp, problem: &Problem) -> TractResult<Tensor> {
    // The onnx reference implementation (which produced the conformance data) reports the
    // soft-capped scores for mode 0 when softcap is set; follow it.
    let stage = match op.qk_mode {
        0 if problem.params.softcap.is_some() => ScoreStage::Softcapped,
        m => ScoreStage::from_onnx_mode(m)
            .with_context(|| format!("qk_matmul_output_mode {m} is not 0–3"))?,
    };
    let [batch, q_heads, q_len, _] = problem.q.dims;
    let total = problem.k.dims[2];
    let mut t = f32_output(&[batch, q_heads, q_len, total])?;
    problem.scores(stage, f32_data_mut(&mut t)?)?;
    Ok(t)
}

/// The node's wired outputs, in order, in its element type.
fn collect_outputs(
    op: &AttentionOp,
    dt: DatumType,
    y: Tensor,
    present: Present,
    scores: Option<Tensor>,
) -> TractResult<TVec<TValue>> {
    let mut results = tvec![finish_output(y, dt)?];
    if op.outputs[1] {
        let t = present.k.context("present_key was not built")?;
        results.push(finish_output(t, dt)?);
    }
    if op.outputs[2] {
        let t = present.v.context("present_value was not built")?;
        results.push(finish_output(t, dt)?);
    }
    if let Some(scores) = scores {
        results.push(finish_output(scores, dt)?);
    }
    Ok(results)
}
