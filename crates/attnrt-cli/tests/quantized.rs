//! Dynamically quantized models (`models/quantize.py`: ONNX Runtime's `quantize_dynamic`,
//! per-channel int8 weights) run their projections on attnrt's integer op, and give the unfused
//! graph's numbers on tract and ONNX Runtime's.

mod common;

use common::{attnrt, model};

use serde_json::Value;

fn run_json(args: &[&str]) -> Value {
    let o = attnrt(args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

/// Runs `file` with the shipped BERT inputs (attnrt's ops on, or tract's matmuls with
/// `--matmul tract`), writes its outputs to `out` and diffs them with `expect` at `tol`.
fn run(file: &str, matmul: &str, out: Option<&str>, expect: Option<&str>, tol: &str) -> Value {
    let (model, inputs) = (model(file), model("bert_eager.inputs.npz"));
    let mut args = vec![
        "run",
        &model,
        "--input-npz",
        &inputs,
        "--no-diff",
        "--matmul",
        matmul,
        "--atol",
        tol,
        "--rtol",
        tol,
        "--json",
    ];
    if let Some(out) = out {
        args.extend(["--output", out]);
    }
    if let Some(expect) = expect {
        args.extend(["--expect", expect]);
    }
    run_json(&args)
}

fn expect_ok(v: &Value) -> bool {
    v["expect"]["fused"][0]["ok"].as_bool().unwrap()
}

/// With 7-bit weights (`reduce_range`), ONNX Runtime's integer products are exact on every CPU
/// (see `models/quantize.py`), so its outputs are the graph's arithmetic: attnrt matches them
/// within float32 rounding of the layer norms, softmaxes and GELUs (atol = rtol = 1e-4; measured
/// max |diff| 7.2e-7 on an AVX2 VM).
#[test]
fn quantized_bert_runs_12_quantized_projections_and_matches_onnx_runtime() {
    let expect = model("bert_eager.ts.qint8rr.outputs.npz");
    let v = run(
        "bert_eager.ts.qint8rr.onnx",
        "attnrt",
        None,
        Some(&expect),
        "1e-4",
    );
    assert!(expect_ok(&v), "{}", v["expect"]);
    // 2 layers × (Q, K, V, output, 2 feed-forward): every MatMulInteger is one op.
    assert_eq!(v["ops"]["fused"]["quantized"], 12, "{}", v["ops"]);
    let tract = run(
        "bert_eager.ts.qint8rr.onnx",
        "tract",
        None,
        Some(&expect),
        "1e-4",
    );
    assert!(
        tract["ops"]["fused"]["quantized"].is_null(),
        "{}",
        tract["ops"]
    );
}

/// With full-range weights, the quantized projections on attnrt's op and the unfused graph on
/// tract (both exact in their integers) agree within float32 rounding (1e-5: the other ops run
/// on different kernels: attnrt's layer norm and GELU, tract's). ONNX Runtime's outputs
/// (`bert_eager.ts.qint8.outputs.npz`) are not a reference on CPUs without VNNI, where its
/// integer products saturate (`models/quantize.py`).
#[test]
fn full_range_int8_weights_give_tract_s_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.npz").display().to_string();
    let v = run(
        "bert_eager.ts.qint8.onnx",
        "attnrt",
        Some(&ours),
        None,
        "1e-4",
    );
    assert_eq!(v["ops"]["fused"]["quantized"], 12, "{}", v["ops"]);
    let tract = run(
        "bert_eager.ts.qint8.onnx",
        "tract",
        None,
        Some(&ours),
        "1e-5",
    );
    assert!(expect_ok(&tract), "{}", tract["expect"]);
    assert!(
        tract["ops"]["fused"]["quantized"].is_null(),
        "{}",
        tract["ops"]
    );
}

/// `--profile` names the op the projections run as.
#[test]
fn the_profile_names_the_quantized_projection_op() {
    let (m, inputs) = (
        model("bert_eager.ts.qint8.onnx"),
        model("bert_eager.inputs.npz"),
    );
    let v = run_json(&[
        "run",
        &m,
        "--input-npz",
        &inputs,
        "--no-diff",
        "--profile",
        "--profile-top",
        "100",
        "--json",
    ]);
    let nodes = v["profile"]["fused"]["top_nodes"]
        .as_array()
        .expect("profiled nodes");
    let quantized = nodes
        .iter()
        .filter(|n| n["tract_op"] == "AttnrtQuantProjection")
        .count();
    assert_eq!(quantized, 12, "{}", v["profile"]);
}

/// `models/quantized.json`: the quantized files, their sources and saved cases.
fn quantized_manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(model("quantized.json")).expect("models/quantized.json");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    v["models"].as_array().expect("models").clone()
}

