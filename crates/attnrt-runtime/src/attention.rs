//! The ONNX `Attention` operator (opset 23, with the post-release errata) on attnrt's kernel.
//!
//! tract-onnx's op register is keyed by `op_type` only (the domain is ignored) and a later insert
//! replaces the built-in builder, so [`register`] makes every `Attention` node — the ones
//! attnrt's fusion emits and the ones exporters already wrote — run here.
//!
//! What this module owns is the ONNX-level part of the op: 3-D ↔ 4-D layouts (as strided views,
//! no transpose is materialised), attribute defaults, `past_key`/`past_value` concatenation into
//! `present_key`/`present_value`, mask broadcasting, f16 ↔ f32, and `qk_matmul_output`. The
//! arithmetic itself is `attnrt_kernels::attention` (flash-style) and, only for the optional
//! `qk_matmul_output`, `attnrt_kernels::reference::scores`.
//!
//! Everything the op cannot do exactly is refused with an error naming the node, never
//! approximated: opset-24 `nonpad_kv_seqlen`, unknown attributes, element types other than
//! f32/f16, masks of other types or of rank above 4.

use attnrt_kernels::reference::{self, ScoreStage};
use attnrt_kernels::{AttentionParams, Mask, View4, ViewMut4};
use tract_onnx::model::{OnnxOpRegister, ParsingContext};
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

/// Registers attnrt's builder for `Attention`, replacing tract's own.
pub fn register(ops: &mut OnnxOpRegister) {
    ops.insert("Attention", build_attention);
}

/// ONNX input slots of `Attention` (opset 23/24).
const SLOT_MASK: usize = 3;
const SLOT_PAST_KEY: usize = 4;
const SLOT_PAST_VALUE: usize = 5;
const SLOT_NONPAD: usize = 6;

/// Attributes of opset 23 (all optional). Anything else is refused rather than ignored.
const KNOWN_ATTRIBUTES: [&str; 7] = [
    "is_causal",
    "kv_num_heads",
    "q_num_heads",
    "qk_matmul_output_mode",
    "scale",
    "softcap",
    "softmax_precision",
];

/// The parsed node: attributes with their ONNX defaults, and which optional inputs and outputs
/// the node wires (tract drops empty names, so positions shift).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionOp {
    /// Node name for error messages.
    pub node: String,
    /// `q_num_heads` (required for 3-D inputs).
    pub q_num_heads: Option<usize>,
    /// `kv_num_heads` (required for 3-D inputs).
    pub kv_num_heads: Option<usize>,
    /// `scale`; `None` means `1/√head_size`.
    pub scale: Option<f32>,
    /// `is_causal`: bottom-right aligned, offset = past length.
    pub is_causal: bool,
    /// `softcap`; applied when `> 0`.
    pub softcap: f32,
    /// `qk_matmul_output_mode` (0–3).
    pub qk_mode: i64,
    /// `attn_mask` is wired.
    pub has_mask: bool,
    /// `past_key` and `past_value` are wired (ONNX requires both or neither).
    pub has_past: bool,
    /// Which of `Y`, `present_key`, `present_value`, `qk_matmul_output` are wired.
    pub outputs: [bool; 4],
}

impl Eq for AttentionOp {}

fn wired(names: &[String], slot: usize) -> bool {
    names.get(slot).is_some_and(|s| !s.is_empty())
}

fn build_attention(
    _ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let label = if node.name.is_empty() {
        format!(
            "<Attention -> {}>",
            node.output.first().map(String::as_str).unwrap_or("?")
        )
    } else {
        node.name.clone()
    };
    let op = parse_node(node, &label).with_context(|| format!("Attention node '{label}'"))?;
    Ok((expand(op), vec![]))
}

