//! Generation with an encoder–decoder pair: optimum's tiny Whisper (models/optimum_export.py),
//! BART and T5 (models/optimum_seq2seq.py: encoder and merged decoder, which also takes the
//! encoder's attention mask; their encoder batch has a row padded on the right),
//! its encoder (`whisper_optimum.encoder.onnx`) and merged decoder
//! (`whisper_optimum.decoder_merged.onnx`, both caches, one `If` on `use_cache_branch`). The
//! encoder runs once; the first decoder step computes the cross-attention keys and values,
//! every later step takes them back unchanged while the self-attention cache grows. The
//! decoder with past (`whisper_optimum.decoder_with_past.onnx`) generates too, its first step
//! made by the decoder without past (`whisper_optimum.decoder.onnx`).
//!
//! The tokens are compared with PyTorch's greedy loop over the same seeded model
//! (`whisper_optimum.greedy.npz`, written by the export script: transformers' encoder once,
//! then its decoder with its cache), and the fused pipeline runs in lockstep with the unfused
//! one (same tokens every step, logits within |a − b| ≤ 1e-4 + 1e-4·|b|). The reference tokens
//! depend on the encoder's states (the export script checks it), so a lost or stale
//! cross-attention cache fails here. Bad pairs are refused with the file and input named.

use std::path::{Path, PathBuf};

use attnrt::generate::{
    GenerationOptions, GenerationReport, Generator, KvCacheMode, SamplingOptions,
};
use attnrt::harness::{read_npz_tensors, Tolerance};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::{load_model, Limits, ModelProto};
use attnrt_runtime::{NamedTensor, SessionOptions, Tensor, Threads};

const ENCODER: &str = "whisper_optimum.encoder.onnx";
const DECODER: &str = "whisper_optimum.decoder_merged.onnx";

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn load(file: &str) -> ModelProto {
    load_model(&models_dir().join(file), &Limits::default())
        .unwrap_or_else(|e| panic!("{file}: {e:#}"))
        .model
}

fn fused(model: &ModelProto) -> ModelProto {
    fuse(model, &FusionOptions::default()).unwrap().model
}

fn npz(file: &str) -> Vec<NamedTensor> {
    read_npz_tensors(&models_dir().join(file), u64::MAX).unwrap()
}

fn entry<'a>(tensors: &'a [NamedTensor], name: &str) -> &'a Tensor {
    &tensors.iter().find(|t| t.name == name).unwrap().tensor
}

fn rows_of(t: &Tensor) -> Vec<Vec<i64>> {
    let t = t.cast_to::<i64>().unwrap();
    let view = t.to_plain_array_view::<i64>().unwrap();
    view.outer_iter()
        .map(|r| r.iter().copied().collect())
        .collect()
}

/// PyTorch's greedy reference: the decoder start ids and tokens of each row, and the
/// encoder's `input_features` of those rows (the saved case's, scaled per row).
struct Reference {
    starts: Vec<Vec<i64>>,
    tokens: Vec<Vec<i64>>,
    features: Vec<Tensor>,
}

fn reference() -> Reference {
    let greedy = npz("whisper_optimum.greedy.npz");
    let case = npz("whisper_optimum.encoder.case.inputs.npz");
    let features = entry(&case, "input_features")
        .to_plain_array_view::<f32>()
        .unwrap()
        .to_owned();
    let scales = entry(&greedy, "scales")
        .to_plain_array_view::<f32>()
        .unwrap();
    Reference {
        starts: rows_of(entry(&greedy, "decoder_start_ids")),
        tokens: rows_of(entry(&greedy, "tokens")),
        features: scales
            .iter()
            .map(|&s| Tensor::from(features.mapv(|x| x * s)))
            .collect(),
    }
}

/// The encoder inputs of the reference's rows `rows` (one batch).
fn features(r: &Reference, rows: &[usize]) -> Vec<NamedTensor> {
    let parts: Vec<&Tensor> = rows.iter().map(|&i| &r.features[i]).collect();
    vec![NamedTensor {
        name: "input_features".into(),
        tensor: Tensor::stack_tensors(0, &parts).unwrap(),
    }]
}

fn greedy(prompts: Vec<Vec<i64>>, n: usize, encoder_inputs: Vec<NamedTensor>) -> GenerationOptions {
    GenerationOptions {
        prompts,
        max_new_tokens: n,
        eos_token: None,
        check: Some(Tolerance {
            atol: 1e-4,
            rtol: 1e-4,
        }),
        max_length: None,
        sampling: SamplingOptions::default(),
        encoder_inputs,
        kv_cache: KvCacheMode::default(),
    }
}

/// The fused `decoder` (with the fused `first_step` when given) and `encoder`, the unfused
/// ones in lockstep.
fn checked(threads: &Threads, decoder: &str, first_step: Option<&str>, encoder: &str) -> Generator {
    let options = SessionOptions::default();
    let original = load(decoder);
    let mut g = Generator::with_options(
        &fused(&original),
        Some(&original),
        threads,
        decoder,
        &options,
    )
    .unwrap();
    if let Some(first) = first_step {
        let original = load(first);
        g = g
            .with_first_step(&fused(&original), Some(&original), threads, first, &options)
            .unwrap();
    }
    let original = load(encoder);
    g.with_encoder(
        &fused(&original),
        Some(&original),
        threads,
        encoder,
        &options,
    )
    .unwrap()
}

