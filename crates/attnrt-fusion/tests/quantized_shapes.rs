//! The forward pass through the ops of ONNX Runtime's int8 quantizer: shapes and element types
//! come from the values, not from the `unk__N` dims the quantizer declares.

use attnrt_fusion::graph::{shape_str, GraphView};
use attnrt_onnx::DataType;
use attnrt_testkit::{node, value_info, GraphBuilder};

#[test]
fn dynamic_quantization_keeps_the_activation_shapes() {
    let mut g = GraphBuilder::new("q");
    g.input(value_info(
        "x",
        DataType::Float,
        &["batch", "sequence", "64"],
    ));
    g.initializer(attnrt_testkit::tensor_i8("w", &[64, 32], &[1; 64 * 32]));
    g.initializer(attnrt_testkit::tensor_i8("w_zero", &[32], &[0; 32]));
    g.initializer(attnrt_testkit::tensor_f32("w_scale", &[32], &[0.5; 32]));
    g.node(node(
        "dq",
        "DynamicQuantizeLinear",
        &["x"],
        &["xq", "xs", "xz"],
    ));
    g.node(node(
        "mm",
        "MatMulInteger",
        &["xq", "w", "xz", "w_zero"],
        &["acc"],
    ));
    g.node(node(
        "deq",
        "DequantizeLinear",
        &["w", "w_scale", "w_zero"],
        &["wf"],
    ));
    g.node(node("q", "QuantizeLinear", &["x", "xs", "xz"], &["xq2"]));
    let mut model = g.into_model(17);
    // what the quantizer declares for the accumulator: its own names
    let declared = value_info("acc", DataType::Int32, &["unk__1", "unk__2", "32"]);
    model.graph.as_mut().unwrap().value_info.push(declared);
    let graph = model.graph.as_ref().unwrap();
    let order = attnrt_onnx::validate::topo_order(graph).unwrap();
    let view = GraphView::new(graph, &order, 17);
    let shape = |t: &str| view.shape(t).map(shape_str).unwrap_or_default();
    assert_eq!(shape("xq"), "[batch, sequence, 64]");
    assert_eq!(shape("xs"), "[]");
    assert_eq!(shape("acc"), "[batch, sequence, 32]");
    assert_eq!(shape("wf"), "[64, 32]");
    assert_eq!(shape("xq2"), "[batch, sequence, 64]");
    let ty = |t: &str| view.elem_type(t);
    assert_eq!(ty("xq"), Some(DataType::Uint8 as i32));
    assert_eq!(ty("xs"), Some(DataType::Float as i32));
    assert_eq!(ty("acc"), Some(DataType::Int32 as i32));
    assert_eq!(ty("wf"), Some(DataType::Float as i32));
    assert_eq!(ty("xq2"), Some(DataType::Uint8 as i32));
}
