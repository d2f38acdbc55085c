//! Nodes that are the identity at inference never reach tract (crates/attnrt-runtime/src/
//! lower.rs): the session's outputs are the same, graph outputs keep their names, and nodes
//! that are not provably identities (a training-mode Dropout) stay.

use attnrt_onnx::attr::make_int;
use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{
    float_value, node, node_chain, node_with_attrs, tensor_bool, tensor_f32, GraphBuilder,
};

fn x() -> NamedTensor {
    NamedTensor {
        name: "x".into(),
        tensor: Tensor::from(ndarray::arr1(&[1.0f32, -2.0, 3.5, 0.25]).into_dyn()),
    }
}

fn run(model: &ModelProto) -> Vec<NamedTensor> {
    let threads = Threads::new(Some(1)).unwrap();
    let s = Session::new(model, &threads, "chain", &SessionOptions::default()).unwrap();
    s.run(&[x()]).unwrap()
}

fn values(t: &NamedTensor) -> Vec<f32> {
    t.tensor
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .copied()
        .collect()
}

/// x → Identity → Dropout (inference) → Cast(float) → Add(c) → [Identity → y], and the Add's
/// result also read through an Identity that is a graph output (`mid`).
fn chain(training: Option<bool>) -> ModelProto {
    let mut g = GraphBuilder::new("chain");
    g.input(float_value("x", &[4]));
    g.initializer(tensor_f32("c", &[4], &[1.0, 1.0, 1.0, 1.0]));
    g.node(node("id0", "Identity", &["x"], &["a"]));
    let dropout_inputs: Vec<&str> = match training {
        None => vec!["a"],
        Some(_) => vec!["a", "", "train"],
    };
    if let Some(t) = training {
        g.initializer(tensor_bool("train", &[], &[t]));
    }
    g.node(node("drop", "Dropout", &dropout_inputs, &["b"]));
    g.node(node_with_attrs(
        "cast",
        "Cast",
        &["b"],
        &["c_in"],
        vec![make_int("to", DataType::Float as i64)],
    ));
    g.node(node("add", "Add", &["c_in", "c"], &["sum"]));
    g.node(node("id_mid", "Identity", &["sum"], &["mid"]));
    g.node(node("id_out", "Identity", &["mid"], &["y"]));
    g.output(float_value("mid", &[4]));
    g.output(float_value("y", &[4]));
    g.into_model(17)
}

#[test]
fn identities_are_removed_and_outputs_keep_their_names() {
    let out = run(&chain(None));
    let names: Vec<&str> = out.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["mid", "y"]);
    for o in &out {
        assert_eq!(values(o), [2.0, -1.0, 4.5, 1.25], "{}", o.name);
    }
}

#[test]
fn an_inference_mode_dropout_given_as_constant_false_is_removed_too() {
    let out = run(&chain(Some(false)));
    assert_eq!(values(&out[1]), [2.0, -1.0, 4.5, 1.25]);
}

#[test]
fn a_long_identity_chain_runs() {
    let n = 20_000;
    let out = run(&node_chain(n, n));
    assert_eq!(out[0].name, "y");
    assert_eq!(values(&out[0]), values(&x()));
}