/// The fused Whisper pair with the unfused pair in lockstep.
fn checked_pair(threads: &Threads) -> Generator {
    checked(threads, DECODER, None, ENCODER)
}

fn rows(report: &GenerationReport) -> Vec<Vec<i64>> {
    report.rows.iter().map(|r| r.tokens.clone()).collect()
}

#[test]
fn whisper_generates_pytorchs_greedy_tokens_fused_and_unfused_alike() {
    let r = reference();
    assert_eq!(r.tokens.len(), 2);
    let n = r.tokens[0].len();
    let threads = Threads::new(Some(2)).unwrap();
    let g = checked_pair(&threads);
    // the position table is inside the merged decoder's branches
    assert_eq!(g.context().map(|c| c.positions), Some(64));
    // a batch of both rows, then each row alone
    let batch = g
        .generate(&greedy(r.starts.clone(), n, features(&r, &[0, 1])), |_| {})
        .unwrap();
    assert_eq!(batch.check_ok, Some(true), "{:#?}", batch.steps);
    assert_eq!(rows(&batch), r.tokens, "batch of 2 vs PyTorch");
    // the self-attention cache held in place (the first step's presents, made by the
    // no-cache branch, moved in), the same tokens as with the cache copied
    assert_eq!(
        batch.kv_cache.mode,
        KvCacheMode::InPlace,
        "{:?}",
        batch.kv_cache
    );
    let mut copied = greedy(r.starts.clone(), n, features(&r, &[0, 1]));
    copied.kv_cache = KvCacheMode::Copy;
    let copied = g.generate(&copied, |_| {}).unwrap();
    assert_eq!(copied.kv_cache.mode, KvCacheMode::Copy);
    assert_eq!(rows(&copied), r.tokens, "batch of 2, cache copied");
    for row in 0..2 {
        let options = greedy(vec![r.starts[row].clone()], n, features(&r, &[row]));
        let alone = g.generate(&options, |_| {}).unwrap();
        assert_eq!(alone.check_ok, Some(true), "row {row}: {:#?}", alone.steps);
        assert_eq!(alone.tokens, r.tokens[row], "row {row} alone vs PyTorch");
        assert!(alone.encoder_ms.is_some());
        let pasts: Vec<usize> = alone.steps.iter().map(|s| s.past).collect();
        assert_eq!(pasts[..3], [0, 3, 4], "the self-attention cache grows");
    }
    // one plan for the first step's branch, one for every later step's
    assert_eq!(batch.plans.built, 2, "{:?}", batch.plans);
}

#[test]
fn whisper_with_past_and_its_first_step_decoder_generate_pytorchs_tokens() {
    let r = reference();
    let n = r.tokens[0].len();
    let threads = Threads::new(Some(2)).unwrap();
    let with_past = "whisper_optimum.decoder_with_past.onnx";
    let first = Some("whisper_optimum.decoder.onnx");
    let g = checked(&threads, with_past, first, ENCODER);
    let report = g
        .generate(&greedy(r.starts.clone(), n, features(&r, &[0, 1])), |_| {})
        .unwrap();
    assert_eq!(report.check_ok, Some(true), "{:#?}", report.steps);
    assert_eq!(rows(&report), r.tokens, "batch of 2 vs PyTorch");
    // a plan for the first step's decoder, one for every later step's
    assert_eq!(report.plans.built, 2, "{:?}", report.plans);
    // the first step's presents are another decoder's tensors: the cache is copied
    let why = report.kv_cache.fallback.unwrap_or_default();
    assert!(
        why.contains("the first step runs on another decoder"),
        "{why}"
    );
}

#[test]
fn the_tokens_depend_on_the_encoder_inputs() {
    let r = reference();
    let threads = Threads::new(Some(2)).unwrap();
    let (encoder, decoder) = (load(ENCODER), load(DECODER));
    let g = Generator::new(&decoder, None, &threads, DECODER)
        .unwrap()
        .with_encoder(
            &encoder,
            None,
            &threads,
            ENCODER,
            &SessionOptions::default(),
        )
        .unwrap();
    let mut options = greedy(vec![r.starts[0].clone()], r.tokens[0].len(), Vec::new());
    options.check = None;
    let zeros = Tensor::zero::<f32>(r.features[0].shape()).unwrap();
    options.encoder_inputs = vec![NamedTensor {
        name: "input_features".into(),
        tensor: Tensor::stack_tensors(0, &[&zeros]).unwrap(),
    }];
    let silent = g.generate(&options, |_| {}).unwrap();
    assert_ne!(silent.tokens, r.tokens[0]);
}