fn parse_node(node: &NodeProto, label: &str) -> TractResult<AttentionOp> {
    for a in &node.attribute {
        if !KNOWN_ATTRIBUTES.contains(&a.name.as_str()) {
            bail!(
                "attribute '{}' is not part of ONNX Attention-23; attnrt does not implement it",
                a.name
            );
        }
    }
    let heads = |name: &str| -> TractResult<Option<usize>> {
        match node.get_attr_opt::<i64>(name)? {
            None => Ok(None),
            Some(v) if v > 0 => Ok(Some(v as usize)),
            Some(v) => bail!("attribute {name}={v}: must be positive"),
        }
    };
    let q_num_heads = heads("q_num_heads")?;
    let kv_num_heads = heads("kv_num_heads")?;
    let scale = node.get_attr_opt::<f32>("scale")?;
    if let Some(s) = scale {
        if !s.is_finite() {
            bail!("attribute scale={s} is not finite");
        }
    }
    let is_causal = match node.get_attr_opt::<i64>("is_causal")?.unwrap_or(0) {
        0 => false,
        1 => true,
        v => bail!("attribute is_causal={v}: must be 0 or 1"),
    };
    let softcap = node.get_attr_opt::<f32>("softcap")?.unwrap_or(0.0);
    if softcap.is_nan() || softcap.is_infinite() {
        bail!("attribute softcap={softcap} is not finite");
    }
    let qk_mode = node
        .get_attr_opt::<i64>("qk_matmul_output_mode")?
        .unwrap_or(0);
    if !(0..=3).contains(&qk_mode) {
        bail!("attribute qk_matmul_output_mode={qk_mode}: must be 0, 1, 2 or 3");
    }
    // softmax_precision only asks for *at least* that precision; attnrt always computes the
    // softmax in f32 (f16/bf16/f32 requests are met, a double request is not).
    if let Some(p) = node.get_attr_opt::<i64>("softmax_precision")? {
        const FLOAT: i64 = 1;
        const FLOAT16: i64 = 10;
        const BFLOAT16: i64 = 16;
        if ![FLOAT, FLOAT16, BFLOAT16].contains(&p) {
            bail!("attribute softmax_precision={p}: attnrt computes the softmax in float32 only");
        }
    }
    if node.input.len() > SLOT_NONPAD + 1 || wired(&node.input, SLOT_NONPAD) {
        bail!("input nonpad_kv_seqlen (Attention-24) is not supported by attnrt");
    }
    for slot in 0..3 {
        if !wired(&node.input, slot) {
            bail!("input {} (Q, K, V) is missing", slot);
        }
    }
    let has_past_key = wired(&node.input, SLOT_PAST_KEY);
    let has_past_value = wired(&node.input, SLOT_PAST_VALUE);
    if has_past_key != has_past_value {
        bail!("past_key and past_value must be given together");
    }
    if node.output.len() > 4 {
        bail!("has {} outputs; Attention has at most 4", node.output.len());
    }
    let outputs = [0, 1, 2, 3].map(|i| wired(&node.output, i));
    if !outputs[0] {
        bail!("output Y is not wired");
    }
    Ok(AttentionOp {
        node: label.to_string(),
        q_num_heads,
        kv_num_heads,
        scale,
        is_causal,
        softcap,
        qk_mode,
        has_mask: wired(&node.input, SLOT_MASK),
        has_past: has_past_key,
        outputs,
    })
}

/// Sizes of one call, from the input shapes (symbolic or concrete).
struct Geometry<D> {
    rank: usize,
    batch: D,
    q_heads: D,
    kv_heads: D,
    q_len: D,
    kv_len: D,
    past_len: D,
    head: D,
    v_head: D,
}

impl AttentionOp {
    /// Number of wired inputs in tract's (compacted) order: Q, K, V, [mask], [past_k, past_v].
    fn input_count(&self) -> usize {
        3 + self.has_mask as usize + 2 * self.has_past as usize
    }

    fn mask_index(&self) -> Option<usize> {
        self.has_mask.then_some(3)
    }

    fn past_index(&self) -> Option<usize> {
        self.has_past.then_some(3 + self.has_mask as usize)
    }

    fn output_count(&self) -> usize {
        self.outputs.iter().filter(|b| **b).count()
    }

