//! One evaluation of the op: tract's input values to the node's outputs.
//!
//! The steps, each a function below: Q/K/V as head views ([`head_views`]), the cache
//! (`present_*` = past ++ current, built in the output tensors, [`Cache`]), the mask as the
//! kernel's [`Mask`] ([`attn_mask`]), the kernel call ([`Problem`]), and the outputs in the
//! node's element type ([`collect_outputs`]).

use attnrt_kernels::reference::ScoreStage;
use attnrt_kernels::{AttentionParams, Mask, View4};
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use super::layout::*;
use super::problem::Problem;
use super::semantics::{check_float, AttentionOp};

pub(super) fn eval_attention(op: &AttentionOp, inputs: &[TValue]) -> TractResult<TVec<TValue>> {
    if inputs.len() != op.input_count() {
        bail!("expected {} inputs, got {}", op.input_count(), inputs.len());
    }
    let dt = inputs[0].datum_type();
    check_float(dt, "Q")?;
    let q = to_f32(&inputs[0], "Q")?;
    let k = to_f32(&inputs[1], "K")?;
    let v = to_f32(&inputs[2], "V")?;
    let rank = q.shape().len();
    let (qv, kv, vv) = head_views(op, &q, &k, &v)?;
    let [batch, q_heads, q_len, head] = qv.dims;

    let cache = Cache::build(op, inputs, &kv, &vv)?;
    let (k_view, v_view) = cache.key_value_views(kv, vv)?;
    let total = k_view.dims[2];

    let mask_f32;
    let mask = match op.mask_index().map(|m| &inputs[m]) {
        None => Mask::None,
        Some(m) if m.datum_type() == dt && dt != DatumType::Bool => {
            mask_f32 = to_f32(m, "attn_mask")?;
            attn_mask(m, Some(&mask_f32), [batch, q_heads, q_len, total])?
        }
        Some(m) => attn_mask(m, None, [batch, q_heads, q_len, total])?,
    };
    let nonpad = op
        .nonpad_index()
        .map(|i| nonpad_lengths(&inputs[i], batch, total))
        .transpose()?;

    let problem = Problem {
        q: qv,
        k: k_view,
        v: v_view,
        mask,
        params: AttentionParams {
            scale: op
                .scale
                .unwrap_or_else(|| AttentionParams::default_scale(head)),
            causal: None,
            softcap: (op.softcap > 0.0).then_some(op.softcap),
        },
        is_causal: op.is_causal,
        past_len: cache.past_len,
        nonpad,
    };
    let y = run_y(&problem, rank)?;
    let scores = op.outputs[3]
        .then(|| run_scores(op, &problem))
        .transpose()?;
    // Ends the borrows of `present_k`/`present_v` before they move into the outputs.
    drop(problem);
    collect_outputs(op, dt, y, cache, scores)
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
/// only when the node does not output them).
struct Cache {
    has_past: bool,
    past_len: usize,
    present_k: Option<Tensor>,
    present_v: Option<Tensor>,
}

impl Cache {
    fn build(
        op: &AttentionOp,
        inputs: &[TValue],
        kv: &View4<f32>,
        vv: &View4<f32>,
    ) -> TractResult<Cache> {
        let past = op
            .past_index()
            .map(|p| -> TractResult<_> {
                Ok((
                    to_f32(&inputs[p], "past_key")?,
                    to_f32(&inputs[p + 1], "past_value")?,
                ))
            })
            .transpose()?;
        let past_len = match &past {
            Some((pk, _)) => dims4(pk.shape(), "past_key")?[2],
            None => 0,
        };
        let present_k = (past.is_some() || op.outputs[1])
            .then(|| present_tensor(past.as_ref().map(|p| &p.0), kv, "past_key"))
            .transpose()?;
        let present_v = (past.is_some() || op.outputs[2])
            .then(|| present_tensor(past.as_ref().map(|p| &p.1), vv, "past_value"))
            .transpose()?;
        Ok(Cache {
            has_past: past.is_some(),
            past_len,
            present_k,
            present_v,
        })
    }

    /// The keys and values the kernel reads: `present_*` with a past, the current ones without.
    fn key_value_views<'a>(
        &'a self,
        kv: View4<'a, f32>,
        vv: View4<'a, f32>,
    ) -> TractResult<(View4<'a, f32>, View4<'a, f32>)> {
        let view = |t: &'a Option<Tensor>, what: &str| -> TractResult<View4<'a, f32>> {
            let t = t
                .as_ref()
                .with_context(|| format!("{what} was not built"))?;
            Ok(View4::contiguous(
                t.try_as_plain_ram()?.as_slice::<f32>()?,
                dims4(t.shape(), what)?,
            )?)
        };
        if !self.has_past {
            return Ok((kv, vv));
        }
        Ok((
            view(&self.present_k, "present_key")?,
            view(&self.present_v, "present_value")?,
        ))
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
fn run_y(problem: &Problem, rank: usize) -> TractResult<Tensor> {
    let [batch, q_heads, q_len, _] = problem.q.dims;
    let v_head = problem.v.dims[3];
    let y_shape: Vec<usize> = if rank == 3 {
        vec![batch, q_len, q_heads * v_head]
    } else {
        vec![batch, q_heads, q_len, v_head]
    };
    let mut y = f32_output(&y_shape)?;
    problem.run(f32_data_mut(&mut y)?, rank)?;
    Ok(y)
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
    cache: Cache,
    scores: Option<Tensor>,
) -> TractResult<TVec<TValue>> {
    let mut results = tvec![finish_output(y, dt)?];
    if op.outputs[1] {
        let t = cache.present_k.context("present_key was not built")?;
        results.push(finish_output(t, dt)?);
    }
    if op.outputs[2] {
        let t = cache.present_v.context("present_value was not built")?;
        results.push(finish_output(t, dt)?);
    }
    if let Some(scores) = scores {
        results.push(finish_output(scores, dt)?);
    }
    Ok(results)
}