#[test]
fn sampled_generation_agrees_with_the_unfused_pair() {
    let r = reference();
    let threads = Threads::new(Some(1)).unwrap();
    let g = checked_pair(&threads);
    let mut options = greedy(r.starts.clone(), 8, features(&r, &[0, 1]));
    options.sampling = SamplingOptions {
        do_sample: true,
        temperature: 1.3,
        top_p: 0.9,
        seed: 3,
        ..SamplingOptions::default()
    };
    let report = g.generate(&options, |_| {}).unwrap();
    assert_eq!(report.check_ok, Some(true), "{:#?}", report.steps);
    assert_eq!(report.rows[1].tokens.len(), 8);
}

#[test]
fn bart_and_t5_generate_pytorchs_greedy_tokens_fused_and_unfused_alike() {
    let threads = Threads::new(Some(2)).unwrap();
    for name in ["bart_optimum", "t5_optimum"] {
        let (encoder, decoder) = (
            format!("{name}.encoder.onnx"),
            format!("{name}.decoder_merged.onnx"),
        );
        let g = checked(&threads, &decoder, None, &encoder);
        assert!(g.signature().encoder_mask.is_some(), "{name}");
        let saved = npz(&format!("{name}.greedy.npz"));
        let encoder_inputs: Vec<NamedTensor> = saved
            .iter()
            .filter(|t| t.name == "input_ids" || t.name == "attention_mask")
            .cloned()
            .collect();
        let want = rows_of(entry(&saved, "tokens"));
        let starts = rows_of(entry(&saved, "decoder_start_ids"));
        let report = g
            .generate(
                &greedy(starts.clone(), want[0].len(), encoder_inputs.clone()),
                |_| {},
            )
            .unwrap();
        assert_eq!(report.check_ok, Some(true), "{name}: {:#?}", report.steps);
        assert_eq!(rows(&report), want, "{name} vs PyTorch");
        // the self-attention cache in place (the fusion sizes present from past's shape plus
        // the new rows, whose head size nothing reads), as with the cache copied
        assert_eq!(
            report.kv_cache.mode,
            KvCacheMode::InPlace,
            "{name}: {:?}",
            report.kv_cache
        );
        let mut copied = greedy(starts.clone(), want[0].len(), encoder_inputs.clone());
        copied.kv_cache = KvCacheMode::Copy;
        let copied = g.generate(&copied, |_| {}).unwrap();
        assert_eq!(rows(&copied), want, "{name}, cache copied");
    }
}

fn error_of<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn bad_pairs_are_refused_with_the_file_and_input_named() {
    let threads = Threads::new(Some(1)).unwrap();
    let options = SessionOptions::default();
    let r = reference();
    // the merged decoder without its encoder
    let decoder = load(DECODER);
    let alone = Generator::new(&decoder, None, &threads, DECODER).unwrap();
    let e = error_of(alone.start(&greedy(vec![vec![1]], 2, Vec::new())));
    assert!(
        e.contains(DECODER) && e.contains("encoder_hidden_states"),
        "{e}"
    );
    // the decoder with past alone cannot make its first step, nor feed an encoder's states
    let with_past = "whisper_optimum.decoder_with_past.onnx";
    let g = Generator::new(&load(with_past), None, &threads, with_past).unwrap();
    let e = error_of(g.start(&greedy(vec![vec![1]], 2, Vec::new())));
    assert!(
        e.contains(with_past) && e.contains("past_key_values.0.encoder.key"),
        "{e}"
    );
    assert!(e.contains("--first-step"), "{e}");
    let e = error_of(g.with_encoder(&load(ENCODER), None, &threads, ENCODER, &options));
    assert!(e.contains(with_past) && e.contains("--first-step"), "{e}");
    // a first step that does not give the presents the decoder takes
    let e = error_of(
        Generator::new(&load(with_past), None, &threads, with_past)
            .unwrap()
            .with_first_step(&load(ENCODER), None, &threads, ENCODER, &options),
    );
    assert!(e.contains(ENCODER) && e.contains("'logits'"), "{e}");
    // a decoder-only model has nothing for an encoder to feed
    let llama = "llama_cache_optimum.onnx";
    let e = error_of(
        Generator::new(&load(llama), None, &threads, llama)
            .unwrap()
            .with_encoder(&load(ENCODER), None, &threads, ENCODER, &options),
    );
    assert!(e.contains(llama) && e.contains(ENCODER), "{e}");
    // an "encoder" none of whose outputs gives the decoder's states
    let gpt2 = "gpt2_cache_eager.ts.onnx";
    let e = error_of(alone.with_encoder(&load(gpt2), None, &threads, gpt2, &options));
    assert!(
        e.contains(gpt2) && e.contains("'encoder_hidden_states'"),
        "{e}"
    );
    // one row of encoder inputs for two prompts
    let g = Generator::new(&decoder, None, &threads, DECODER)
        .unwrap()
        .with_encoder(&load(ENCODER), None, &threads, ENCODER, &options)
        .unwrap();
    let e = error_of(g.start(&greedy(r.starts.clone(), 2, features(&r, &[0]))));
    assert!(
        e.contains("last_hidden_state") && e.contains("2 row(s)"),
        "{e}"
    );
}