    /// The geometry from symbolic shapes; checks what can be checked symbolically.
    fn geometry(&self, shapes: &[&[TDim]]) -> TractResult<Geometry<TDim>> {
        let (q, k, v) = (shapes[0], shapes[1], shapes[2]);
        let rank = q.len();
        if k.len() != rank || v.len() != rank {
            bail!(
                "Q, K and V must have the same rank (got {}, {}, {})",
                q.len(),
                k.len(),
                v.len()
            );
        }
        let div = |total: &TDim, heads: usize, what: &str| -> TractResult<TDim> {
            if let Ok(t) = total.to_i64() {
                if t % heads as i64 != 0 {
                    bail!("{what} hidden size {t} is not a multiple of {heads} heads");
                }
                Ok(TDim::from(t / heads as i64))
            } else {
                Ok(total.clone() / heads)
            }
        };
        let g = match rank {
            3 => {
                let qh = self
                    .q_num_heads
                    .context("3-D inputs need the q_num_heads attribute")?;
                let kvh = self
                    .kv_num_heads
                    .context("3-D inputs need the kv_num_heads attribute")?;
                if qh % kvh != 0 {
                    bail!("q_num_heads {qh} is not a multiple of kv_num_heads {kvh}");
                }
                let head = div(&q[2], qh, "Q")?;
                let k_head = div(&k[2], kvh, "K")?;
                if let (Ok(a), Ok(b)) = (head.to_i64(), k_head.to_i64()) {
                    if a != b {
                        bail!("Q head size {a} differs from K head size {b}");
                    }
                }
                Geometry {
                    rank,
                    batch: q[0].clone(),
                    q_heads: qh.into(),
                    kv_heads: kvh.into(),
                    q_len: q[1].clone(),
                    kv_len: k[1].clone(),
                    past_len: 0.into(),
                    head,
                    v_head: div(&v[2], kvh, "V")?,
                }
            }
            4 => Geometry {
                rank,
                batch: q[0].clone(),
                q_heads: q[1].clone(),
                kv_heads: k[1].clone(),
                q_len: q[2].clone(),
                kv_len: k[2].clone(),
                past_len: 0.into(),
                head: q[3].clone(),
                v_head: v[3].clone(),
            },
            r => bail!("Q, K and V must be 3-D or 4-D, got rank {r}"),
        };
        let mut g = g;
        if let Some(p) = self.past_index() {
            let (pk, pv) = (shapes[p], shapes[p + 1]);
            if pk.len() != 4 || pv.len() != 4 {
                bail!("past_key and past_value must be 4-D [B, kv_heads, past_len, head_size]");
            }
            g.past_len = pk[2].clone();
        }
        if let Some(m) = self.mask_index() {
            if shapes[m].len() > 4 || shapes[m].is_empty() {
                bail!(
                    "attn_mask must have rank 1 to 4, got rank {}",
                    shapes[m].len()
                );
            }
        }
        Ok(g)
    }

    /// Output shapes of the wired outputs, in order.
    fn output_shapes(&self, shapes: &[&[TDim]]) -> TractResult<TVec<TVec<TDim>>> {
        let g = self.geometry(shapes)?;
        let total = g.past_len.clone() + g.kv_len.clone();
        let mut out = tvec![];
        out.push(if g.rank == 3 {
            tvec![
                g.batch.clone(),
                g.q_len.clone(),
                g.q_heads.clone() * g.v_head.clone()
            ]
        } else {
            tvec![
                g.batch.clone(),
                g.q_heads.clone(),
                g.q_len.clone(),
                g.v_head.clone()
            ]
        });
        if self.outputs[1] {
            out.push(tvec![
                g.batch.clone(),
                g.kv_heads.clone(),
                total.clone(),
                g.head.clone()
            ]);
        }
        if self.outputs[2] {
            out.push(tvec![
                g.batch.clone(),
                g.kv_heads.clone(),
                total.clone(),
                g.v_head.clone()
            ]);
        }
        if self.outputs[3] {
            out.push(tvec![g.batch, g.q_heads, g.q_len, total]);
        }
        Ok(out)
    }
}

