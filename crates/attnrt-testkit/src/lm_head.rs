//! A decoder small enough to build by hand, for generation's rewrite of the logits to the last
//! position (`attnrt::generate`, issue 26): one token embedding, one cache slot, and the
//! product by the output embedding ("lm_head") seeing the hidden states in a chosen layout.
//!
//! ```text
//! x = Gather(embedding [10, 4], input_ids [batch, sequence])      [batch, sequence, 4]
//! present.0.key = present.0.value = Concat(past, Unsqueeze(x, 1), axis=2)
//! h = Tanh(x) → (layout) → MatMul(·, w [4, 10]) → Add(·, bias) → (layout) → logits
//! ```

use attnrt_onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use attnrt_onnx::proto::type_proto::Value as TypeValue;
use attnrt_onnx::{attr, DataType, ModelProto};

use crate::{model, node, node_with_attrs, seeded_values, tensor_f32, tensor_i64_1d};
use crate::{value_info, GraphBuilder};

/// The vocabulary.
pub const VOCAB: i64 = 10;
/// The model width.
const HIDDEN: i64 = 4;

/// How the hidden states reach the product by the output embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenLayout {
    /// `[batch, sequence, hidden]`; `logits = MatMul(h, w) + bias [vocab]`.
    BatchMajor,
    /// `[batch·sequence, hidden]` (reshaped before the product); `logits = MatMul(h, w) + bias`
    /// with the bias `[1, 1, vocab]`: broadcast to `[1, batch·sequence, vocab]`, a batch of
    /// one's `[1, sequence, vocab]`. The logits' dims but the vocabulary are declared unnamed.
    Flat,
    /// `[batch·sequence, hidden]`; the product (plus a bias `[vocab]`) reshaped to
    /// `[batch, sequence, vocab]` after.
    FlatReshaped,
    /// `[sequence, batch, hidden]` (transposed before the product); the product (plus a bias
    /// `[vocab]`) transposed back to `[batch, sequence, vocab]`.
    SequenceMajor,
    /// `[sequence, batch, hidden]`, and the logits too: `[sequence, batch, vocab]`, declared
    /// so. Not a layout generation reads, for the rewrite's own checks.
    SequenceMajorLogits,
}

/// The decoder: inputs `input_ids` `[batch, sequence]` (int64), `past_key_values.0.key` and
/// `.value` `[batch, 1, past_sequence, 4]`; outputs `logits`, `present.0.key`,
/// `present.0.value`. Opset 17.
pub fn lm_head_decoder(layout: HiddenLayout) -> ModelProto {
    let mut g = GraphBuilder::new("lm_head_decoder");
    g.input(value_info(
        "input_ids",
        DataType::Int64,
        &["batch", "sequence"],
    ));
    let cache = ["batch", "1", "past_sequence", "4"];
    let present = ["batch", "1", "past_sequence + sequence", "4"];
    for kv in ["key", "value"] {
        let past = format!("past_key_values.0.{kv}");
        g.input(value_info(&past, DataType::Float, &cache));
        let out = format!("present.0.{kv}");
        g.node(node_with_attrs(
            &format!("cache_{kv}"),
            "Concat",
            &[&past, "x1"],
            &[&out],
            vec![attr::make_int("axis", 2)],
        ));
        g.output(value_info(&out, DataType::Float, &present));
    }
    let table = seeded_values((VOCAB * HIDDEN) as usize, 7);
    g.initializer(tensor_f32("embedding", &[VOCAB, HIDDEN], &table));
    g.initializer(tensor_i64_1d("axis1", &[1]));
    g.initializer(tensor_f32(
        "w",
        &[HIDDEN, VOCAB],
        &seeded_values((VOCAB * HIDDEN) as usize, 11),
    ));
    g.node(node("embed", "Gather", &["embedding", "input_ids"], &["x"]));
    g.node(node("x1", "Unsqueeze", &["x", "axis1"], &["x1"]));
    g.node(node("tanh", "Tanh", &["x"], &["h"]));
    lm_head(&mut g, layout);
    let mut m = model(g.finish(), 17);
    if layout == HiddenLayout::Flat {
        unname_logits_dims(&mut m);
    }
    m
}

/// `h` to `logits` in `layout`.
fn lm_head(g: &mut GraphBuilder, layout: HiddenLayout) {
    use HiddenLayout::*;
    let perm = || vec![attr::make_ints("perm", &[1, 0, 2])];
    let bias: &[i64] = if layout == Flat {
        &[1, 1, VOCAB]
    } else {
        &[VOCAB]
    };
    let bias_values = seeded_values(VOCAB as usize, 13);
    g.initializer(tensor_f32("bias", bias, &bias_values));
    let fed = match layout {
        BatchMajor => "h".to_string(),
        Flat | FlatReshaped => {
            g.initializer(tensor_i64_1d("rows", &[-1, HIDDEN]));
            g.node(node("flatten", "Reshape", &["h", "rows"], &["h2"]))
        }
        SequenceMajor | SequenceMajorLogits => g.node(node_with_attrs(
            "to_sequence_major",
            "Transpose",
            &["h"],
            &["ht"],
            perm(),
        )),
    };
    g.node(node("lm_head", "MatMul", &[&fed, "w"], &["p"]));
    let last_op = match layout {
        BatchMajor | Flat | SequenceMajorLogits => "logits",
        FlatReshaped | SequenceMajor => "q",
    };
    g.node(node("bias_add", "Add", &["p", "bias"], &[last_op]));
    match layout {
        FlatReshaped => {
            g.initializer(tensor_i64_1d("vocab", &[VOCAB]));
            g.node(node("ids_shape", "Shape", &["input_ids"], &["ids_shape"]));
            g.node(node_with_attrs(
                "logits_shape",
                "Concat",
                &["ids_shape", "vocab"],
                &["logits_shape"],
                vec![attr::make_int("axis", 0)],
            ));
            g.node(node(
                "unflatten",
                "Reshape",
                &["q", "logits_shape"],
                &["logits"],
            ));
        }
        SequenceMajor => {
            g.node(node_with_attrs(
                "to_batch_major",
                "Transpose",
                &["q"],
                &["logits"],
                perm(),
            ));
        }
        _ => {}
    }
    let dims = if layout == SequenceMajorLogits {
        ["sequence", "batch", "10"]
    } else {
        ["batch", "sequence", "10"]
    };
    g.output(value_info("logits", DataType::Float, &dims));
}

/// Declares the `logits` output's first two dims without a value or a name (an empty
/// `dim_param`).
fn unname_logits_dims(m: &mut ModelProto) {
    let graph = m.graph.as_mut().expect("built with a graph");
    let logits = graph.output.iter_mut().find(|o| o.name == "logits");
    let Some(TypeValue::TensorType(t)) = logits
        .and_then(|o| o.r#type.as_mut())
        .and_then(|t| t.value.as_mut())
    else {
        unreachable!("the logits are declared a tensor")
    };
    for dim in t.shape.iter_mut().flat_map(|s| s.dim.iter_mut()).take(2) {
        dim.value = Some(DimValue::DimParam(String::new()));
    }
}
