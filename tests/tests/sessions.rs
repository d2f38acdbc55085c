//! Sessions that outlive a shape: one [`Session`] per shipped model (original and fused) serves
//! every saved case (a decoder's prefill and decode steps) or the saved inputs and inputs of
//! another batch and sequence length, and gives what a session planned for exactly those shapes
//! gives.
//!
//! Where tract can plan a model with its symbolic dimensions kept symbolic, both shapes must be
//! served by that one plan; the models where it cannot are listed in [`PER_SHAPE`] with tract's
//! reason, and get one plan per shape (still correct, slower to start).
//!
//! Tolerance: |a − b| ≤ 1e-5 + 1e-5·|b| — the same ops on the same inputs; a symbolic plan may
//! pick other matmul kernels than a concrete one.

use std::collections::BTreeMap;

use attnrt::harness::{diff_outputs, prepare_inputs, read_npz_tensors, InputOptions, Tolerance};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::{load_model, Limits, ModelProto};
use attnrt_runtime::{
    declared_inputs, run_once, DeclaredDim, NamedTensor, Session, SessionOptions, Threads,
};
use attnrt_tests::{manifest, models_dir};

const SAME_OPS: Tolerance = Tolerance {
    atol: 1e-5,
    rtol: 1e-5,
};

/// Models tract cannot plan with symbolic dimensions (by file-name prefix), and why. Their
/// sessions refuse the symbolic plan once and then plan per shape.
const PER_SHAPE: &[(&str, &str)] = &[
    (
        "torch_",
        "TorchScript exports of nn.MultiheadAttention bake the example's sequence length into \
         their Reshape targets: tract refuses the symbolic volume (the .ts files only)",
    ),
    (
        "bert_",
        "TorchScript: tract's Flatten rule cannot plan `Flatten(attention_mask, axis=2)` with \
         symbols; dynamo: tract plans the padding mask as [batch, 1, sequence, sequence] where \
         the graph computes [batch, 1, 1, sequence], caught by the plan's shape check",
    ),
    ("distilbert_", "as bert_"),
    ("gpt2_", "as bert_ (dynamo: the causal mask's And)"),
    ("llama_", "as gpt2_"),
    ("t5_", "as bert_"),
    ("bart_", "as bert_"),
    (
        "whisper_optimum.decoder_merged",
        "optimum's merged decoder: one graph per value of `use_cache_branch`, so a plan per \
         branch (its two cases take one each)",
    ),
    (
        "whisper_optimum.decoder.",
        "optimum's decoder without past: tract's symbolic plan of the self-attention's causal \
         mask Add does not broadcast at run time (\"Can not broadcast 4 against 2\")",
    ),
];

/// Another batch and sequence length than the saved inputs (2 × 10), for the dimension
/// names `model` declares.
fn other_dims(model: &ModelProto) -> BTreeMap<String, usize> {
    let declared: Vec<String> = declared_inputs(model)
        .unwrap()
        .into_iter()
        .flat_map(|i| i.dims)
        .filter_map(|d| match d {
            DeclaredDim::Symbol(s) => Some(s),
            DeclaredDim::Fixed(_) => None,
        })
        .collect();
    [
        ("batch", 3),
        ("sequence", 13),
        ("q_sequence", 5),
        ("kv_sequence", 13),
        ("encoder_sequence", 13),
        ("decoder_sequence", 5),
    ]
    .into_iter()
    .filter(|(k, _)| declared.iter().any(|d| d == k))
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

struct Served {
    file: String,
    plans: usize,
    refusals: Vec<String>,
}

/// Runs both cases through one dynamic session and each through its own per-shape session.
fn serve(
    model: &ModelProto,
    what: &str,
    cases: &[Vec<NamedTensor>],
    threads: &Threads,
    failures: &mut Vec<String>,
) -> Served {
    let session = Session::new(model, threads, what, &SessionOptions::default())
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    for (i, inputs) in cases.iter().enumerate() {
        let got = session
            .run(inputs)
            .unwrap_or_else(|e| panic!("{what} case {i}: {e:#}"));
        let want = run_once(model, inputs, threads, what)
            .unwrap_or_else(|e| panic!("{what} case {i} (per-shape): {e:#}"))
            .outputs;
        for d in diff_outputs(&got, &want, SAME_OPS).iter().filter(|d| !d.ok) {
            failures.push(format!(
                "{what} case {i}: output '{}' differs from a per-shape session: max_abs {:.3e}",
                d.name, d.max_abs
            ));
        }
    }
    let stats = session.plan_stats();
    Served {
        file: what.to_string(),
        plans: stats.built,
        refusals: stats.refusals,
    }
}

#[test]
fn one_session_serves_every_shape_of_every_shipped_model() {
    let threads = Threads::new(Some(2)).unwrap();
    let mut failures = Vec::new();
    let mut served = Vec::new();
    for m in manifest().unwrap() {
        let path = models_dir().join(&m.file);
        let loaded = load_model(&path, &Limits::default()).unwrap();
        // Every saved case (a decoder's prefill and decode steps), and for single-case models
        // whose export serves other sizes, seeded inputs of another batch and length.
        let mut cases: Vec<Vec<NamedTensor>> = m
            .cases()
            .iter()
            .map(|c| read_npz_tensors(&models_dir().join(&c.inputs_npz), 1 << 28).unwrap())
            .collect();
        if cases.len() == 1 && m.dynamic_shapes_work() {
            let options = InputOptions {
                dims: other_dims(&loaded.model),
                max_elements: 1 << 28,
                ..InputOptions::default()
            };
            cases.push(prepare_inputs(&loaded.model, &options).unwrap().tensors);
        }
        served.push(serve(
            &loaded.model,
            &m.file,
            &cases,
            &threads,
            &mut failures,
        ));
        let fused = fuse(&loaded.model, &FusionOptions::default()).unwrap();
        if !fused.report.blocks.is_empty() {
            let what = format!("fused {}", m.file);
            served.push(serve(&fused.model, &what, &cases, &threads, &mut failures));
        }
    }
    for s in &served {
        eprintln!(
            "{}: {} plan(s){}",
            s.file,
            s.plans,
            s.refusals
                .first()
                .map(|r| format!(" — symbolic refused: {r}"))
                .unwrap_or_default()
        );
        let file = s.file.trim_start_matches("fused ");
        let listed = PER_SHAPE.iter().any(|(prefix, _)| {
            file.starts_with(prefix) && (*prefix != "torch_" || file.contains(".ts."))
        });
        if !listed && s.plans != 1 {
            failures.push(format!(
                "{}: served by {} plans, expected one symbolic plan ({:?})",
                s.file, s.plans, s.refusals
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