/// Every saved case of the quantized decoders (prefill and decode steps with a cache) runs with
/// both attention blocks fused and every projection on the integer op, fused equal to unfused
/// (float32 tolerance); with 7-bit weights both equal ONNX Runtime's outputs (its integer
/// products are exact there, see `models/quantize.py`) within 1e-4.
#[test]
fn every_case_of_the_quantized_decoders_runs_fused_as_unfused() {
    let decoders: Vec<Value> = quantized_manifest()
        .into_iter()
        .filter(|m| m["cases"].as_array().unwrap().len() > 1)
        .collect();
    assert_eq!(decoders.len(), 4, "LLaMA and GPT-2, qint8 and qint8rr");
    for m in &decoders {
        let file = model(m["file"].as_str().unwrap());
        for case in m["cases"].as_array().unwrap() {
            let (inputs, outputs) = (
                model(case["inputs_npz"].as_str().unwrap()),
                model(case["outputs_npz"].as_str().unwrap()),
            );
            let mut args = vec!["run", &file, "--input-npz", &inputs, "--json"];
            if m["reduce_range"] == true {
                args.extend(["--expect", &outputs]);
            }
            let v = run_json(&args);
            let what = format!("{} [{}]", m["file"], case["name"]);
            assert_eq!(v["ok"], true, "{what}: {}", v["outputs"]);
            assert_eq!(v["ops"]["fused"]["attention"], 2, "{what}: {}", v["ops"]);
            assert!(
                v["ops"]["fused"]["quantized"].as_u64().unwrap() >= 9,
                "{what}: {}",
                v["ops"]
            );
        }
    }
}

/// The greedy tokens `attnrt generate` makes on a quantized decoder (fused, checked step by
/// step against the unfused graph) and with `--no-fuse`.
fn generated(file: &str, fuse: bool) -> Value {
    let m = model(file);
    let mut args = vec![
        "generate",
        &m,
        "--prompt-ids",
        "3,14,15,92,65",
        "--max-new-tokens",
        "8",
        "--threads",
        "1",
        "--json",
    ];
    args.push(if fuse { "--check" } else { "--no-fuse" });
    let v = run_json(&args);
    if fuse {
        assert_eq!(v["fused_blocks"], 2, "{file}");
        assert_eq!(v["report"]["check_ok"], true, "{file}: {}", v["report"]);
    }
    v["report"]["tokens"].clone()
}

/// Int8 decoders with a KV cache generate the same tokens fused and unfused (ONNX Runtime's
/// greedy loop over the `qint8rr` files: `tests/python/test_generation.py`).
#[test]
fn quantized_decoders_generate_the_same_tokens_fused_and_unfused() {
    for file in [
        "llama_cache_eager.ts.qint8.onnx",
        "llama_cache_eager.ts.qint8rr.onnx",
        "gpt2_cache_eager.ts.qint8.onnx",
        "gpt2_cache_eager.ts.qint8rr.onnx",
    ] {
        let fused = generated(file, true);
        assert_eq!(fused.as_array().unwrap().len(), 8, "{file}");
        assert_eq!(fused, generated(file, false), "{file}");
    }
}

/// The QDQ form (`models/quantize.py`'s `quantize_static`, QuantFormat.QDQ): every projection
/// (`DequantizeLinear` of the int8 weight into a float `MatMul` of the dequantized activations)
/// runs on the integer op, and the outputs are ONNX Runtime's as the graph is written (graph
/// optimizations off: dequantize, then float products) within float32 rounding (atol = rtol =
/// 1e-4; measured 7.2e-7). With tract's matmuls the same file matches too. The attention blocks
/// are not fused (their probabilities are quantized before the MatMul with V), and `--explain`
/// says so.
#[test]
fn qdq_bert_runs_its_projections_on_the_integer_op_and_matches_the_graph() {
    let expect = model("bert_eager.ts.qdq.outputs.npz");
    for matmul in ["attnrt", "tract"] {
        let v = run(
            "bert_eager.ts.qdq.onnx",
            matmul,
            None,
            Some(&expect),
            "1e-4",
        );
        assert!(expect_ok(&v), "{matmul}: {}", v["expect"]);
        let quantized = &v["ops"]["fused"]["quantized"];
        match matmul {
            "attnrt" => assert_eq!(quantized, 12, "{}", v["ops"]),
            _ => assert!(quantized.is_null(), "{}", v["ops"]),
        }
    }
    let (m, dir) = (
        model("bert_eager.ts.qdq.onnx"),
        tempfile::tempdir().unwrap(),
    );
    let out = dir.path().join("f.onnx").display().to_string();
    let o = attnrt(&["fuse", &m, "-o", &out, "--explain"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        text.matches("the probabilities are quantized").count(),
        2,
        "{text}"
    );
}
