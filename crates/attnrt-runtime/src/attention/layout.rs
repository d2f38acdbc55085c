//! Buffers and strided views: Q/K/V as `[B, H, L, D]` views over tract's tensors (3-D inputs
//! without a transpose), `Y` written in place, `present_*` built in their output tensors, mask
//! broadcast strides, the `nonpad_kv_seqlen` lengths, f16 ↔ f32.

use attnrt_kernels::{Mask, ThreadPolicy, View4, ViewMut4};
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use crate::tensor::f32_data;
pub(super) use crate::tensor::f32_data_mut;

/// One input as f32: tract's own tensor, borrowed in place, when it already is f32; a converted
/// copy otherwise (f16). No other copy is made of an input.
pub(super) struct F32Input<'a> {
    tensor: std::borrow::Cow<'a, Tensor>,
}

impl F32Input<'_> {
    pub(super) fn data(&self) -> TractResult<&[f32]> {
        f32_data(&self.tensor)
    }

    pub(super) fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }
}

pub(super) fn to_f32<'a>(t: &'a Tensor, what: &str) -> TractResult<F32Input<'a>> {
    // `cast_to` borrows when the type already matches.
    let tensor = t
        .cast_to::<f32>()
        .with_context(|| format!("converting {what} to float32"))?;
    Ok(F32Input { tensor })
}

/// A zero-filled f32 tensor: outputs are allocated once, in their final place, and written by
/// the kernel or the copies below (zeroing rather than leaving them uninitialised keeps every
/// element defined whatever the writer does).
pub(super) fn f32_output(shape: &[usize]) -> TractResult<Tensor> {
    Tensor::zero::<f32>(shape)
}

/// The output value in the node's element type (f16 outputs are converted from f32 once).
pub(super) fn finish_output(t: Tensor, dt: DatumType) -> TractResult<TValue> {
    let t = if dt == DatumType::F32 {
        t
    } else {
        t.cast_to_dt(dt)?.into_owned()
    };
    Ok(t.into_tvalue())
}

pub(super) fn dims4(shape: &[usize], what: &str) -> TractResult<[usize; 4]> {
    shape
        .try_into()
        .map_err(|_| anyhow!("{what} must be 4-D, got shape {shape:?}"))
}

/// Row-major strides of a 4-D shape, in elements.
pub(super) fn strides4(d: [usize; 4]) -> [isize; 4] {
    [
        (d[1] * d[2] * d[3]) as isize,
        (d[2] * d[3]) as isize,
        d[3] as isize,
        1,
    ]
}

/// Q/K/V seen as `[B, H, L, D]` strided views over their own buffers.
pub(super) fn heads_view<'a>(
    data: &'a [f32],
    shape: &[usize],
    heads: usize,
    what: &str,
) -> TractResult<View4<'a, f32>> {
    match shape.len() {
        3 => {
            let [b, l, hidden] = [shape[0], shape[1], shape[2]];
            if heads == 0 || hidden % heads != 0 {
                bail!("{what} hidden size {hidden} is not a multiple of {heads} heads");
            }
            Ok(View4::from_bshd(data, b, l, heads, hidden / heads)?)
        }
        4 => Ok(View4::contiguous(data, dims4(shape, what)?)?),
        r => bail!("{what} must be 3-D or 4-D, got rank {r}"),
    }
}

/// The output `Y` (or one batch of it) as the kernel's `[B, Hq, Lq, Dv]` view: 3-D outputs are
/// `[B, Lq, Hq·Dv]`, written through strides.
pub(super) fn y_view(
    data: &mut [f32],
    rank: usize,
    [batch, heads, q_len, v_head]: [usize; 4],
) -> TractResult<ViewMut4<'_>> {
    Ok(if rank == 3 {
        ViewMut4::from_bshd(data, batch, q_len, heads, v_head)?
    } else {
        ViewMut4::contiguous(data, [batch, heads, q_len, v_head])?
    })
}

/// `past_key`/`past_value` as a `[B, H, P, D]` view, checked against the current keys' batch,
/// heads and head size (`cur`'s dims).
pub(super) fn past_view<'a>(
    past: &'a F32Input<'_>,
    cur: [usize; 4],
    what: &str,
) -> TractResult<View4<'a, f32>> {
    let pd = dims4(past.shape(), what)?;
    if pd[0] != cur[0] || pd[1] != cur[1] || pd[3] != cur[3] {
        bail!(
            "{what} has shape {pd:?}, which does not fit the current [B, heads, L, head_size] = {cur:?}"
        );
    }
    Ok(View4::contiguous(past.data()?, pd)?)
}

