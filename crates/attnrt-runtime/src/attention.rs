//! The ONNX `Attention` operator (opsets 23 and 24, with the post-release errata) on attnrt's
//! kernel.
//!
//! tract-onnx's op register is keyed by `op_type` only (the domain is ignored) and a later insert
//! replaces the built-in builder, so [`register`] makes every `Attention` node — the ones
//! attnrt's fusion emits and the ones exporters already wrote — run here.
//!
//! What this module owns is the ONNX-level part of the op: 3-D ↔ 4-D layouts (as strided views,
//! no transpose is materialised), attribute defaults, `past_key`/`past_value` concatenation into
//! `present_key`/`present_value`, mask broadcasting, the opset-24 `nonpad_kv_seqlen` padding
//! input, f16 ↔ f32, and `qk_matmul_output`. The arithmetic itself is
//! `attnrt_kernels::attention` (flash-style) and, only for the optional `qk_matmul_output`,
//! `attnrt_kernels::reference::scores`.
//!
//! Memory: f32 inputs are read in place from tract's tensors (no copy), the kernel writes `Y`
//! straight into the output tensor, and `present_*` are built directly in their output tensors;
//! the only other buffers are the f32 conversions of f16 inputs/outputs and the kernel's own
//! per-thread scratch. `nonpad_kv_seqlen` costs nothing: each batch runs on its first
//! `nonpad_kv_seqlen[b]` keys (views cut short), never an `Lq×Lk` mask.
//!
//! Everything the op cannot do exactly is refused with an error naming the node, never
//! approximated: unknown attributes (e.g. the opset-25 window sizes), element types other than
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

/// Attributes of opsets 23 and 24 (all optional, the same in both). Anything else is refused
/// rather than ignored.
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
    /// `nonpad_kv_seqlen` (opset 24) is wired: per batch, the number of leading keys that are
    /// not padding.
    pub has_nonpad: bool,
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
                "attribute '{}' is not part of ONNX Attention-23/24; attnrt does not implement it",
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
    if node.input.len() > SLOT_NONPAD + 1 {
        bail!(
            "has {} inputs; Attention has at most {}",
            node.input.len(),
            SLOT_NONPAD + 1
        );
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
    let has_nonpad = wired(&node.input, SLOT_NONPAD);
    // Attention-24: `nonpad_kv_seqlen` describes an external (static) cache, so the internal
    // cache inputs/outputs must not be used with it (shape inference fails in onnx, the
    // reference implementation raises).
    if has_nonpad && (has_past_key || outputs[1] || outputs[2]) {
        bail!(
            "input nonpad_kv_seqlen cannot be combined with past_key/past_value or \
             present_key/present_value (ONNX Attention-24)"
        );
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
        has_nonpad,
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
    /// Number of wired inputs in tract's (compacted) order: Q, K, V, [mask], [past_k, past_v],
    /// [nonpad_kv_seqlen].
    fn input_count(&self) -> usize {
        3 + self.has_mask as usize + 2 * self.has_past as usize + self.has_nonpad as usize
    }

    fn mask_index(&self) -> Option<usize> {
        self.has_mask.then_some(3)
    }

    fn past_index(&self) -> Option<usize> {
        self.has_past.then_some(3 + self.has_mask as usize)
    }

    fn nonpad_index(&self) -> Option<usize> {
        self.has_nonpad
            .then_some(3 + self.has_mask as usize + 2 * self.has_past as usize)
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
        if let Some(n) = self.nonpad_index() {
            let shape = shapes[n];
            if shape.len() != 1 {
                bail!("input nonpad_kv_seqlen must be 1-D [batch], got shape {shape:?}");
            }
            if let (Ok(a), Ok(b)) = (shape[0].to_i64(), g.batch.to_i64()) {
                if a != b {
                    bail!("input nonpad_kv_seqlen has {a} values but the batch size is {b}");
                }
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
        OP_NAME.into()
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

/// The name under which [`AttentionKernelOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtAttention";

/// The typed (runnable) form of [`AttentionOp`]: evaluates on attnrt's kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionKernelOp(pub AttentionOp);

impl Op for AttentionKernelOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
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
        if let Some(n) = op.nonpad_index() {
            if inputs[n].datum_type != DatumType::I64 {
                bail!(
                    "{}: input nonpad_kv_seqlen is {:?}; ONNX Attention-24 requires int64",
                    ctx(),
                    inputs[n].datum_type
                );
            }
        }
        let shapes: Vec<&[TDim]> = inputs.iter().map(|f| f.shape.dims()).collect();
        let outs = op.output_shapes(&shapes).with_context(ctx)?;
        Ok(outs.into_iter().map(|s| dt.fact(s)).collect())
    }
}

/// One input as f32: tract's own tensor, borrowed in place, when it already is f32; a converted
/// copy otherwise (f16). No other copy is made of an input.
struct F32Input<'a> {
    tensor: std::borrow::Cow<'a, Tensor>,
}

impl F32Input<'_> {
    fn data(&self) -> TractResult<&[f32]> {
        self.tensor.try_as_plain_ram()?.as_slice::<f32>()
    }

    fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }
}