fn check_float(dt: DatumType, what: &str) -> TractResult<()> {
    if dt != DatumType::F32 && dt != DatumType::F16 {
        bail!("{what} has element type {dt:?}; attnrt's Attention supports float32 and float16");
    }
    Ok(())
}

impl Expansion for AttentionOp {
    fn name(&self) -> StaticName {
        "AttnrtAttention".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: causal={} scale={:?} softcap={} qk_mode={}",
            self.node, self.is_causal, self.scale, self.softcap, self.qk_mode
        )])
    }

    fn nboutputs(&self) -> TractResult<usize> {
        Ok(self.output_count())
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        check_input_arity(inputs, self.input_count())?;
        check_output_arity(outputs, self.output_count())?;
        for o in outputs {
            s.equals(&inputs[0].datum_type, &o.datum_type)?;
        }
        s.equals(&inputs[0].datum_type, &inputs[1].datum_type)?;
        s.equals(&inputs[0].datum_type, &inputs[2].datum_type)?;
        s.equals(&inputs[0].rank, &outputs[0].rank)?;
        for o in &outputs[1..] {
            s.equals(&o.rank, 4)?;
        }
        s.given_all(
            inputs.iter().map(|i| &i.shape),
            move |s, shapes: Vec<TVec<TDim>>| {
                let refs: Vec<&[TDim]> = shapes.iter().map(|s| s.as_slice()).collect();
                let outs = self
                    .output_shapes(&refs)
                    .with_context(|| format!("Attention node '{}'", self.node))?;
                for (o, shape) in outputs.iter().zip(outs) {
                    s.equals(&o.shape, ShapeFactoid::from(shape))?;
                }
                Ok(())
            },
        )
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        model.wire_node(prefix, AttentionKernelOp(self.clone()), inputs)
    }
}

/// The typed (runnable) form of [`AttentionOp`]: evaluates on attnrt's kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionKernelOp(pub AttentionOp);

impl Op for AttentionKernelOp {
    fn name(&self) -> StaticName {
        "AttnrtAttention".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("node {}", self.0.node)])
    }

    op_as_typed_op!();
}

impl EvalOp for AttentionKernelOp {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        eval_attention(&self.0, &inputs)
            .with_context(|| format!("Attention node '{}'", self.0.node))
    }
}

impl TypedOp for AttentionKernelOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let op = &self.0;
        let ctx = || format!("Attention node '{}'", op.node);
        if inputs.len() != op.input_count() {
            bail!(
                "{}: expected {} inputs, got {}",
                ctx(),
                op.input_count(),
                inputs.len()
            );
        }
        let dt = inputs[0].datum_type;
        check_float(dt, "Q").with_context(ctx)?;
        for (i, what) in [(1, "K"), (2, "V")] {
            if inputs[i].datum_type != dt {
                bail!(
                    "{}: {what} is {:?} but Q is {dt:?}",
                    ctx(),
                    inputs[i].datum_type
                );
            }
        }
        if let Some(m) = op.mask_index() {
            let mdt = inputs[m].datum_type;
            if mdt != DatumType::Bool && mdt != dt {
                bail!(
                    "{}: attn_mask is {mdt:?}; it must be bool or the type of Q ({dt:?})",
                    ctx()
                );
            }
        }
        if let Some(p) = op.past_index() {
            for (i, what) in [(p, "past_key"), (p + 1, "past_value")] {
                if inputs[i].datum_type != dt {
                    bail!(
                        "{}: {what} is {:?} but Q is {dt:?}",
                        ctx(),
                        inputs[i].datum_type
                    );
                }
            }
        }
        let shapes: Vec<&[TDim]> = inputs.iter().map(|f| f.shape.dims()).collect();
        let outs = op.output_shapes(&shapes).with_context(ctx)?;
        Ok(outs.into_iter().map(|s| dt.fact(s)).collect())
    }
}

/// One input as f32 data with its shape: borrowed when it already is f32, converted (f16)
/// otherwise.
struct F32Input<'a> {
    data: std::borrow::Cow<'a, [f32]>,
    shape: Vec<usize>,
}

