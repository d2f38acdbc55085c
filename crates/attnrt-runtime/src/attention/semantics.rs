//! The `Attention` op as ONNX defines it (opsets 23 and 24): the node's attributes with their
//! defaults, which optional inputs and outputs it wires, and the shape rules tract's inference
//! uses.

use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

/// ONNX input slots of `Attention` (opset 23/24).
pub(super) const SLOT_MASK: usize = 3;
pub(super) const SLOT_PAST_KEY: usize = 4;
pub(super) const SLOT_PAST_VALUE: usize = 5;
pub(super) const SLOT_NONPAD: usize = 6;

/// Attributes of opsets 23 and 24 (all optional, the same in both). Anything else is refused
/// rather than ignored.
pub(super) const KNOWN_ATTRIBUTES: [&str; 7] = [
    "is_causal",
    "kv_num_heads",
    "q_num_heads",
    "qk_matmul_output_mode",
    "scale",
    "softcap",
    "softmax_precision",
];

/// attnrt's own attribute (never in a file: a generation sets it on the nodes that own its
/// cache, `crate::kv_store`): `1` puts the node in store mode.
pub const KV_STORE_ATTRIBUTE: &str = "attnrt_kv_store";

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
    /// Store mode ([`KV_STORE_ATTRIBUTE`], `crate::kv_store`): with a store given to the run,
    /// the keys and values live there and `past_*`/`present_*` are zero-byte stand-ins (in
    /// every case, `present_*`'s last axis is `past_*`'s).
    pub kv_store: bool,
}

impl Eq for AttentionOp {}

pub(super) fn wired(names: &[String], slot: usize) -> bool {
    names.get(slot).is_some_and(|s| !s.is_empty())
}

pub(super) fn build_attention(
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

pub(super) fn parse_node(node: &NodeProto, label: &str) -> TractResult<AttentionOp> {
    for a in &node.attribute {
        if !KNOWN_ATTRIBUTES.contains(&a.name.as_str()) && a.name != KV_STORE_ATTRIBUTE {
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
    let kv_store = match node.get_attr_opt::<i64>(KV_STORE_ATTRIBUTE)?.unwrap_or(0) {
        0 => false,
        1 if has_past_key && outputs[1] && outputs[2] => true,
        1 => bail!("attribute {KV_STORE_ATTRIBUTE}=1 needs past_key/past_value and present_key/present_value wired"),
        v => bail!("attribute {KV_STORE_ATTRIBUTE}={v}: must be 0 or 1"),
    };
    Ok(AttentionOp {
        node: label.to_string(),
        kv_store,
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
pub(super) struct Geometry<D> {
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
    pub(super) fn input_count(&self) -> usize {
        3 + self.has_mask as usize + 2 * self.has_past as usize + self.has_nonpad as usize
    }

    pub(super) fn mask_index(&self) -> Option<usize> {
        self.has_mask.then_some(3)
    }

    pub(super) fn past_index(&self) -> Option<usize> {
        self.has_past.then_some(3 + self.has_mask as usize)
    }

    pub(super) fn nonpad_index(&self) -> Option<usize> {
        self.has_nonpad
            .then_some(3 + self.has_mask as usize + 2 * self.has_past as usize)
    }

    pub(super) fn output_count(&self) -> usize {
        self.outputs.iter().filter(|b| **b).count()
    }

    /// The geometry from symbolic shapes; checks what can be checked symbolically.
    pub(super) fn geometry(&self, shapes: &[&[TDim]]) -> TractResult<Geometry<TDim>> {
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
    pub(super) fn output_shapes(&self, shapes: &[&[TDim]]) -> TractResult<TVec<TVec<TDim>>> {
        let g = self.geometry(shapes)?;
        let total = g.past_len.clone() + g.kv_len.clone();
        let mut out = tvec![];
        // store mode: present's last axis is past's (0 for the stand-ins)
        let past_head = |i: usize| {
            self.past_index()
                .filter(|_| self.kv_store)
                .map(|p| shapes[p + i][3].clone())
        };
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
                past_head(0).unwrap_or_else(|| g.head.clone())
            ]);
        }
        if self.outputs[2] {
            out.push(tvec![
                g.batch.clone(),
                g.kv_heads.clone(),
                total.clone(),
                past_head(1).unwrap_or_else(|| g.v_head.clone())
            ]);
        }
        if self.outputs[3] {
            out.push(tvec![g.batch, g.q_heads, g.q_len, total]);
        }
        Ok(out)
    }
}

pub(super) fn check_float(dt: DatumType, what: &str) -> TractResult<()> {
    if dt != DatumType::F32 && dt != DatumType::F16 {
        bail!("{what} has element type {dt:?}; attnrt's Attention supports float32 and float16");
    }
    Ok(())
}
