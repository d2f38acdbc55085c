//! `attnrt generate` end to end on a shipped decoder with a KV cache: the JSON report, the
//! lockstep check, a text prompt through a tokenizer.json, and clean refusals.

mod common;

use common::{attnrt, model};

use std::path::{Path, PathBuf};
use std::process::Output;

fn json(o: &Output) -> serde_json::Value {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("--json prints one JSON object")
}

fn one_error_line(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("error: ") && err.contains(needle),
        "{err}"
    );
}

#[test]
fn generate_checks_every_step_against_the_unfused_graph() {
    let m = model("gpt2_cache_sdpa.dynamo.onnx");
    let v = json(&attnrt(&[
        "generate",
        &m,
        "--prompt-len",
        "4",
        "--seed",
        "7",
        "--max-new-tokens",
        "5",
        "--check",
        "--json",
        "--threads",
        "1",
    ]));
    let r = &v["report"];
    assert_eq!(r["prompt"].as_array().unwrap().len(), 4);
    assert_eq!(r["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(r["check_ok"], true);
    assert_eq!(r["plans"]["built"], 2);
    assert_eq!(v["fused_blocks"], 2);
    let steps = r["steps"].as_array().unwrap();
    let pasts: Vec<u64> = steps.iter().map(|s| s["past"].as_u64().unwrap()).collect();
    assert_eq!(pasts, [0, 4, 5, 6, 7]);
    assert!(steps.iter().all(|s| s["check"]["ok"] == true));
}

/// A word-level tokenizer over the tiny models' 100-token vocabulary: `w0` … `w99`.
fn tokenizer_json(dir: &Path) -> PathBuf {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..100)
        .map(|i| (format!("w{i}"), serde_json::json!(i)))
        .collect();
    let t = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(&t).unwrap()).unwrap();
    path
}

#[test]
fn generate_encodes_and_decodes_text_with_a_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer_json(dir.path());
    let m = model("llama_cache_eager.ts.onnx");
    let v = json(&attnrt(&[
        "generate",
        &m,
        "--tokenizer",
        tok.to_str().unwrap(),
        "--prompt",
        "w1 w2 w3",
        "--max-new-tokens",
        "4",
        "--json",
    ]));
    assert_eq!(v["report"]["prompt"], serde_json::json!([1, 2, 3]));
    let tokens: Vec<i64> = v["report"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect();
    let text = v["text"].as_str().unwrap();
    let words: Vec<String> = tokens.iter().map(|t| format!("w{t}")).collect();
    assert_eq!(text, words.join(" "), "decoded text of {tokens:?}");
}

#[test]
fn generate_refuses_models_and_prompts_it_cannot_run() {
    one_error_line(
        &attnrt(&["generate", &model("bert_eager.ts.onnx")]),
        "no cache inputs",
    );
    one_error_line(
        &attnrt(&[
            "generate",
            &model("gpt2_cache_eager.ts.onnx"),
            "--prompt-ids",
            "1,2,300",
        ]),
        "outside the vocabulary [0, 100)",
    );
    let o = attnrt(&[
        "generate",
        &model("gpt2_cache_eager.ts.onnx"),
        "--prompt",
        "hi",
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--prompt without --tokenizer is a usage error"
    );
}

/// `--do-sample` with the processors: checked against the unfused graph (same draws), the same
/// `--seed` gives the same tokens on 1 and 2 threads; bad values are refused by name.
#[test]
fn generate_samples_with_a_seed() {
    let m = model("llama_cache_eager.ts.onnx");
    let run = |seed: &str, threads: &str| {
        let v = json(&attnrt(&[
            "generate",
            &m,
            "--prompt-ids",
            "5,9,2",
            "--max-new-tokens",
            "10",
            "--do-sample",
            "--temperature",
            "1.3",
            "--top-k",
            "40",
            "--top-p",
            "0.9",
            "--min-p",
            "0.01",
            "--repetition-penalty",
            "1.2",
            "--seed",
            seed,
            "--check",
            "--json",
            "--threads",
            threads,
        ]));
        assert_eq!(v["report"]["check_ok"], true, "{v}");
        v["report"]["tokens"].clone()
    };
    let a = run("11", "1");
    assert_eq!(a.as_array().unwrap().len(), 10);
    assert_eq!(a, run("11", "2"), "same seed, other thread count");
    assert_ne!(a, run("12", "1"), "another seed");
    for (flag, value) in [
        ("--temperature", "0"),
        ("--top-p", "1.5"),
        ("--min-p", "1.5"),
        ("--repetition-penalty", "0"),
    ] {
        one_error_line(&attnrt(&["generate", &m, "--do-sample", flag, value]), flag);
    }
}