fn to_f32<'a>(t: &'a Tensor, what: &str) -> TractResult<F32Input<'a>> {
    let data = if t.datum_type() == DatumType::F32 {
        std::borrow::Cow::Borrowed(t.try_as_plain_ram()?.as_slice::<f32>()?)
    } else {
        let c = t
            .cast_to::<f32>()
            .with_context(|| format!("converting {what} to float32"))?;
        std::borrow::Cow::Owned(c.try_as_plain_ram()?.as_slice::<f32>()?.to_vec())
    };
    Ok(F32Input {
        data,
        shape: t.shape().to_vec(),
    })
}

fn dims4(shape: &[usize], what: &str) -> TractResult<[usize; 4]> {
    shape
        .try_into()
        .map_err(|_| anyhow!("{what} must be 4-D, got shape {shape:?}"))
}

/// Row-major strides of a 4-D shape, in elements.
fn strides4(d: [usize; 4]) -> [isize; 4] {
    [
        (d[1] * d[2] * d[3]) as isize,
        (d[2] * d[3]) as isize,
        d[3] as isize,
        1,
    ]
}

/// Q/K/V seen as `[B, H, L, D]` strided views over their own buffers.
fn heads_view<'a>(x: &'a F32Input<'_>, heads: usize, what: &str) -> TractResult<View4<'a, f32>> {
    match x.shape.len() {
        3 => {
            let [b, l, hidden] = [x.shape[0], x.shape[1], x.shape[2]];
            if heads == 0 || hidden % heads != 0 {
                bail!("{what} hidden size {hidden} is not a multiple of {heads} heads");
            }
            Ok(View4::from_bshd(&x.data, b, l, heads, hidden / heads)?)
        }
        4 => Ok(View4::contiguous(&x.data, dims4(&x.shape, what)?)?),
        r => bail!("{what} must be 3-D or 4-D, got rank {r}"),
    }
}

/// `concat([past, cur], axis=2)` into a fresh contiguous `[B, H, P+L, D]` buffer.
fn concat_seq(
    past: &F32Input<'_>,
    cur: &View4<f32>,
    what: &str,
) -> TractResult<(Vec<f32>, [usize; 4])> {
    let pd = dims4(&past.shape, what)?;
    let cd = cur.dims;
    if pd[0] != cd[0] || pd[1] != cd[1] || pd[3] != cd[3] {
        bail!(
            "{what} has shape {pd:?}, which does not fit the current [B, heads, L, head_size] = {cd:?}"
        );
    }
    let total = pd[2] + cd[2];
    let dims = [cd[0], cd[1], total, cd[3]];
    let mut out = Vec::with_capacity(dims.iter().product());
    for b in 0..cd[0] {
        for h in 0..cd[1] {
            let start = (b * pd[1] + h) * pd[2] * pd[3];
            out.extend_from_slice(&past.data[start..start + pd[2] * pd[3]]);
            for l in 0..cd[2] {
                for d in 0..cd[3] {
                    let off = b as isize * cur.strides[0]
                        + h as isize * cur.strides[1]
                        + l as isize * cur.strides[2]
                        + d as isize * cur.strides[3];
                    out.push(cur.data[off as usize]);
                }
            }
        }
    }
    Ok((out, dims))
}

/// A strided view copied into a contiguous `[B, H, L, D]` buffer (for `present_*` without past).
fn materialize(v: &View4<f32>) -> Vec<f32> {
    let d = v.dims;
    let mut out = Vec::with_capacity(d.iter().product());
    for a in 0..d[0] {
        for b in 0..d[1] {
            for c in 0..d[2] {
                for e in 0..d[3] {
                    let off = a as isize * v.strides[0]
                        + b as isize * v.strides[1]
                        + c as isize * v.strides[2]
                        + e as isize * v.strides[3];
                    out.push(v.data[off as usize]);
                }
            }
        }
    }
    out
}

