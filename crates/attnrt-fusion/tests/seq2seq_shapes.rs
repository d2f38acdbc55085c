//! The forward pass through what optimum's BART and T5 exports compute their masks and position
//! biases with (issue 25 item 4): a tensor assigned into by `ScatterND` keeps its shape, and a
//! `Slice` from `-e` (a run-time length, negated) to the end keeps `e` rows where the sliced
//! axis provably has at least `e`. Without them the mask's shape is unknown and no block fuses.

use attnrt_fusion::graph::{shape_str, GraphView};
use attnrt_onnx::DataType;
use attnrt_testkit::{node, node_with_attrs, tensor_i64, value_info, GraphBuilder};

fn shapes_of(g: GraphBuilder) -> impl Fn(&str) -> String {
    let model = g.into_model(18);
    let graph = model.graph.clone().unwrap();
    move |t: &str| {
        let order = attnrt_onnx::validate::topo_order(&graph).unwrap();
        let view = GraphView::new(&graph, &order, 18);
        view.shape(t).map(shape_str).unwrap_or_default()
    }
}

#[test]
fn scatter_nd_keeps_the_data_shape() {
    let mut g = GraphBuilder::new("s");
    g.input(value_info(
        "mask",
        DataType::Float,
        &["batch", "1", "q", "k"],
    ));
    g.input(value_info("at", DataType::Int64, &["n", "4"]));
    g.input(value_info("updates", DataType::Float, &["n"]));
    g.node(node("s", "ScatterND", &["mask", "at", "updates"], &["out"]));
    let shape = shapes_of(g);
    assert_eq!(shape("out"), "[batch, 1, q, k]");
}

#[test]
fn a_slice_from_minus_a_length_keeps_that_length() {
    let mut g = GraphBuilder::new("t5");
    // keys over the past and the new tokens; the new tokens' count from their own tensor
    g.input(value_info(
        "past",
        DataType::Float,
        &["batch", "past", "64"],
    ));
    g.input(value_info("x", DataType::Float, &["batch", "new", "64"]));
    g.initializer(tensor_i64("one", &[], &[1]));
    g.initializer(tensor_i64("zero", &[1], &[0]));
    g.initializer(tensor_i64("end", &[1], &[i64::MAX]));
    g.initializer(tensor_i64("axis1", &[1], &[1]));
    let axis = vec![attnrt_onnx::attr::make_int("axis", 1)];
    g.node(node_with_attrs(
        "cat",
        "Concat",
        &["past", "x"],
        &["all"],
        axis,
    ));
    g.node(node("shape", "Shape", &["x"], &["sx"]));
    g.node(node("len", "Gather", &["sx", "one"], &["n"]));
    g.node(node("neg", "Neg", &["n"], &["minus_n"]));
    g.node(node("u", "Unsqueeze", &["minus_n", "zero"], &["start"]));
    g.node(node(
        "last",
        "Slice",
        &["all", "start", "end", "axis1"],
        &["kept"],
    ));
    // the past may have fewer rows than `new`: nothing said
    g.node(node(
        "short",
        "Slice",
        &["past", "start", "end", "axis1"],
        &["unknown"],
    ));
    let shape = shapes_of(g);
    assert_eq!(shape("all"), "[batch, past + new, 64]");
    assert_eq!(shape("kept"), "[batch, new, 64]");
    assert_eq!(shape("unknown"), "");
}
