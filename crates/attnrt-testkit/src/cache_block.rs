//! One decoder attention layer with a key/value cache, as TorchScript exports GPT-2's legacy
//! attention: the shared fixture of the fusion crate's structural tests and the workspace's
//! numeric tests of the cache stage.
//!
//! ```text
//! x [B, L, 32] → MatMul(Wq|Wk|Wv) → Reshape [B, L, 4, 8] → Transpose[0,2,1,3]
//! present_key   = Concat(past_key, k, axis=-2)        (past_key [B, 4, P, 8])
//! present_value = Concat(past_value, v, axis=2)
//! scores = MatMul(q, Transpose[0,1,3,2](present_key)) / √8 → mask → Softmax → ·present_value
//!   → Transpose → Reshape [B, L, 32] → y
//! ```
//!
//! The mask ([`CacheMask`]) is the causal rule built from positions up to the key length read
//! from `Shape(present_key)` (bottom-right: query `i` sees keys `j ≤ P + i`), or a term
//! computed from the joined keys' values (which the fused node cannot take as an input while
//! it produces the join).

use attnrt_onnx::{attr, AttributeProto, DataType, ModelProto};

use crate::{
    node_with_attrs, seeded_values, tensor_f32, tensor_i64, tensor_i64_1d, value_info, GraphBuilder,
};

/// Model width.
pub const D_MODEL: i64 = 32;
/// Heads (queries and keys).
pub const HEADS: i64 = 4;
/// Head size.
pub const HEAD_SIZE: i64 = 8;

/// How the layer masks its scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMask {
    /// No mask.
    None,
    /// `Where(Range(0, T) ≤ Range(T − L, T)ᵀ, scores, finfo.min)` with `T` read from
    /// `Shape(present_key)`.
    CausalFromPresentShape,
    /// The same rule and `Range(0, T) > Range(T − L, T)ᵀ − 3` (a sliding window of 3 keys, as
    /// Mistral's): not the op's causal rule, so the mask stays a tensor computed from the join's
    /// shape.
    WindowFromPresentShape,
    /// The window with `T` read from the shape of a tensor computed from the join,
    /// `Shape(Unsqueeze(present_key, [2]))[3]` (as optimum's LLaMA reads it from the
    /// head-repeated keys).
    WindowFromRepeatShape,
    /// `Where(Range(0, T) ≤ Range(0, L)ᵀ, scores, finfo.min)`: the top-left triangle, which is
    /// not the op's causal rule once a past is given (a near miss by the past length).
    TopLeftFromPresentShape,
    /// `scores + Transpose(ReduceMean(present_key, [1, 3]))`: a term computed from the joined
    /// keys' values.
    FromPresentValues,
    /// `scores + Concat(past_bias [B,1,1,P], new_bias [B,1,1,L], axis=-1)`: a padding bias that
    /// grows with the cache (broadcast over the queries, so the fused node expands it).
    PaddingBias,
}

