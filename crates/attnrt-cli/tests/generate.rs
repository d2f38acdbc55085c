//! `attnrt generate` end to end on a shipped decoder with a KV cache: the JSON report, the
//! lockstep check, a text prompt through a tokenizer.json, the stop at the model's context
//! with the tokens kept (also when a step fails), and clean refusals.

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
    assert_eq!(r["kv_cache"]["mode"], "in-place");
    assert_eq!(r["kv_cache"]["fallback"], serde_json::Value::Null);
}

/// `--kv-cache copy` keeps the cache as tensors (the same tokens as in place); an unknown mode
/// is a usage error.
#[test]
fn kv_cache_copy_gives_the_in_place_tokens() {
    let m = model("llama_cache_eager.ts.onnx");
    let run = |mode: &str| {
        let args = ["generate", &m, "--prompt-len", "6", "--max-new-tokens", "6"];
        json(&attnrt(
            &[&args[..], &["--json", "--kv-cache", mode]].concat(),
        ))
    };
    let (copied, held) = (run("copy"), run("in-place"));
    assert_eq!(copied["report"]["kv_cache"]["mode"], "copy");
    assert_eq!(held["report"]["kv_cache"]["mode"], "in-place");
    assert_eq!(copied["report"]["tokens"], held["report"]["tokens"]);
    let o = attnrt(&["generate", &m, "--prompt-len", "2", "--kv-cache", "paged"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("'paged'"));
}

/// `--node-times` puts each step's time inside its nodes in `--json` (null without it) and the
/// median time outside them in the report and the text, with the same tokens.
#[test]
fn node_times_show_what_a_step_costs_outside_its_nodes() {
    let m = model("llama_cache_eager.ts.onnx");
    let args = ["generate", &m, "--prompt-len", "6", "--max-new-tokens", "4"];
    let run = |extra: &[&str]| json(&attnrt(&[&args[..], &["--json"], extra].concat()));
    let (plain, timed) = (run(&[]), run(&["--node-times"]));
    let steps = |v: &serde_json::Value| v["report"]["steps"].as_array().unwrap().clone();
    assert!(steps(&plain).iter().all(|s| s["nodes_ms"].is_null()));
    assert!(plain["report"]["median_step_outside_ms"].is_null());
    assert!(steps(&timed).iter().all(|s| s["nodes_ms"].is_f64()));
    assert!(timed["report"]["median_step_outside_ms"].is_f64());
    assert_eq!(plain["report"]["tokens"], timed["report"]["tokens"]);
    let o = attnrt(&[&args[..], &["--node-times"]].concat());
    assert!(String::from_utf8_lossy(&o.stdout).contains("ms of it outside the nodes"));
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

fn tokens(v: &serde_json::Value) -> usize {
    v["report"]["tokens"].as_array().unwrap().len()
}

/// GPT-2's position table has 128 rows: asked for 2000 tokens after a prompt of 8, generation
/// stops when the prompt and the tokens fill them, prints the 120 tokens and says why.
#[test]
fn generate_stops_at_the_models_context_and_keeps_the_tokens() {
    let m = model("gpt2_cache_eager.ts.onnx");
    let args = ["generate", &m, "--max-new-tokens", "2000", "--threads", "1"];
    let o = attnrt(&[&args[..], &["--json"]].concat());
    let v = json(&o);
    assert_eq!(v["report"]["prompt"].as_array().unwrap().len(), 8);
    assert_eq!(tokens(&v), 128 - 8);
    assert_eq!(v["report"]["stopped"], "context");
    assert_eq!(v["report"]["context"]["positions"], 128);
    assert_eq!(
        v["report"]["context"]["table"],
        "model.transformer.wpe.weight"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "note: stopped at the model's context of 128 positions (position table \
             'model.transformer.wpe.weight' has 128 rows): 8 prompt and 120 generated token(s)"
        ),
        "{err}"
    );
    let o = attnrt(&args);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("generated: 120 token(s): "), "{out}");
    // --max-length stops earlier, and a prompt longer than it is refused.
    let v = json(&attnrt(
        &[&args[..], &["--json", "--max-length", "20"]].concat(),
    ));
    assert_eq!(
        (tokens(&v), &v["report"]["stopped"]),
        (12, &serde_json::json!("context"))
    );
    one_error_line(
        &attnrt(&[&args[..], &["--prompt-len", "30", "--max-length", "20"]].concat()),
        "the prompt's 30 tokens do not fit the maximum length of 20 positions",
    );
}

/// Past the position table (a --max-length beyond it), the position lookup's index check fails
/// (tract's Gather would index past the table): the tokens made before the failing step are
/// printed, then the error, exit code 1.
#[test]
fn a_failing_step_keeps_the_tokens_made_before_it() {
    let m = model("gpt2_cache_eager.ts.onnx");
    let o = attnrt(&[
        "generate",
        &m,
        "--max-new-tokens",
        "2000",
        "--max-length",
        "200",
        "--threads",
        "1",
        "--json",
    ]);
    one_error_line(&o, "step 121 failed after 121 generated token(s)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("node '/model/transformer/wpe/Gather'"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the partial report");
    // Positions 0..=127 were fed: the prompt's 8, then 120 tokens, the last giving one more.
    assert_eq!(tokens(&v), 121);
    assert_eq!(v["report"]["stopped"], "error");
    let error = v["report"]["error"].as_str().unwrap();
    assert!(
        error.contains("index 128 is outside [-128, 128)") && !error.contains("panic"),
        "{error}"
    );
}

