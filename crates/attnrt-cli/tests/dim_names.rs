//! Issue 25 item 3: dim names are hints, not contracts. A model whose inputs share a symbolic
//! name they do not share at run time (optimum names a cache decoder's mask axis like
//! `input_ids`' axis, though the mask also covers the cache) runs, as in ONNX Runtime, with a
//! note; and a cache model run without input files gets consistent random inputs (an empty
//! cache, a mask as long as the cache and the new tokens).

mod common;

use common::{attnrt, model};

use ::attnrt::onnx::proto::tensor_shape_proto::dimension::Value as Dim;
use ::attnrt::Message;

fn stdout(o: &std::process::Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    out
}

#[test]
fn a_mask_named_like_the_new_tokens_runs_and_is_noted() {
    let mut m = ::attnrt::load(model("gpt2_cache_eager.ts.onnx")).unwrap();
    let graph = m.graph.as_mut().unwrap();
    let mask = graph
        .input
        .iter_mut()
        .find(|i| i.name == "attention_mask")
        .unwrap();
    let Some(::attnrt::onnx::proto::type_proto::Value::TensorType(t)) =
        mask.r#type.as_mut().unwrap().value.as_mut()
    else {
        panic!("the mask is a tensor")
    };
    t.shape.as_mut().unwrap().dim[1].value = Some(Dim::DimParam("sequence".into()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("renamed.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let out = stdout(&attnrt(&[
        "run",
        path.to_str().unwrap(),
        "--input-npz",
        &model("gpt2_cache_eager.decode_p5_n3.inputs.npz"),
        "--expect",
        &model("gpt2_cache_eager.decode_p5_n3.outputs.npz"),
    ]));
    assert!(
        out.contains(
            "input 'attention_mask' has shape [2, 8], where dimension 'sequence' (axis 1) is 3"
        ),
        "{out}"
    );
    assert!(out.contains("2 attention block(s) fused"), "{out}");
}

#[test]
fn a_cache_model_without_inputs_runs_its_first_step() {
    let out = stdout(&attnrt(&["run", &model("llama_cache_eager.ts.onnx")]));
    assert!(out.contains("past_sequence=0 (default)"), "{out}");
    assert!(out.contains("total_sequence=16 (default: the sum"), "{out}");
    // a later step: the mask covers the cache and the new tokens
    let out = stdout(&attnrt(&[
        "run",
        &model("llama_cache_eager.ts.onnx"),
        "--dim",
        "past_sequence=5",
        "--dim",
        "sequence=3",
    ]));
    assert!(out.contains("total_sequence=8"), "{out}");
}
