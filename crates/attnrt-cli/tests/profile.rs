//! `--profile` on `attnrt run` and `attnrt bench`: time per op kind and the slowest nodes, per
//! path, in text and in `--json` (`"profile"`). Only structure is asserted, never timings.

mod common;

use common::{attnrt, model};

use std::process::Output;

use serde_json::Value;

fn json(o: &Output) -> Value {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number: {v}"))
}

/// A profile object is complete: non-negative times, the nodes inside the run, the kinds
/// summing to the nodes' time, at most `top` nodes, slowest first.
fn check_profile(p: &Value, top: usize) -> Vec<String> {
    let (run, ops, other) = (num(&p["run_ms"]), num(&p["ops_ms"]), num(&p["other_ms"]));
    assert!(run >= 0.0 && ops >= 0.0 && other >= 0.0, "{p}");
    assert!(ops <= run * 1.000_001 + 1e-9, "nodes inside the run: {p}");
    let kinds = p["by_op"].as_array().unwrap();
    let sum: f64 = kinds.iter().map(|k| num(&k["ms"])).sum();
    assert!((sum - ops).abs() <= 1e-6 * ops.max(1.0), "{sum} vs {ops}");
    for k in kinds {
        assert!(
            num(&k["share"]) >= 0.0 && k["nodes"].as_u64().unwrap() >= 1,
            "{k}"
        );
    }
    let nodes = p["top_nodes"].as_array().unwrap();
    assert!(!nodes.is_empty() && nodes.len() <= top, "{}", nodes.len());
    for pair in nodes.windows(2) {
        assert!(num(&pair[0]["ms"]) >= num(&pair[1]["ms"]), "slowest first");
    }
    for n in nodes {
        assert!(n["node"].is_string() && n["tract_op"].is_string(), "{n}");
    }
    kinds
        .iter()
        .map(|k| k["op"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn run_profiles_both_paths_with_the_fused_attention_as_an_op_kind() {
    let inputs = model("bert_eager.inputs.npz");
    let o = attnrt(&[
        "run",
        &model("bert_eager.ts.onnx"),
        "--input-npz",
        &inputs,
        "--threads",
        "1",
        "--profile",
        "--profile-top",
        "3",
        "--json",
    ]);
    let v = json(&o);
    assert_eq!(v["ok"], true);
    let fused = check_profile(&v["profile"]["fused"], 3);
    let unfused = check_profile(&v["profile"]["unfused"], 3);
    assert!(fused.contains(&"Attention".to_string()), "{fused:?}");
    assert!(!unfused.contains(&"Attention".to_string()), "{unfused:?}");
    // The unfused attention's ONNX ops are there by their ONNX names.
    for op in ["MatMul", "Softmax"] {
        assert!(unfused.contains(&op.to_string()), "{op} in {unfused:?}");
    }
    assert_eq!(v["profile"]["fused"]["runs"], 1);
    assert_eq!(
        v["profile"]["fused"]["top_nodes"].as_array().unwrap().len(),
        3
    );
}

#[test]
fn run_prints_the_profile_as_text_and_only_when_asked() {
    let m = model("mha_seed.ts.onnx");
    let o = attnrt(&["run", &m, "--threads", "1", "--profile"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "profile (fused, 1 run)",
        "profile (unfused, 1 run)",
        "op kind",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("Attention")),
        "{text}"
    );
    let o = attnrt(&["run", &m, "--threads", "1", "--json"]);
    assert!(json(&o)["profile"].is_null());
    let o = attnrt(&["run", &m, "--profile-top", "3"]);
    assert_eq!(o.status.code(), Some(2), "--profile-top needs --profile");
}

#[test]
fn bench_profiles_its_timed_runs() {
    let o = attnrt(&[
        "bench",
        &model("mha_seed.ts.onnx"),
        "--warmup",
        "1",
        "--reps",
        "2",
        "--threads",
        "1",
        "--profile",
        "--json",
    ]);
    let v = json(&o);
    for path in ["fused", "unfused"] {
        let p = &v["profile"][path];
        assert_eq!(p["runs"], 2, "{path}: {p}");
        check_profile(p, 10);
    }
    let o = attnrt(&[
        "bench",
        &model("mha_seed.ts.onnx"),
        "--reps",
        "1",
        "--profile",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("profile (fused, 1 run)"), "{text}");
}