/// `--prompt-ids` given several times runs one batch: `--json` has one entry per row under
/// `"rows"`, each row's tokens those of its prompt alone; the check covers every row.
#[test]
fn several_prompt_ids_run_as_one_batch() {
    let m = model("gpt2_cache_eager.ts.onnx");
    let run = |prompts: &[&str]| {
        let mut args = vec!["generate", &m, "--max-new-tokens", "4", "--check", "--json"];
        for p in prompts {
            args.extend(["--prompt-ids", p]);
        }
        json(&attnrt(&args))
    };
    let v = run(&["5,6,7", "1,2,3,4,5,6"]);
    assert_eq!(v["report"]["check_ok"], true, "{v}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["prompt"], serde_json::json!([1, 2, 3, 4, 5, 6]));
    for (row, prompt) in rows.iter().zip(["5,6,7", "1,2,3,4,5,6"]) {
        let alone = run(&[prompt]);
        assert_eq!(row["tokens"], alone["rows"][0]["tokens"], "{prompt}");
        assert_eq!(row["tokens"].as_array().unwrap().len(), 4);
    }
    let bad = attnrt(&["generate", &m, "--prompt-ids", "1,x"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("'x' is not a token id"));
}

/// With a tokenizer the text streams to stdout as it is made (first line), and `--stop` ends a
/// row where its text reaches the string: the text ends before it, the row's tokens stop
/// growing, and `--json` says `"stopped": "stop"` for it.
#[test]
fn text_streams_and_stop_strings_end_rows() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer_json(dir.path());
    let tok = tok.to_str().unwrap();
    let m = model("llama_cache_eager.ts.onnx");
    let base = ["generate", &m, "--tokenizer", tok, "--prompt", "w1 w2 w3"];
    let free = json(&attnrt(
        &[&base[..], &["--max-new-tokens", "8", "--json"]].concat(),
    ));
    let words: Vec<String> = free["rows"][0]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("w{}", t.as_i64().unwrap()))
        .collect();
    let o = attnrt(&[&base[..], &["--max-new-tokens", "8"]].concat());
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.lines().next().unwrap(),
        format!("text: {}", words.join(" "))
    );
    // stop at the text of the 4th and 5th words: the row ends after the 5th token
    let stop = format!("{} {}", words[3], words[4]);
    let v = json(&attnrt(
        &[
            &base[..],
            &["--max-new-tokens", "8", "--json", "--stop", &stop],
        ]
        .concat(),
    ));
    let row = &v["rows"][0];
    assert_eq!(row["stopped"], "stop", "{v}");
    assert_eq!(row["tokens"].as_array().unwrap().len(), 5, "{v}");
    assert_eq!(row["text"], format!("{} ", words[..3].join(" ")), "{v}");
    assert_eq!(v["report"]["stopped"], "stop");
    let o = attnrt(&["generate", &m, "--stop", "x"]);
    assert_eq!(o.status.code(), Some(2), "--stop without --tokenizer");
}

#[test]
fn an_encoder_decoder_pair_generates_from_decoder_start_ids() {
    let (decoder, encoder) = (
        model("whisper_optimum.decoder_merged.onnx"),
        model("whisper_optimum.encoder.onnx"),
    );
    let features = model("whisper_optimum.encoder.case.inputs.npz");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            &decoder,
            "--encoder",
            &encoder,
            "--decoder-start-ids",
            "1,5,7",
            "--json",
            "--threads",
            "1",
        ];
        args.extend_from_slice(extra);
        attnrt(&args)
    };
    let v = json(&run(&[
        "--encoder-inputs",
        &features,
        "--max-new-tokens",
        "12",
        "--check",
    ]));
    let r = &v["report"];
    assert_eq!(r["check_ok"], true);
    assert_eq!(v["fused_blocks"], 8);
    assert_eq!(v["encoder"]["fused_blocks"], 2);
    assert!(r["encoder_ms"].as_f64().is_some());
    // PyTorch's greedy tokens for these features and start ids: row 0 of
    // models/whisper_optimum.greedy.npz
    let greedy = model("whisper_optimum.greedy.npz");
    let saved = attnrt::harness::read_npz_tensors(Path::new(&greedy), u64::MAX).unwrap();
    let want = &saved.iter().find(|t| t.name == "tokens").unwrap().tensor;
    let want = want.to_plain_array_view::<i64>().unwrap();
    let got: Vec<i64> = r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect();
    let row0: Vec<i64> = want.outer_iter().next().unwrap().iter().copied().collect();
    assert_eq!(got, row0);
    // the decoder with past, its first step made by the decoder without past: the same tokens
    let with_past = model("whisper_optimum.decoder_with_past.onnx");
    let first = model("whisper_optimum.decoder.onnx");
    let v = json(&attnrt(&[
        "generate",
        &with_past,
        "--first-step",
        &first,
        "--encoder",
        &encoder,
        "--encoder-inputs",
        &features,
        "--decoder-start-ids",
        "1,5,7",
        "--max-new-tokens",
        "12",
        "--json",
        "--threads",
        "1",
    ]));
    assert_eq!(v["report"]["tokens"], r["tokens"]);
    assert_eq!(v["first_step"]["fused_blocks"], 4);
    // past the decoder's 64 positions (its table is inside the merged decoder's branches)
    let v = json(&run(&["--max-new-tokens", "80"]));
    assert_eq!(v["report"]["stopped"], "context");
    assert_eq!(tokens(&v), 61);
    // the decoder without its encoder
    let o = attnrt(&["generate", &decoder, "--decoder-start-ids", "1"]);
    one_error_line(&o, "--encoder");
}