fn to_f32<'a>(t: &'a Tensor, what: &str) -> TractResult<F32Input<'a>> {
    // `cast_to` borrows when the type already matches.
    let tensor = t
        .cast_to::<f32>()
        .with_context(|| format!("converting {what} to float32"))?;
    Ok(F32Input { tensor })
}

/// A zero-filled f32 tensor: outputs are allocated once, in their final place, and written by
/// the kernel or the copies below (zeroing rather than leaving them uninitialised keeps every
/// element defined whatever the writer does).
fn f32_output(shape: &[usize]) -> TractResult<Tensor> {
    Tensor::zero::<f32>(shape)
}

fn f32_data_mut(t: &mut Tensor) -> TractResult<&mut [f32]> {
    t.to_plain_array_view_mut::<f32>()?
        .into_slice()
        .context("an output tensor is not contiguous")
}

/// The output value in the node's element type (f16 outputs are converted from f32 once).
fn finish_output(t: Tensor, dt: DatumType) -> TractResult<TValue> {
    let t = if dt == DatumType::F32 {
        t
    } else {
        t.cast_to_dt(dt)?.into_owned()
    };
    Ok(t.into_tvalue())
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
fn heads_view<'a>(
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
fn y_view(
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

/// Copies the strided view `v` into the contiguous `[B, H, T, D]` buffer `out`, at sequence
/// positions `seq_offset..seq_offset + L`.
fn copy_into_seq(v: &View4<f32>, out: &mut [f32], total: usize, seq_offset: usize) {
    let [b_n, h_n, l_n, d_n] = v.dims;
    let src_off = |b: usize, h: usize, l: usize, d: usize| {
        (b as isize * v.strides[0]
            + h as isize * v.strides[1]
            + l as isize * v.strides[2]
            + d as isize * v.strides[3]) as usize
    };
    for b in 0..b_n {
        for h in 0..h_n {
            for l in 0..l_n {
                let dst = ((b * h_n + h) * total + seq_offset + l) * d_n;
                let row = &mut out[dst..dst + d_n];
                if v.strides[3] == 1 && d_n > 0 {
                    let s = src_off(b, h, l, 0);
                    row.copy_from_slice(&v.data[s..s + d_n]);
                } else {
                    for (d, x) in row.iter_mut().enumerate() {
                        *x = v.data[src_off(b, h, l, d)];
                    }
                }
            }
        }
    }
}

/// `present = concat([past, cur], axis=2)` built directly in a new `[B, H, P+L, D]` f32 tensor
/// (without `past`, `present` is `cur` in the 4-D layout).
fn present_tensor(
    past: Option<&F32Input<'_>>,
    cur: &View4<f32>,
    what: &str,
) -> TractResult<Tensor> {
    let cd = cur.dims;
    let past_view = match past {
        None => None,
        Some(p) => {
            let pd = dims4(p.shape(), what)?;
            if pd[0] != cd[0] || pd[1] != cd[1] || pd[3] != cd[3] {
                bail!(
                    "{what} has shape {pd:?}, which does not fit the current [B, heads, L, head_size] = {cd:?}"
                );
            }
            Some(View4::contiguous(p.data()?, pd)?)
        }
    };
    let past_len = past_view.as_ref().map_or(0, |p| p.dims[2]);
    let total = past_len + cd[2];
    let mut t = f32_output(&[cd[0], cd[1], total, cd[3]])?;
    let out = f32_data_mut(&mut t)?;
    if let Some(p) = &past_view {
        copy_into_seq(p, out, total, 0);
    }
    copy_into_seq(cur, out, total, past_len);
    Ok(t)
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

/// The opset-24 `nonpad_kv_seqlen` input, checked: int64, shape `[batch]`, every value in
/// `0..=kv_len`. Returns the per-batch counts of valid (leading) keys.
fn nonpad_lengths(t: &Tensor, batch: usize, kv_len: usize) -> TractResult<Vec<usize>> {
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
fn batch_view<'a, T>(
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
fn batch_mask<'a>(m: &Mask<'a>, b: usize, keys: usize) -> TractResult<Mask<'a>> {
    Ok(match m {
        Mask::None => Mask::None,
        Mask::Additive(v) => Mask::Additive(batch_view(v, b, Some((3, keys)))?),
        Mask::Boolean(v) => Mask::Boolean(batch_view(v, b, Some((3, keys)))?),
    })
}

/// The inputs of one `Attention` evaluation, as the kernel sees them.
struct Problem<'a> {
    q: View4<'a, f32>,
    k: View4<'a, f32>,
    v: View4<'a, f32>,
    mask: Mask<'a>,
    /// Scale and softcap; `causal` is set per call.
    params: AttentionParams,
    is_causal: bool,
    /// Keys before the current ones (`past_key`), the causal offset without `nonpad_kv_seqlen`.
    past_len: usize,
    /// Per batch, the number of valid leading keys (`nonpad_kv_seqlen`).
    nonpad: Option<Vec<usize>>,
}

impl Problem<'_> {
    /// Kernel parameters for a call whose causal offset is `offset`.
    fn params(&self, offset: isize) -> AttentionParams {
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
    fn run(&self, y: &mut [f32], rank: usize) -> TractResult<()> {
        let [batch, q_heads, q_len, _] = self.q.dims;
        let v_head = self.v.dims[3];
        let Some(lens) = &self.nonpad else {
            let mut out = y_view(y, rank, [batch, q_heads, q_len, v_head])?;
            let params = self.params(self.past_len as isize);
            attnrt_kernels::attention(&self.q, &self.k, &self.v, &self.mask, &params, &mut out)?;
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
            attnrt_kernels::attention(&q, &k, &v, &mask, &params, &mut out)
                .with_context(|| format!("batch {b} (nonpad_kv_seqlen {n})"))?;
        }
        Ok(())
    }

    /// `qk_matmul_output` `[B, Hq, Lq, total]` at `stage`, written into `out` (zero-filled).
    fn scores(&self, stage: ScoreStage, out: &mut [f32]) -> TractResult<()> {
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

fn eval_attention(op: &AttentionOp, inputs: &[TValue]) -> TractResult<TVec<TValue>> {
    if inputs.len() != op.input_count() {
        bail!("expected {} inputs, got {}", op.input_count(), inputs.len());
    }
    let dt = inputs[0].datum_type();
    check_float(dt, "Q")?;
    let q = to_f32(&inputs[0], "Q")?;
    let k = to_f32(&inputs[1], "K")?;
    let v = to_f32(&inputs[2], "V")?;
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
    let qv = heads_view(q.data()?, q.shape(), q_heads, "Q")?;
    let kv = heads_view(k.data()?, k.shape(), kv_heads, "K")?;
    let vv = heads_view(v.data()?, v.shape(), kv_heads, "V")?;
    let [batch, _, q_len, head] = qv.dims;

    // present_key/value = past ++ current, built in their output tensors; with a past they are
    // also what the kernel reads (a temporary only when the node does not output them).
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
        .then(|| present_tensor(past.as_ref().map(|p| &p.0), &kv, "past_key"))
        .transpose()?;
    let present_v = (past.is_some() || op.outputs[2])
        .then(|| present_tensor(past.as_ref().map(|p| &p.1), &vv, "past_value"))
        .transpose()?;
    let k_view = match (&past, &present_k) {
        (Some(_), Some(t)) => View4::contiguous(
            t.try_as_plain_ram()?.as_slice::<f32>()?,
            dims4(t.shape(), "present_key")?,
        )?,
        _ => kv,
    };
    let v_view = match (&past, &present_v) {
        (Some(_), Some(t)) => View4::contiguous(
            t.try_as_plain_ram()?.as_slice::<f32>()?,
            dims4(t.shape(), "present_value")?,
        )?,
        _ => vv,
    };
    let total = k_view.dims[2];

    // The mask, as bool or f32 (borrowed from tract's tensor), broadcast by strides.
    let mask_f32;
    let mask = match op.mask_index().map(|m| &inputs[m]) {
        None => Mask::None,
        Some(m) => {
            let (dims, strides) = mask_geometry(m.shape(), [batch, q_heads, q_len, total])?;
            if m.datum_type() == DatumType::Bool {
                let data = m.try_as_plain_ram()?.as_slice::<bool>()?;
                Mask::Boolean(View4::new(data, dims, strides)?)
            } else if m.datum_type() == dt {
                mask_f32 = to_f32(m, "attn_mask")?;
                Mask::Additive(View4::new(mask_f32.data()?, dims, strides)?)
            } else {
                bail!(
                    "attn_mask is {:?}; it must be bool or {dt:?}",
                    m.datum_type()
                );
            }
        }
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
        past_len,
        nonpad,
    };

    // Y, written by the kernel straight into the output tensor (3-D: [B, Lq, Hq·Dv]).
    let v_head = problem.v.dims[3];
    let y_shape: Vec<usize> = if rank == 3 {
        vec![batch, q_len, q_heads * v_head]
    } else {
        vec![batch, q_heads, q_len, v_head]
    };
    let mut y = f32_output(&y_shape)?;
    problem.run(f32_data_mut(&mut y)?, rank)?;

    let scores = if op.outputs[3] {
        // The onnx reference implementation (which produced the conformance data) reports the
        // soft-capped scores for mode 0 when softcap is set; follow it.
        let stage = match op.qk_mode {
            0 if problem.params.softcap.is_some() => ScoreStage::Softcapped,
            m => ScoreStage::from_onnx_mode(m)
                .with_context(|| format!("qk_matmul_output_mode {m} is not 0–3"))?,
        };
        let mut t = f32_output(&[batch, q_heads, q_len, total])?;
        problem.scores(stage, f32_data_mut(&mut t)?)?;
        Some(t)
    } else {
        None
    };
    // Ends the borrows of `present_k`/`present_v` before they move into the outputs.
    drop(problem);

    let mut results = tvec![finish_output(y, dt)?];
    if op.outputs[1] {
        results.push(finish_output(
            present_k.context("present_key was not built")?,
            dt,
        )?);
    }
    if op.outputs[2] {
        results.push(finish_output(
            present_v.context("present_value was not built")?,
            dt,
        )?);
    }
    if let Some(scores) = scores {
        results.push(finish_output(scores, dt)?);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_kernels::reference;

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
    fn present_appends_current_after_past() {
        let past = Tensor::from_shape(&[1, 1, 1, 2], &[1.0f32, 2.0]).unwrap();
        let past = to_f32(&past, "past_key").unwrap();
        let cur_data = [3.0, 4.0, 5.0, 6.0];
        let cur = View4::contiguous(&cur_data, [1, 1, 2, 2]).unwrap();
        let t = present_tensor(Some(&past), &cur, "past_key").unwrap();
        assert_eq!(t.shape(), &[1, 1, 3, 2]);
        assert_eq!(f32s(&t), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        // Without a past, present is the current keys in the 4-D layout: a 3-D [B, L, H·D]
        // view (B=1, L=2, H=2, D=1) comes out as [B, H, L, D].
        let cur = View4::from_bshd(&cur_data, 1, 2, 2, 1).unwrap();
        let t = present_tensor(None, &cur, "past_key").unwrap();
        assert_eq!(t.shape(), &[1, 2, 2, 1]);
        assert_eq!(f32s(&t), &[3.0, 5.0, 4.0, 6.0]);
    }

    fn f32s(t: &Tensor) -> &[f32] {
        t.try_as_plain_ram().unwrap().as_slice::<f32>().unwrap()
    }

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn tensor(shape: &[usize], seed: u64) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_shape(shape, &values(n, seed)).unwrap()
    }

    fn nonpad(lens: &[i64]) -> Tensor {
        Tensor::from_shape(&[lens.len()], lens).unwrap()
    }

    fn op(has_mask: bool, is_causal: bool, qk_mode: i64, with_scores: bool) -> AttentionOp {
        AttentionOp {
            node: "attn".into(),
            q_num_heads: None,
            kv_num_heads: None,
            scale: None,
            is_causal,
            softcap: 0.0,
            qk_mode,
            has_mask,
            has_past: false,
            has_nonpad: true,
            outputs: [true, false, false, with_scores],
        }
    }

    fn run(op: &AttentionOp, inputs: Vec<Tensor>) -> TractResult<Vec<Vec<f32>>> {
        let inputs: Vec<TValue> = inputs.into_iter().map(|t| t.into_tvalue()).collect();
        Ok(eval_attention(op, &inputs)?
            .iter()
            .map(|t| f32s(t).to_vec())
            .collect())
    }

    // Geometry of the nonpad tests: GQA (4 q-heads on 2 kv-heads), Lq < Lk, Dv != D; batch 0
    // has no valid key, batch 1 fewer valid keys than queries (negative causal offset), batch 2
    // every key valid.
    const B: usize = 3;
    const HQ: usize = 4;
    const HKV: usize = 2;
    const LQ: usize = 3;
    const LK: usize = 5;
    const D: usize = 8;
    const DV: usize = 6;
    const LENS: [i64; B] = [0, 2, 5];

    /// The ONNX Attention-24 bias written out in full, `[B, 1, LQ, LK]`: the user's additive
    /// mask (`[B, 1, LQ, LK]`), plus `−inf` for padding keys `j ≥ n_b`, plus (causal) `−inf`
    /// where `j > i + n_b − LQ`.
    fn explicit_bias(user: Option<&[f32]>, causal: bool) -> Vec<f32> {
        let mut bias = vec![0f32; B * LQ * LK];
        for (b, &n) in LENS.iter().enumerate() {
            for i in 0..LQ {
                for j in 0..LK {
                    let at = (b * LQ + i) * LK + j;
                    let mut x = user.map_or(0.0, |u| u[at]);
                    if j as i64 >= n || (causal && j as i64 > i as i64 + n - LQ as i64) {
                        x = f32::NEG_INFINITY;
                    }
                    bias[at] = x;
                }
            }
        }
        bias
    }

    fn expected_y(q: &Tensor, k: &Tensor, v: &Tensor, bias: &[f32]) -> Vec<f32> {
        let q = View4::contiguous(f32s(q), [B, HQ, LQ, D]).unwrap();
        let k = View4::contiguous(f32s(k), [B, HKV, LK, D]).unwrap();
        let v = View4::contiguous(f32s(v), [B, HKV, LK, DV]).unwrap();
        let mask = View4::new(
            bias,
            [B, 1, LQ, LK],
            [(LQ * LK) as isize, 0, LK as isize, 1],
        )
        .unwrap();
        let mut y = vec![f32::NAN; B * HQ * LQ * DV];
        let mut out = ViewMut4::contiguous(&mut y, [B, HQ, LQ, DV]).unwrap();
        let params = AttentionParams::new(AttentionParams::default_scale(D));
        reference::attention(&q, &k, &v, &Mask::Additive(mask), &params, &mut out).unwrap();
        y
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let same_inf = g.is_infinite() && g == w;
            assert!(
                same_inf || (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                "{what}: element {i}: got {g}, want {w}"
            );
        }
    }

    #[test]
    fn nonpad_kv_seqlen_matches_an_explicit_padding_mask() {
        let (q, k, v) = (
            tensor(&[B, HQ, LQ, D], 1),
            tensor(&[B, HKV, LK, D], 2),
            tensor(&[B, HKV, LK, DV], 3),
        );
        let user = values(B * LQ * LK, 4);
        for causal in [false, true] {
            for with_mask in [false, true] {
                let what = format!("causal={causal} mask={with_mask}");
                let mut inputs = vec![q.clone(), k.clone(), v.clone()];
                if with_mask {
                    inputs.push(Tensor::from_shape(&[B, 1, LQ, LK], &user).unwrap());
                }
                inputs.push(nonpad(&LENS));
                let got = run(&op(with_mask, causal, 0, false), inputs).unwrap();
                let bias = explicit_bias(with_mask.then_some(&user[..]), causal);
                let want = expected_y(&q, &k, &v, &bias);
                assert_close(&got[0], &want, &what);
                // Batch 0 has no valid key: every row is fully masked, so Y is 0 (errata).
                let per_batch = HQ * LQ * DV;
                assert!(got[0][..per_batch].iter().all(|x| *x == 0.0), "{what}");
                // Batch 1, causal: offset 2 − 3 = −1 leaves query 0 without a key.
                if causal {
                    for h in 0..HQ {
                        let row = per_batch + h * LQ * DV;
                        assert!(got[0][row..row + DV].iter().all(|x| *x == 0.0), "{what}");
                    }
                }
                // Batch 2 is all valid: the same as without nonpad_kv_seqlen (and, for causal,
                // offset LK − LQ, i.e. the bottom-right alignment of a past of LK − LQ keys).
                assert!(got[0][2 * per_batch..].iter().any(|x| *x != 0.0), "{what}");
            }
        }
    }

    #[test]
    fn nonpad_kv_seqlen_with_all_keys_valid_is_a_no_op() {
        let (q, k, v) = (
            tensor(&[B, HQ, LQ, D], 5),
            tensor(&[B, HKV, LK, D], 6),
            tensor(&[B, HKV, LK, DV], 7),
        );
        let mask: Vec<bool> = values(B * LQ * LK, 8).iter().map(|x| *x > -0.5).collect();
        let mask = Tensor::from_shape(&[B, 1, LQ, LK], &mask).unwrap();
        let with = run(
            &op(true, false, 0, false),
            vec![
                q.clone(),
                k.clone(),
                v.clone(),
                mask.clone(),
                nonpad(&[5, 5, 5]),
            ],
        )
        .unwrap();
        let mut plain = op(true, false, 0, false);
        plain.has_nonpad = false;
        let without = run(&plain, vec![q, k, v, mask]).unwrap();
        assert_eq!(with[0], without[0]);
    }

    #[test]
    fn nonpad_kv_seqlen_qk_matmul_output_modes() {
        let (q, k, v) = (
            tensor(&[B, HQ, LQ, D], 9),
            tensor(&[B, HKV, LK, D], 10),
            tensor(&[B, HKV, LK, DV], 11),
        );
        let bias = explicit_bias(None, true);
        let qv = View4::contiguous(f32s(&q), [B, HQ, LQ, D]).unwrap();
        let kv = View4::contiguous(f32s(&k), [B, HKV, LK, D]).unwrap();
        let mask = View4::new(
            &bias,
            [B, 1, LQ, LK],
            [(LQ * LK) as isize, 0, LK as isize, 1],
        )
        .unwrap();
        let params = AttentionParams::new(AttentionParams::default_scale(D));
        for mode in 0..4 {
            let got = run(
                &op(false, true, mode, true),
                vec![q.clone(), k.clone(), v.clone(), nonpad(&LENS)],
            )
            .unwrap();
            let stage = ScoreStage::from_onnx_mode(mode).unwrap();
            let want = reference::scores(&qv, &kv, &Mask::Additive(mask), &params, stage).unwrap();
            assert_close(&got[1], &want, &format!("qk_matmul_output mode {mode}"));
        }
    }

    #[test]
    fn nonpad_kv_seqlen_on_3d_inputs() {
        // [B, L, H·D] inputs: the per-batch views must follow the 3-D strides.
        let (q, k, v) = (
            tensor(&[B, LQ, HQ * D], 12),
            tensor(&[B, LK, HKV * D], 13),
            tensor(&[B, LK, HKV * DV], 14),
        );
        let mut op3 = op(false, true, 0, false);
        op3.q_num_heads = Some(HQ);
        op3.kv_num_heads = Some(HKV);
        let got = run(&op3, vec![q.clone(), k.clone(), v.clone(), nonpad(&LENS)]).unwrap();
        let bias = explicit_bias(None, true);
        let qv = View4::from_bshd(f32s(&q), B, LQ, HQ, D).unwrap();
        let kv = View4::from_bshd(f32s(&k), B, LK, HKV, D).unwrap();
        let vv = View4::from_bshd(f32s(&v), B, LK, HKV, DV).unwrap();
        let mask = View4::new(
            &bias,
            [B, 1, LQ, LK],
            [(LQ * LK) as isize, 0, LK as isize, 1],
        )
        .unwrap();
        let mut want = vec![f32::NAN; B * LQ * HQ * DV];
        let mut out = ViewMut4::from_bshd(&mut want, B, LQ, HQ, DV).unwrap();
        let params = AttentionParams::new(AttentionParams::default_scale(D));
        reference::attention(&qv, &kv, &vv, &Mask::Additive(mask), &params, &mut out).unwrap();
        assert_close(&got[0], &want, "3-D");
    }

    #[test]
    fn nonpad_kv_seqlen_is_validated() {
        let qkv = || {
            vec![
                tensor(&[B, HQ, LQ, D], 1),
                tensor(&[B, HKV, LK, D], 2),
                tensor(&[B, HKV, LK, DV], 3),
            ]
        };
        let fails = |n: Tensor, expect: &str| {
            let mut inputs = qkv();
            inputs.push(n);
            let err = format!(
                "{:#}",
                run(&op(false, false, 0, false), inputs).unwrap_err()
            );
            assert!(
                err.contains("nonpad_kv_seqlen") && err.contains(expect),
                "{err}"
            );
        };
        fails(
            Tensor::from_shape(&[B], &[1i32, 2, 3]).unwrap(),
            "requires int64",
        );
        fails(nonpad(&[1, 2]), "must be [batch] = [3]");
        fails(
            nonpad(&[1, -1, 2]),
            "nonpad_kv_seqlen[1] = -1 is outside 0..=5",
        );
        fails(
            nonpad(&[1, 2, 6]),
            "nonpad_kv_seqlen[2] = 6 is outside 0..=5",
        );
    }

    #[test]
    fn nonpad_kv_seqlen_refuses_a_kv_cache() {
        let node = |inputs: &[&str], outputs: &[&str]| NodeProto {
            op_type: "Attention".into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let ok = parse_node(&node(&["q", "k", "v", "", "", "", "n"], &["y"]), "attn").unwrap();
        assert!(ok.has_nonpad && !ok.has_mask && !ok.has_past);
        assert_eq!(ok.input_count(), 4);
        assert_eq!(ok.nonpad_index(), Some(3));
        for (inputs, outputs) in [
            (&["q", "k", "v", "m", "pk", "pv", "n"][..], &["y"][..]),
            (
                &["q", "k", "v", "", "", "", "n"][..],
                &["y", "present_k", "present_v"][..],
            ),
        ] {
            let err = parse_node(&node(inputs, outputs), "attn")
                .unwrap_err()
                .to_string();
            assert!(err.contains("nonpad_kv_seqlen cannot be combined"), "{err}");
        }
        let err = parse_node(
            &node(&["q", "k", "v", "", "", "", "n", "x"], &["y"]),
            "attn",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("at most 7"), "{err}");
    }
}