/// The layer with `mask`; inputs `x`, `past_key`, `past_value` (and `past_bias`, `new_bias`
/// for [`CacheMask::PaddingBias`]); outputs `y`, `present_key`, `present_value`. Opset 17, `B`,
/// `L`, `P` symbolic.
pub fn cache_block(mask: CacheMask) -> ModelProto {
    let mut g = Layer {
        g: GraphBuilder::new("cache_block"),
    };
    let x =
        g.g.input(value_info("x", DataType::Float, &["B", "L", "32"]));
    let cache = ["B", "4", "P", "8"];
    let past_k = g.g.input(value_info("past_key", DataType::Float, &cache));
    let past_v = g.g.input(value_info("past_value", DataType::Float, &cache));
    let q = g.head_split(&x, "q", 1);
    let k = g.head_split(&x, "k", 2);
    let v = g.head_split(&x, "v", 3);
    let axis = |a| vec![attr::make_int("axis", a)];
    let present_k = g.named("Concat", "cache_k", &[&past_k, &k], "present_key", axis(-2));
    let present_v = g.named(
        "Concat",
        "cache_v",
        &[&past_v, &v],
        "present_value",
        axis(2),
    );
    let kt = g.op("Transpose", "kt", &[&present_k], perm(&[0, 1, 3, 2]));
    let s = g.op("MatMul", "qk", &[&q, &kt], vec![]);
    let sqrt_d =
        g.g.initializer(tensor_f32("sqrt_d", &[], &[(HEAD_SIZE as f32).sqrt()]));
    let s = g.op("Div", "scale", &[&s, &sqrt_d], vec![]);
    let s = match mask {
        CacheMask::None => s,
        CacheMask::CausalFromPresentShape => g.causal_from_shape(&s, &q, (&present_k, 2), None),
        CacheMask::WindowFromRepeatShape => {
            let ax = g.g.initializer(tensor_i64_1d("repeat_axis", &[2]));
            let r = g.op("Unsqueeze", "repeat", &[&present_k, &ax], vec![]);
            g.causal_from_shape(&s, &q, (&r, 3), Some(3))
        }
        CacheMask::WindowFromPresentShape => g.causal_from_shape(&s, &q, (&present_k, 2), Some(3)),
        CacheMask::TopLeftFromPresentShape => g.top_left(&s, &q, &present_k),
        CacheMask::FromPresentValues => g.term_from_values(&s, &present_k),
        CacheMask::PaddingBias => g.padding_bias(&s),
    };
    let p = g.op("Softmax", "softmax", &[&s], axis(-1));
    let c = g.op("MatMul", "context", &[&p, &present_v], vec![]);
    let t = g.op("Transpose", "merge", &[&c], perm(&[0, 2, 1, 3]));
    let shape = g.g.initializer(tensor_i64_1d("merged", &[0, -1, D_MODEL]));
    g.named("Reshape", "merge", &[&t, &shape], "y", vec![]);
    g.g.output(value_info("y", DataType::Float, &["B", "L", "32"]));
    let total = ["B", "4", "T", "8"];
    g.g.output(value_info("present_key", DataType::Float, &total));
    g.g.output(value_info("present_value", DataType::Float, &total));
    g.g.into_model(17)
}

fn perm(p: &[i64]) -> Vec<AttributeProto> {
    vec![attr::make_ints("perm", p)]
}

struct Layer {
    g: GraphBuilder,
}

impl Layer {
    fn named(
        &mut self,
        op: &str,
        tag: &str,
        inputs: &[&str],
        out: &str,
        attrs: Vec<AttributeProto>,
    ) -> String {
        self.g.node(node_with_attrs(
            &format!("{op}_{tag}"),
            op,
            inputs,
            &[out],
            attrs,
        ))
    }

    fn op(&mut self, op: &str, tag: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        self.named(op, tag, inputs, &format!("{tag}_out"), attrs)
    }

    /// `Transpose[0,2,1,3](Reshape(x · W, [0, -1, 4, 8]))` with a seeded weight.
    fn head_split(&mut self, x: &str, what: &str, seed: u32) -> String {
        let w: Vec<f32> = seeded_values((D_MODEL * D_MODEL) as usize, seed)
            .iter()
            .map(|v| v * 0.3)
            .collect();
        let w = self
            .g
            .initializer(tensor_f32(&format!("W{what}"), &[D_MODEL, D_MODEL], &w));
        let p = self.op("MatMul", &format!("proj_{what}"), &[x, &w], vec![]);
        let shape = self.g.initializer(tensor_i64_1d(
            &format!("split_{what}"),
            &[0, -1, HEADS, HEAD_SIZE],
        ));
        let r = self.op("Reshape", &format!("split_{what}"), &[&p, &shape], vec![]);
        self.op(
            "Transpose",
            &format!("heads_{what}"),
            &[&r],
            perm(&[0, 2, 1, 3]),
        )
    }

    /// Size `axis` of `t` as a 1-element vector: `Unsqueeze(Gather(Shape(t), axis), [0])`.
    fn size(&mut self, t: &str, axis: i64, tag: &str) -> String {
        let shape = self.op("Shape", &format!("shape_{tag}"), &[t], vec![]);
        let at = self
            .g
            .initializer(tensor_i64(&format!("at_{tag}"), &[], &[axis]));
        let d = self.op(
            "Gather",
            &format!("gather_{tag}"),
            &[&shape, &at],
            vec![attr::make_int("axis", 0)],
        );
        let zero = self
            .g
            .initializer(tensor_i64_1d(&format!("axes_{tag}"), &[0]));
        self.op("Unsqueeze", &format!("unsq_{tag}"), &[&d, &zero], vec![])
    }

