//! `Attention` nodes already in a model (the opset-23 exports of GPT-2 and LLaMA with a cache)
//! whose K and V are the cache joins written outside them take those joins over: past inputs
//! 4–5, present outputs 1–2, the joins (and LLaMA's repeat of K and V) gone. A node with
//! `is_causal` keeps its joins, with the reason as a note. (Numerically: the shipped models'
//! decode cases in `tests/tests/models.rs`, and `generate` in place bit for bit with the copy
//! path in `crates/attnrt/tests/generate.rs`.)

use attnrt_fusion::{fuse, Fused, FusionOptions};
use attnrt_onnx::{load_model, Limits, ModelProto, NodeProto};
use attnrt_testkit::manifest::models_dir;

fn load(file: &str) -> ModelProto {
    load_model(&models_dir().join(file), &Limits::default())
        .unwrap_or_else(|e| panic!("{file}: {e:#}"))
        .model
}

fn attention_nodes(f: &Fused) -> Vec<&NodeProto> {
    let g = f.model.graph.as_ref().unwrap();
    g.node.iter().filter(|n| n.op_type == "Attention").collect()
}

#[test]
fn exported_attention_nodes_take_their_cache_joins() {
    for file in [
        "gpt2_cache_sdpa.dynamo.opset23.onnx",
        "llama_cache_sdpa.dynamo.opset23.onnx",
    ] {
        let f = fuse(&load(file), &FusionOptions::default()).unwrap();
        let nodes = attention_nodes(&f);
        assert_eq!(nodes.len(), 2, "{file}");
        for (layer, n) in nodes.iter().enumerate() {
            let past = |what| format!("past_key_values.{layer}.{what}");
            let present = |what| format!("present.{layer}.{what}");
            assert_eq!(n.input[4..], [past("key"), past("value")], "{file}");
            assert_eq!(n.output[1..], [present("key"), present("value")], "{file}");
            let note = format!("takes its cache joins '{}'", present("key"));
            assert!(
                f.report.notes.iter().any(|l| l.contains(&note)),
                "{file}: {:?}",
                f.report.notes
            );
        }
        let g = f.model.graph.as_ref().unwrap();
        let readers: Vec<_> = g
            .node
            .iter()
            .filter(|n| n.input.iter().any(|i| i.starts_with("past_key_values.")))
            .filter(|n| n.op_type != "Attention" && n.op_type != "Shape")
            .map(|n| &n.name)
            .collect();
        assert!(
            readers.is_empty(),
            "{file}: the past is still read by {readers:?}"
        );
        // (LLaMA's repeat of K and V read the joins: gone with them)
        let present_readers: Vec<_> = g
            .node
            .iter()
            .filter(|n| n.input.iter().any(|i| i.starts_with("present.")))
            .map(|n| &n.name)
            .collect();
        assert!(
            present_readers.is_empty(),
            "{file}: the joins are read by {present_readers:?}"
        );
    }
}

#[test]
fn a_causal_attention_node_keeps_its_cache_joins() {
    let mut model = load("gpt2_cache_sdpa.dynamo.opset23.onnx");
    let g = model.graph.as_mut().unwrap();
    let n = g
        .node
        .iter_mut()
        .find(|n| n.op_type == "Attention")
        .unwrap();
    for a in n.attribute.iter_mut().filter(|a| a.name == "is_causal") {
        a.i = 1;
    }
    let name = n.name.clone();
    let f = fuse(&model, &FusionOptions::default()).unwrap();
    let n = attention_nodes(&f)
        .into_iter()
        .find(|n| n.name == name)
        .unwrap();
    assert!(n.input.len() <= 4, "{:?}", n.input);
    let note = format!("{name}: cache-concat kept (is_causal with a past");
    assert!(
        f.report.notes.iter().any(|l| l.contains(&note)),
        "{:?}",
        f.report.notes
    );
}
