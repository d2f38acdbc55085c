//! The blocks of a model's `If` branches are reported like the main graph's: a branch where
//! nothing fuses still names its near misses (optimum's merged T5 decoder once reported "0 fused,
//! 0 not fused" for its 8 Softmax nodes).

use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::proto::attribute_proto::AttributeType;
use attnrt_onnx::{AttributeProto, DataType};
use attnrt_testkit::{node, value_info, GraphBuilder};

/// A branch computing `y` from the outer input `x` with `op`.
fn branch(name: &str, op: &str) -> AttributeProto {
    let mut b = GraphBuilder::new(name);
    b.node(node(op, op, &["x"], &["y"]));
    b.output(value_info("y", DataType::Float, &["2", "3", "4", "4"]));
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Graph as i32,
        g: Some(b.finish()),
        ..Default::default()
    }
}

#[test]
fn a_branch_where_nothing_fuses_names_its_near_misses() {
    let mut g = GraphBuilder::new("merged");
    g.input(value_info("x", DataType::Float, &["2", "3", "4", "4"]));
    g.input(value_info("use_cache_branch", DataType::Bool, &["1"]));
    let mut choose = node("if", "If", &["use_cache_branch"], &["y"]);
    choose.attribute = vec![
        branch("then_branch", "Softmax"),
        branch("else_branch", "Identity"),
    ];
    g.node(choose);
    g.output(value_info("y", DataType::Float, &["2", "3", "4", "4"]));
    let model = g.into_model(18);
    let fused = fuse(&model, &FusionOptions::default()).unwrap();
    assert!(fused.report.blocks.is_empty());
    let misses: Vec<&str> = fused
        .report
        .near_misses
        .iter()
        .map(|m| m.softmax.as_str())
        .collect();
    assert_eq!(misses.len(), 1, "{:#?}", fused.report);
    assert!(misses[0].starts_with("if/then_branch: "), "{misses:?}");
}
