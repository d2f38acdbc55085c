//! A decoder layer with a key/value cache: the joins `Concat(past, new)` of K and V are taken
//! over by the fused node (`past_key`/`past_value` in, `present_key`/`present_value` out) when
//! nothing the node reads is computed from them; a `Shape` of a join (GPT-2's causal buffer
//! cut to the key length) is recomputed from the past's and the new keys' shapes; a mask
//! computed from the joined keys' values keeps the joins outside. (Fused = unfused numerically:
//! `tests/tests/kv_cache.rs` in the workspace.)

use attnrt_fusion::{fuse, Fused, FusionOptions};
use attnrt_onnx::NodeProto;
use attnrt_testkit::cache_block::{cache_block, CacheMask};

fn fused(mask: CacheMask) -> Fused {
    let m = cache_block(mask);
    attnrt_onnx::validate_model(&m).expect("test graph valid");
    let f = fuse(&m, &FusionOptions::default()).expect("fuse");
    attnrt_onnx::validate_model(&f.model).expect("fused graph valid");
    assert_eq!(
        f.report.blocks.len(),
        1,
        "{mask:?}: {:?}",
        f.report.explain_lines()
    );
    f
}

fn nodes<'a>(f: &'a Fused, op: &str) -> Vec<&'a NodeProto> {
    let g = f.model.graph.as_ref().unwrap();
    g.node.iter().filter(|n| n.op_type == op).collect()
}

/// The cache joins: `Concat`s that read the past keys or values.
fn joins(f: &Fused) -> Vec<&NodeProto> {
    let reads_past = |n: &&NodeProto| n.input[0] == "past_key" || n.input[0] == "past_value";
    nodes(f, "Concat").into_iter().filter(reads_past).collect()
}

#[test]
fn the_cache_joins_become_past_inputs_and_present_outputs() {
    for mask in [
        CacheMask::None,
        CacheMask::CausalFromPresentShape,
        CacheMask::WindowFromRepeatShape,
        CacheMask::WindowFromPresentShape,
        CacheMask::PaddingBias,
    ] {
        let f = fused(mask);
        assert!(joins(&f).is_empty(), "{mask:?}: a join is left");
        let att = nodes(&f, "Attention")[0];
        assert_eq!(att.input[4..], ["past_key", "past_value"], "{mask:?}");
        assert_eq!(
            att.output[1..],
            ["present_key", "present_value"],
            "{mask:?}"
        );
        let b = &f.report.blocks[0];
        assert!(b.rule.contains("kv-cache"), "{mask:?}: {}", b.rule);
        assert_eq!(
            b.layout, "3d",
            "{mask:?}: the head split of the new K/V is absorbed"
        );
    }
    let att = fused(CacheMask::None);
    assert_eq!(
        nodes(&att, "Attention")[0].input[3],
        "",
        "no mask: empty slot"
    );
}

#[test]
fn a_bottom_right_causal_mask_becomes_is_causal_with_the_past() {
    let f = fused(CacheMask::CausalFromPresentShape);
    let att = nodes(&f, "Attention")[0];
    assert_eq!(att.input[3], "", "the mask is gone");
    let b = &f.report.blocks[0];
    assert!(b.is_causal);
    let note = b.causal_note.as_deref().unwrap_or_default();
    assert!(note.contains("masks key j > query i + P"), "{note}");
}

#[test]
fn a_top_left_triangle_is_a_near_miss_by_the_past_length() {
    let f = fused(CacheMask::TopLeftFromPresentShape);
    let b = &f.report.blocks[0];
    assert!(!b.is_causal);
    let note = b.causal_note.as_deref().unwrap_or_default();
    assert!(
        note.contains("off the causal diagonal by -P") && note.contains("j ≤ i + P"),
        "{note}"
    );
}

#[test]
fn a_shape_of_the_join_is_computed_from_the_past_and_new_shapes() {
    let f = fused(CacheMask::WindowFromPresentShape);
    let shapes = nodes(&f, "Shape");
    assert!(
        shapes.iter().all(|n| n.input[0] != "present_key"),
        "a Shape still reads the join the fused node produces"
    );
    assert!(shapes.iter().any(|n| n.input[0] == "past_key"));
    // A window is not the op's causal rule: the mask stays a tensor.
    let b = &f.report.blocks[0];
    assert!(!b.is_causal);
    let note = b.causal_note.as_deref().unwrap_or_default();
    assert!(note.contains("combines two triangles"), "{note}");
}

#[test]
fn a_shape_of_a_tensor_computed_from_the_join_is_computed_from_the_past_and_new_shapes() {
    let f = fused(CacheMask::WindowFromRepeatShape);
    let g = f.model.graph.as_ref().unwrap();
    assert!(
        g.node
            .iter()
            .all(|n| n.input.iter().all(|i| i != "present_key")),
        "a node still reads the join the fused node produces"
    );
    assert!(
        nodes(&f, "Unsqueeze")
            .iter()
            .all(|n| n.name != "Unsqueeze_repeat"),
        "the tensor whose shape was read is gone with the reader"
    );
    // Shape(Unsqueeze(present_key, [2])) = [B, 4, 1, P + L, 8]: B and P + L from the join's
    // shape, 4, 1 and 8 known.
    let gather = nodes(&f, "Gather")
        .into_iter()
        .find(|n| n.name.ends_with("/gather"))
        .expect("the join's sizes gathered");
    let axes = g
        .initializer
        .iter()
        .find(|t| t.name == gather.input[1])
        .unwrap();
    assert_eq!(attnrt_onnx::tensor::to_i64(axes).unwrap(), [0, 0, 0, 2, 0]);
    let b = &f.report.blocks[0];
    assert!(b.rule.contains("kv-cache"), "{}", b.rule);
    assert!(!b.rule.contains("cache-concat kept"), "{}", b.rule);
}

#[test]
fn an_expanded_mask_spans_the_past_and_new_keys() {
    let f = fused(CacheMask::PaddingBias);
    let add = nodes(&f, "Add");
    assert!(
        add.iter().any(|n| n.name.ends_with("total_len_add")),
        "the mask's key length is P + L"
    );
}

#[test]
fn a_mask_computed_from_the_joined_values_keeps_the_joins_outside() {
    let f = fused(CacheMask::FromPresentValues);
    assert_eq!(joins(&f).len(), 2, "the joins stay");
    let att = nodes(&f, "Attention")[0];
    assert_eq!(att.input.len(), 4, "no past inputs: {:?}", att.input);
    assert_eq!(att.input[1], "present_key");
    let rule = &f.report.blocks[0].rule;
    assert!(
        rule.contains("cache-concat kept (an input of the block is computed from the joined cache 'present_key')"),
        "{rule}"
    );
}