/// Broadcast strides of a mask of rank ≤ 4 aligned right onto `[B, Hq, Lq, Lk]`: extent-1 axes
/// get stride 0. The key axis keeps its extent (the kernel pads a shorter one with `−inf`, as
/// the ONNX reference does), so it is checked, not broadcast.
fn mask_geometry(shape: &[usize], target: [usize; 4]) -> TractResult<([usize; 4], [isize; 4])> {
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

fn output_tensor(data: Vec<f32>, shape: &[usize], dt: DatumType) -> TractResult<TValue> {
    let t = Tensor::from(ndarray::ArrayD::from_shape_vec(shape.to_vec(), data)?);
    let t = if dt == DatumType::F32 {
        t
    } else {
        t.cast_to_dt(dt)?.into_owned()
    };
    Ok(t.into_tvalue())
}

fn eval_attention(op: &AttentionOp, inputs: &[TValue]) -> TractResult<TVec<TValue>> {
    if inputs.len() != op.input_count() {
        bail!("expected {} inputs, got {}", op.input_count(), inputs.len());
    }
    let dt = inputs[0].datum_type();
    check_float(dt, "Q")?;
    let q = to_f32(&inputs[0], "Q")?;
    let k = to_f32(&inputs[1], "K")?;
    let v = to_f32(&inputs[2], "V")?;
    let rank = q.shape.len();
    if k.shape.len() != rank || v.shape.len() != rank {
        bail!(
            "Q, K and V must have the same rank: {:?}, {:?}, {:?}",
            q.shape,
            k.shape,
            v.shape
        );
    }
    let (q_heads, kv_heads) = match rank {
        3 => (
            op.q_num_heads
                .context("3-D inputs need the q_num_heads attribute")?,
            op.kv_num_heads
                .context("3-D inputs need the kv_num_heads attribute")?,
        ),
        4 => (q.shape[1], k.shape[1]),
        r => bail!("Q, K and V must be 3-D or 4-D, got rank {r}"),
    };
    let qv = heads_view(&q, q_heads, "Q")?;
    let kv = heads_view(&k, kv_heads, "K")?;
    let vv = heads_view(&v, kv_heads, "V")?;
    let [batch, _, q_len, head] = qv.dims;
    let v_head = vv.dims[3];

    // past + current along the sequence axis; these buffers are also present_key/value.
    let past = op.past_index().map(|p| -> TractResult<_> {
        Ok((
            to_f32(&inputs[p], "past_key")?,
            to_f32(&inputs[p + 1], "past_value")?,
        ))
    });
    let past = past.transpose()?;
    let (k_all, v_all, past_len) = match &past {
        Some((pk, pv)) => {
            let (kd, kdims) = concat_seq(pk, &kv, "past_key")?;
            let (vd, vdims) = concat_seq(pv, &vv, "past_value")?;
            (Some((kd, kdims)), Some((vd, vdims)), pk.shape[2])
        }
        None => (None, None, 0),
    };
    let k_view = match &k_all {
        Some((d, dims)) => View4::contiguous(d, *dims)?,
        None => kv,
    };
    let v_view = match &v_all {
        Some((d, dims)) => View4::contiguous(d, *dims)?,
        None => vv,
    };
    let total = k_view.dims[2];

    // The mask, as bool or f32, broadcast by strides.
    let mask_input = op.mask_index().map(|m| &inputs[m]);
    let mask_f32;
    let mask_bool;
    let mask = match mask_input {
        None => Mask::None,
        Some(m) => {
            let (dims, strides) = mask_geometry(m.shape(), [batch, q_heads, q_len, total])?;
            if m.datum_type() == DatumType::Bool {
                mask_bool = m.try_as_plain_ram()?.as_slice::<bool>()?.to_vec();
                Mask::Boolean(View4::new(&mask_bool, dims, strides)?)
            } else if m.datum_type() == dt {
                mask_f32 = to_f32(m, "attn_mask")?;
                Mask::Additive(View4::new(&mask_f32.data[..], dims, strides)?)
            } else {
                bail!(
                    "attn_mask is {:?}; it must be bool or {dt:?}",
                    m.datum_type()
                );
            }
        }
    };

    let params = AttentionParams {
        scale: op
            .scale
            .unwrap_or_else(|| AttentionParams::default_scale(head)),
        causal: op.is_causal.then_some(past_len as isize),
        softcap: (op.softcap > 0.0).then_some(op.softcap),
    };

    // Y, written by the kernel straight into the output layout (3-D: [B, Lq, Hq·Dv]).
    let y_len = batch * q_heads * q_len * v_head;
    let mut y = vec![0f32; y_len];
    let y_shape: Vec<usize> = if rank == 3 {
        let mut out = ViewMut4::from_bshd(&mut y, batch, q_len, q_heads, v_head)?;
        attnrt_kernels::attention(&qv, &k_view, &v_view, &mask, &params, &mut out)?;
        vec![batch, q_len, q_heads * v_head]
    } else {
        let dims = [batch, q_heads, q_len, v_head];
        let mut out = ViewMut4::contiguous(&mut y, dims)?;
        attnrt_kernels::attention(&qv, &k_view, &v_view, &mask, &params, &mut out)?;
        dims.to_vec()
    };

    // qk_matmul_output first: it borrows the concatenated K that becomes present_key below.
    let scores = if op.outputs[3] {
        // The onnx reference implementation (which produced the conformance data) reports the
        // soft-capped scores for mode 0 when softcap is set; follow it.
        let stage = match op.qk_mode {
            0 if params.softcap.is_some() => ScoreStage::Softcapped,
            m => ScoreStage::from_onnx_mode(m)
                .with_context(|| format!("qk_matmul_output_mode {m} is not 0–3"))?,
        };
        Some(reference::scores(&qv, &k_view, &mask, &params, stage)?)
    } else {
        None
    };
    let mut results = tvec![output_tensor(y, &y_shape, dt)?];
    if op.outputs[1] {
        let (data, dims) = match k_all {
            Some((d, dims)) => (d, dims),
            None => (materialize(&kv), kv.dims),
        };
        results.push(output_tensor(data, &dims, dt)?);
    }
    if op.outputs[2] {
        let (data, dims) = match v_all {
            Some((d, dims)) => (d, dims),
            None => (materialize(&vv), vv.dims),
        };
        results.push(output_tensor(data, &dims, dt)?);
    }
    if let Some(scores) = scores {
        results.push(output_tensor(scores, &[batch, q_heads, q_len, total], dt)?);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_geometry_broadcasts_leading_axes_and_checks_keys() {
        let (d, s) = mask_geometry(&[2, 1, 1, 5], [2, 4, 3, 5]).unwrap();
        assert_eq!(d, [2, 1, 1, 5]);
        assert_eq!(s, [5, 0, 0, 1]);
        let (d, s) = mask_geometry(&[3, 5], [2, 4, 3, 5]).unwrap();
        assert_eq!(d, [1, 1, 3, 5]);
        assert_eq!(s, [0, 0, 5, 1]);
        // A shorter key axis is allowed (padded with -inf by the kernel), a longer one is not.
        assert!(mask_geometry(&[3, 4], [2, 4, 3, 5]).is_ok());
        assert!(mask_geometry(&[3, 6], [2, 4, 3, 5]).is_err());
        assert!(mask_geometry(&[2, 2, 3, 5], [2, 4, 3, 5]).is_err());
        assert!(mask_geometry(&[1, 1, 1, 1, 5], [2, 4, 3, 5]).is_err());
    }

    #[test]
    fn concat_appends_current_after_past() {
        let past = F32Input {
            data: vec![1.0, 2.0].into(),
            shape: vec![1, 1, 1, 2],
        };
        let cur_data = [3.0, 4.0, 5.0, 6.0];
        let cur = View4::contiguous(&cur_data, [1, 1, 2, 2]).unwrap();
        let (d, dims) = concat_seq(&past, &cur, "past_key").unwrap();
        assert_eq!(dims, [1, 1, 3, 2]);
        assert_eq!(d, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }
}