/// `present = concat([past, cur], axis=2)` as a new `[B, H, P+L, D]` f32 tensor (without `past`,
/// `present` is `cur` in the 4-D layout). With `fill_past` false only the current rows
/// `P..P+L` are written: the caller hands the tensor to
/// [`attnrt_kernels::attention_appending`], which writes rows `0..P`.
pub(super) fn present_tensor(
    threads: &ThreadPolicy,
    past: Option<&View4<'_, f32>>,
    cur: &View4<f32>,
    fill_past: bool,
) -> TractResult<Tensor> {
    let cd = cur.dims;
    let past_len = past.map_or(0, |p| p.dims[2]);
    let total = past_len + cd[2];
    // Not zero-filled: with a long cache the zeroing was a third pass over present's memory.
    // SAFETY: every element is written before the tensor is read — cur fills positions
    // past_len..total of every (batch, head) slice here, and past 0..past_len either here or
    // in the kernel (`fill_past` false); past_view checked both have present's batch, head
    // and head-size extents (f32 has no invalid bit patterns either way).
    let mut t = unsafe { Tensor::uninitialized::<f32>(&[cd[0], cd[1], total, cd[3]])? };
    let out = f32_data_mut(&mut t)?;
    if let (Some(p), true) = (past, fill_past) {
        attnrt_kernels::append_rows(threads, p, out, total, 0);
    }
    attnrt_kernels::append_rows(threads, cur, out, total, past_len);
    Ok(t)
}

/// Broadcast strides of a mask of rank ≤ 4 aligned right onto `[B, Hq, Lq, Lk]`: extent-1 axes
/// get stride 0. The key axis keeps its extent (the kernel pads a shorter one with `−inf`, as
/// the ONNX reference does), so it is checked, not broadcast.
pub(super) fn mask_geometry(
    shape: &[usize],
    target: [usize; 4],
) -> TractResult<([usize; 4], [isize; 4])> {
    if shape.is_empty() || shape.len() > 4 {
        bail!("attn_mask must have rank 1 to 4, got shape {shape:?}");
    }
    let mut dims = [1usize; 4];
    dims[4 - shape.len()..].copy_from_slice(shape);
    let natural = strides4(dims);
    let mut strides = [0isize; 4];
    for axis in 0..4 {
        if axis < 3 {
            if dims[axis] != 1 && dims[axis] != target[axis] {
                bail!(
                    "attn_mask shape {shape:?} does not broadcast to [B, q_heads, q_len, total_kv_len] = {target:?}"
                );
            }
            if dims[axis] == target[axis] && dims[axis] != 1 {
                strides[axis] = natural[axis];
            }
        } else {
            if dims[3] > target[3] {
                bail!(
                    "attn_mask has {} keys but there are only {} (past + current)",
                    dims[3],
                    target[3]
                );
            }
            strides[3] = 1;
        }
    }
    Ok((dims, strides))
}

/// The opset-24 `nonpad_kv_seqlen` input, checked: int64, shape `[batch]`, every value in
/// `0..=kv_len`. Returns the per-batch counts of valid (leading) keys.
pub(super) fn nonpad_lengths(t: &Tensor, batch: usize, kv_len: usize) -> TractResult<Vec<usize>> {
    if t.datum_type() != DatumType::I64 {
        bail!(
            "input nonpad_kv_seqlen is {:?}; ONNX Attention-24 requires int64",
            t.datum_type()
        );
    }
    if t.shape() != [batch] {
        bail!(
            "input nonpad_kv_seqlen has shape {:?}; it must be [batch] = [{batch}]",
            t.shape()
        );
    }
    t.try_as_plain_ram()?
        .as_slice::<i64>()?
        .iter()
        .enumerate()
        .map(|(b, &n)| {
            usize::try_from(n)
                .ok()
                .filter(|n| *n <= kv_len)
                .ok_or_else(|| {
                    anyhow!(
                        "input nonpad_kv_seqlen[{b}] = {n} is outside 0..={kv_len} (the key sequence length)"
                    )
                })
        })
        .collect()
}

/// Batch `b` of a `[B, …]` view (a batch-broadcast view gives its only batch), with axis
/// `cut.0` shortened to at most `cut.1` elements. Only extents shrink and the data starts at
/// batch `b`, so the strides stay valid.
pub(super) fn batch_view<'a, T>(
    v: &View4<'a, T>,
    b: usize,
    cut: Option<(usize, usize)>,
) -> TractResult<View4<'a, T>> {
    let start = if v.dims[0] <= 1 {
        0
    } else {
        b * v.strides[0] as usize
    };
    let mut dims = v.dims;
    dims[0] = dims[0].min(1);
    if let Some((axis, n)) = cut {
        dims[axis] = dims[axis].min(n);
    }
    Ok(View4::new(
        v.data.get(start..).unwrap_or(&[]),
        dims,
        v.strides,
    )?)
}

/// Batch `b` of the mask, its key axis cut to the first `keys` keys.
pub(super) fn batch_mask<'a>(m: &Mask<'a>, b: usize, keys: usize) -> TractResult<Mask<'a>> {
    Ok(match m {
        Mask::None => Mask::None,
        Mask::Additive(v) => Mask::Additive(batch_view(v, b, Some((3, keys)))?),
        Mask::Boolean(v) => Mask::Boolean(batch_view(v, b, Some((3, keys)))?),
    })
}