    /// The causal rule from positions: `keys = Range(0, total)`, `queries = Range(total − L,
    /// total)`, `Where(keys ≤ queries, scores, finfo.min)` with `total` the size of `sized` on
    /// `axis` (the join's axis 2, or a tensor computed from it); with a `window`, also
    /// `keys > queries − window`.
    fn causal_from_shape(
        &mut self,
        scores: &str,
        q: &str,
        (sized, axis): (&str, i64),
        window: Option<i64>,
    ) -> String {
        let total = self.size(sized, axis, "total");
        let lq = self.size(q, 2, "lq");
        let start = self.op("Sub", "start", &[&total, &lq], vec![]);
        let zero = self.g.initializer(tensor_i64("zero", &[], &[0]));
        let one = self.g.initializer(tensor_i64("one", &[], &[1]));
        let scalar = |g: &mut Layer, t: &str, tag: &str| {
            let axes = g.g.initializer(tensor_i64_1d(&format!("axes_{tag}"), &[0]));
            g.op("Squeeze", tag, &[t, &axes], vec![])
        };
        let (start, total) = (
            scalar(self, &start, "start0"),
            scalar(self, &total, "total0"),
        );
        let keys = self.op("Range", "keys", &[&zero, &total, &one], vec![]);
        let queries = self.op("Range", "queries", &[&start, &total, &one], vec![]);
        let ax1 = self.g.initializer(tensor_i64_1d("ax1", &[1]));
        let queries = self.op("Unsqueeze", "queries_col", &[&queries, &ax1], vec![]);
        let mut visible = self.op("LessOrEqual", "visible", &[&keys, &queries], vec![]);
        if let Some(w) = window {
            let w = self.g.initializer(tensor_i64("window", &[], &[w]));
            let oldest = self.op("Sub", "oldest", &[&queries, &w], vec![]);
            let recent = self.op("Greater", "recent", &[&keys, &oldest], vec![]);
            visible = self.op("And", "in_window", &[&visible, &recent], vec![]);
        }
        let fill = self.g.initializer(tensor_f32("fill", &[], &[f32::MIN]));
        self.op("Where", "mask", &[&visible, scores, &fill], vec![])
    }

    /// `Where(Range(0, total) ≤ Range(0, L)ᵀ, scores, finfo.min)`.
    fn top_left(&mut self, scores: &str, q: &str, present_k: &str) -> String {
        let total = self.size(present_k, 2, "total");
        let lq = self.size(q, 2, "lq");
        let zero = self.g.initializer(tensor_i64("zero", &[], &[0]));
        let one = self.g.initializer(tensor_i64("one", &[], &[1]));
        let axes = self.g.initializer(tensor_i64_1d("axes_scalars", &[0]));
        let total = self.op("Squeeze", "total0", &[&total, &axes], vec![]);
        let lq = self.op("Squeeze", "lq0", &[&lq, &axes], vec![]);
        let keys = self.op("Range", "keys", &[&zero, &total, &one], vec![]);
        let queries = self.op("Range", "queries", &[&zero, &lq, &one], vec![]);
        let ax1 = self.g.initializer(tensor_i64_1d("ax1", &[1]));
        let queries = self.op("Unsqueeze", "queries_col", &[&queries, &ax1], vec![]);
        let visible = self.op("LessOrEqual", "visible", &[&keys, &queries], vec![]);
        let fill = self.g.initializer(tensor_f32("fill", &[], &[f32::MIN]));
        self.op("Where", "mask", &[&visible, scores, &fill], vec![])
    }

    /// `scores + Concat(past_bias, new_bias, axis = -1)`, both graph inputs.
    fn padding_bias(&mut self, scores: &str) -> String {
        let past = self.g.input(value_info(
            "past_bias",
            DataType::Float,
            &["B", "1", "1", "P"],
        ));
        let step = self.g.input(value_info(
            "new_bias",
            DataType::Float,
            &["B", "1", "1", "L"],
        ));
        let axis = vec![attr::make_int("axis", -1)];
        let bias = self.op("Concat", "bias", &[&past, &step], axis);
        self.op("Add", "mask", &[scores, &bias], vec![])
    }

    /// `scores + Transpose[0,1,3,2](ReduceMean(present_key, axes [1, 3], keepdims))`.
    fn term_from_values(&mut self, scores: &str, present_k: &str) -> String {
        let mean = self.op(
            "ReduceMean",
            "key_mean",
            &[present_k],
            vec![
                attr::make_ints("axes", &[1, 3]),
                attr::make_int("keepdims", 1),
            ],
        );
        let term = self.op("Transpose", "key_term", &[&mean], perm(&[0, 1, 3, 2]));
        self.op("Add", "mask", &[scores, &term], vec![])
    }
}
