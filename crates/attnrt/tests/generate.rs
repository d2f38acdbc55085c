//! Generation over the shipped decoders with a KV cache (GPT-2 and LLaMA-GQA, TorchScript and
//! dynamo, eager and SDPA): the fused graph generates the same tokens as the original graph in
//! lockstep, with logits within |a − b| ≤ 1e-4 + 1e-4·|b| (the kernel reassociates sums), and
//! one session serves the prompt and every decode step with two plans. Generation stops at the
//! model's context (GPT-2's position table) or a given maximum length, and a failing step keeps
//! the tokens made before it. Bad decoders are refused with the input or output named.

use std::path::{Path, PathBuf};

use attnrt::generate::{
    context, DecoderSignature, GenerationFailed, GenerationOptions, Generator, KvCacheMode,
    SamplingOptions, StopReason,
};
use attnrt::harness::Tolerance;
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::{load_model, Limits, ModelProto};
use attnrt_runtime::Threads;

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn decoders() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(models_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|f| f.contains("_cache_") && f.ends_with(".onnx"))
        .collect();
    files.sort();
    files
}

fn load(file: &str) -> ModelProto {
    load_model(&models_dir().join(file), &Limits::default())
        .unwrap_or_else(|e| panic!("{file}: {e:#}"))
        .model
}

#[test]
fn fused_decoders_generate_the_unfused_tokens_with_two_plans() {
    let files = decoders();
    assert!(
        files.len() >= 8,
        "decoders with a cache in models/: {files:?}"
    );
    let threads = Threads::new(Some(2)).unwrap();
    let tol = Tolerance {
        atol: 1e-4,
        rtol: 1e-4,
    };
    for file in files {
        let original = load(&file);
        let fused = fuse(&original, &FusionOptions::default()).unwrap().model;
        let generator = Generator::new(&fused, Some(&original), &threads, &file).unwrap();
        // the prompt's plan and the decode steps' are made while the model loads
        let loaded = generator.plan_stats();
        assert_eq!(loaded.built, 2, "{file}: {loaded:?}");
        let options = GenerationOptions {
            prompts: vec![vec![3, 14, 15, 92, 65]],
            max_new_tokens: 6,
            eos_token: None,
            check: Some(tol),
            sampling: SamplingOptions::default(),
            max_length: None,
            encoder_inputs: Vec::new(),
            kv_cache: KvCacheMode::default(),
        };
        let mut seen = 0;
        let report = generator.generate(&options, |_| seen += 1).unwrap();
        assert_eq!(report.tokens.len(), 6, "{file}");
        assert_eq!(seen, 6, "{file}: one callback per step");
        assert_eq!(report.check_ok, Some(true), "{file}: {:#?}", report.steps);
        assert_eq!(
            report.plans.built, 2,
            "{file}: one plan for the prompt and one for every decode step: {:?}",
            report.plans
        );
        assert!(
            report.plans.refusals.is_empty(),
            "{file}: {:?}",
            report.plans
        );
        let pasts: Vec<usize> = report.steps.iter().map(|s| s.past).collect();
        assert_eq!(pasts, [0, 5, 6, 7, 8, 9], "{file}");
        // the decode steps' plan was made before the prompt ran: no decode step plans
        let planned: Vec<f64> = report.steps[1..].iter().map(|s| s.planning_ms).collect();
        assert!(planned.iter().all(|&ms| ms == 0.0), "{file}: {planned:?}");
    }
}

/// Issue 26 (time to first token): the prompt's plan is made when the generator is built, with
/// the prompt's length symbolic in it, so no prompt of one row plans again, whatever its length.
#[test]
fn the_prompt_plan_made_at_load_serves_every_prompt_length() {
    let threads = Threads::new(Some(2)).unwrap();
    for file in decoders() {
        let original = load(&file);
        let fused = fuse(&original, &FusionOptions::default()).unwrap().model;
        let g = Generator::new(&fused, None, &threads, &file).unwrap();
        let loaded = g.plan_stats();
        for len in [2, 9, 23] {
            let prompt = (0..len).map(|i| (i * 7 + 3) % 90).collect();
            let report = g.generate(&greedy(vec![prompt], 2), |_| {}).unwrap();
            let planned: Vec<f64> = report.steps.iter().map(|s| s.planning_ms).collect();
            assert_eq!(planned, [0.0, 0.0], "{file}: prompt of {len}");
        }
        let after = g.plan_stats();
        assert_eq!(after.built, loaded.built, "{file}: {after:?}");
        assert!(after.refusals.is_empty(), "{file}: {after:?}");
    }
}

/// A step's logits are computed at its last position only where the graph's logits are a
/// product by a constant weight (the float decoders; not the dynamically quantized ones, whose
/// activations' scale spans every position): the prompt's tokens and logits are those of the
/// same graph computing every position's logits (the reference here), within the rounding of a
/// one-row product against a many-row one; the decode steps' are identical.
#[test]
fn logits_at_the_last_position_only_are_the_full_logits_last_row() {
    let threads = Threads::new(Some(2)).unwrap();
    let tol = Tolerance {
        atol: 1e-5,
        rtol: 1e-5,
    };
    for file in decoders() {
        let model = load(&file);
        let g = Generator::new(&model, Some(&model), &threads, &file).unwrap();
        let quantized = file.contains(".qint8");
        assert_eq!(g.last_position_logits(), !quantized, "{file}");
        let mut options = greedy(vec![vec![5, 17, 2, 88, 41, 9, 63]], 4);
        options.check = Some(tol);
        let report = g.generate(&options, |_| {}).unwrap();
        assert_eq!(report.check_ok, Some(true), "{file}: {:#?}", report.steps);
        for s in &report.steps {
            let c = s.check.as_ref().unwrap();
            let positions = if quantized && s.step == 0 { 7 } else { 1 };
            assert_eq!(
                c.logits.shape,
                [1, positions, 100],
                "{file}: step {}",
                s.step
            );
            if s.step > 0 || quantized {
                assert_eq!(c.logits.max_abs, 0.0, "{file}: step {}", s.step);
            }
        }
    }
}

/// Issue 26: the rewrite to the last position slices axis 1 of the product's input, exact for
/// hidden states `[batch, sequence, hidden]` only. A hand-built decoder whose hidden states are
/// `[batch·sequence, hidden]` (its product broadcast to `[1, batch·sequence, vocab]` by a bias,
/// or reshaped after) or sequence-major (transposed before the product and back after) is
/// left at every position, with the reason given; its steps' logits equal the same graph's
/// (the reference, every position) exactly, and its greedy tokens are those of the
/// `[batch, sequence, hidden]` layout, which is rewritten.
#[test]
fn hidden_states_of_another_layout_keep_every_positions_logits() {
    use attnrt_testkit::lm_head::{lm_head_decoder, HiddenLayout, VOCAB};
    let threads = Threads::new(Some(1)).unwrap();
    let exact = Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };
    let prompt = vec![3, 1, 4, 1, 5];
    let mut tokens = Vec::new();
    for layout in [
        HiddenLayout::BatchMajor,
        HiddenLayout::Flat,
        HiddenLayout::FlatReshaped,
        HiddenLayout::SequenceMajor,
    ] {
        let what = format!("{layout:?}");
        let model = lm_head_decoder(layout);
        let g = Generator::new(&model, Some(&model), &threads, &what).unwrap();
        let rewritten = layout == HiddenLayout::BatchMajor;
        assert_eq!(g.last_position_logits(), rewritten, "{what}");
        assert_eq!(
            g.last_position_refusal().is_none(),
            rewritten,
            "{what}: {:?}",
            g.last_position_refusal()
        );
        let mut options = greedy(vec![prompt.clone()], 3);
        options.check = Some(exact);
        let report = g.generate(&options, |_| {}).unwrap();
        assert_eq!(report.check_ok, Some(true), "{what}: {:#?}", report.steps);
        let prefill = report.steps[0].check.as_ref().unwrap();
        let positions = if rewritten { 1 } else { prompt.len() };
        assert_eq!(
            prefill.logits.shape,
            [1, positions, VOCAB as usize],
            "{what}"
        );
        tokens.push(report.tokens);
    }
    assert!(tokens.iter().all(|t| *t == tokens[0]), "{tokens:?}");
}

#[test]
fn eos_stops_generation_and_keeps_the_token() {
    let file = &decoders()[0];
    let model = load(file);
    let threads = Threads::new(Some(1)).unwrap();
    let g = Generator::new(&model, None, &threads, file).unwrap();
    let mut options = GenerationOptions {
        prompts: vec![vec![1, 2, 3]],
        max_new_tokens: 5,
        eos_token: None,
        check: None,
        sampling: SamplingOptions::default(),
        max_length: None,
        encoder_inputs: Vec::new(),
        kv_cache: KvCacheMode::default(),
    };
    let free = g.generate(&options, |_| {}).unwrap();
    assert_eq!(free.stopped, StopReason::MaxNewTokens);
    options.eos_token = Some(free.tokens[1]);
    let stopped = g.generate(&options, |_| {}).unwrap();
    let stop_at = free
        .tokens
        .iter()
        .position(|&t| t == free.tokens[1])
        .unwrap();
    assert_eq!(stopped.tokens, free.tokens[..=stop_at], "{file}");
    assert_eq!(stopped.check_ok, None);
    assert_eq!(stopped.stopped, StopReason::Eos);
}

#[test]
fn the_context_is_the_position_table_of_gpt2_and_unknown_for_llama() {
    for file in decoders() {
        let model = load(&file);
        let found = context::position_table(&model, Some("position_ids"));
        // LLaMA computes its rotary angles from the positions: no table, no limit.
        let want = file.starts_with("gpt2").then_some(128);
        assert_eq!(
            found.as_ref().map(|c| c.positions),
            want,
            "{file}: {found:?}"
        );
        if let Some(c) = found {
            // a quantized file's table is `..wpe.weight_quantized` (int8, dequantized after)
            assert!(c.table.unwrap().contains("wpe.weight"), "{file}");
        }
    }
}

#[test]
fn generation_stops_at_the_context_or_keeps_its_tokens_when_a_step_fails() {
    let file = "gpt2_cache_eager.ts.onnx";
    let model = load(file);
    let threads = Threads::new(Some(1)).unwrap();
    let g = Generator::new(&model, None, &threads, file).unwrap();
    assert_eq!(g.context().unwrap().positions, 128);
    let mut options = GenerationOptions {
        prompts: vec![vec![1, 2, 3]],
        max_new_tokens: 10,
        eos_token: None,
        check: None,
        max_length: Some(7),
        sampling: SamplingOptions::default(),
        encoder_inputs: Vec::new(),
        kv_cache: KvCacheMode::default(),
    };
    let r = g.generate(&options, |_| {}).unwrap();
    assert_eq!(
        r.tokens.len(),
        4,
        "the prompt and the tokens fill the 7 positions"
    );
    assert_eq!(r.stopped, StopReason::Context);
    assert_eq!(r.context.unwrap().table, None);
    // A prompt longer than the context is refused before anything runs.
    options.max_length = Some(2);
    let err = g.generate(&options, |_| {}).unwrap_err().to_string();
    assert!(
        err.contains("do not fit the maximum length of 2 positions"),
        "{err}"
    );
    // Past the 128 rows of the table, tract fails inside the Gather: the tokens made before
    // are kept (the last position that fits, 127, gives one token more than the context).
    options.prompts = vec![(0..120).map(|i| i % 100).collect()];
    options.max_length = Some(130);
    let err = g.generate(&options, |_| {}).unwrap_err();
    let failed = err.downcast_ref::<GenerationFailed>().unwrap();
    assert_eq!(failed.report.tokens.len(), 9, "{err:#}");
    assert_eq!(failed.report.stopped, StopReason::Error);
    assert!(
        failed.report.error.as_ref().unwrap().contains("Gather"),
        "{err:#}"
    );
}

/// Sampling through a fused decoder: the unfused graph in lockstep draws the same tokens from
/// the same stream; the same seed gives the same tokens (on 1 and 2 threads), another seed other
/// tokens; top-k 1 is greedy.
#[test]
fn sampled_generation_is_seeded_and_matches_the_unfused_graph() {
    let file = &decoders()[0];
    let original = load(file);
    let fused = fuse(&original, &FusionOptions::default()).unwrap().model;
    let sampled = |threads: usize, seed: u64, top_k: usize| {
        let threads = Threads::new(Some(threads)).unwrap();
        let g = Generator::new(&fused, Some(&original), &threads, file).unwrap();
        let options = GenerationOptions {
            prompts: vec![vec![3, 14, 15]],
            max_new_tokens: 12,
            eos_token: None,
            check: Some(Tolerance {
                atol: 1e-4,
                rtol: 1e-4,
            }),
            max_length: None,
            sampling: SamplingOptions {
                do_sample: true,
                temperature: 1.5,
                top_k,
                top_p: 0.95,
                repetition_penalty: 1.1,
                seed,
                ..SamplingOptions::default()
            },
            encoder_inputs: Vec::new(),
            kv_cache: KvCacheMode::default(),
        };
        let report = g.generate(&options, |_| {}).unwrap();
        assert_eq!(report.check_ok, Some(true), "{file}: {:#?}", report.steps);
        report.tokens
    };
    let a = sampled(1, 5, 0);
    assert_eq!(a, sampled(2, 5, 0), "{file}: same seed, other thread count");
    assert_ne!(a, sampled(1, 6, 0), "{file}: another seed");
    let threads = Threads::new(Some(1)).unwrap();
    let g = Generator::new(&fused, None, &threads, file).unwrap();
    let greedy = GenerationOptions {
        prompts: vec![vec![3, 14, 15]],
        max_new_tokens: 12,
        eos_token: None,
        check: None,
        max_length: None,
        sampling: SamplingOptions {
            repetition_penalty: 1.1,
            ..SamplingOptions::default()
        },
        encoder_inputs: Vec::new(),
        kv_cache: KvCacheMode::default(),
    };
    let want = g.generate(&greedy, |_| {}).unwrap().tokens;
    let top1 = GenerationOptions {
        sampling: SamplingOptions {
            do_sample: true,
            top_k: 1,
            seed: 9,
            ..greedy.sampling.clone()
        },
        ..greedy.clone()
    };
    assert_eq!(
        g.generate(&top1, |_| {}).unwrap().tokens,
        want,
        "{file}: top-k 1 is greedy"
    );
}

#[test]
fn signatures_pair_every_past_with_its_present() {
    for file in decoders() {
        let sig = DecoderSignature::detect(&load(&file), &file).unwrap();
        assert_eq!(sig.input_ids, "input_ids", "{file}");
        assert_eq!(sig.cache.len(), 4, "{file}: 2 layers × key/value");
        for slot in &sig.cache {
            let tag = slot.past.trim_start_matches("past_key_values");
            assert!(slot.present.ends_with(tag), "{file}: {slot:?}");
        }
        assert_eq!(sig.dynamic_dims()[0], sig.past_dim, "{file}");
    }
}

fn expect_refusal(model: &ModelProto, needle: &str) {
    let e = DecoderSignature::detect(model, "m.onnx").unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("m.onnx") && msg.contains(needle), "{msg}");
}

#[test]
fn models_that_cannot_generate_are_refused_with_the_reason() {
    // An encoder: no cache.
    expect_refusal(&load("bert_eager.ts.onnx"), "no cache inputs");
    let decoder = load(&decoders()[0]);
    // A present output renamed: the past input has nothing to pair with.
    let mut renamed = decoder.clone();
    let g = renamed.graph.as_mut().unwrap();
    let out = g
        .output
        .iter_mut()
        .find(|o| o.name.contains(".0.key"))
        .unwrap();
    let old = out.name.clone();
    out.name = "cache_out".into();
    for n in &mut g.node {
        for o in &mut n.output {
            if *o == old {
                *o = "cache_out".into();
            }
        }
    }
    expect_refusal(&renamed, "has no matching present output");
    // A present output declared with other heads than its past.
    let mut reshaped = decoder.clone();
    let g = reshaped.graph.as_mut().unwrap();
    let out = g
        .output
        .iter_mut()
        .find(|o| o.name.contains(".0.key"))
        .unwrap();
    use attnrt_onnx::proto::{tensor_shape_proto::dimension::Value, type_proto};
    if let Some(type_proto::Value::TensorType(t)) =
        out.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        t.shape.as_mut().unwrap().dim[1].value = Some(Value::DimValue(99));
    }
    expect_refusal(&reshaped, "disagree");
}

/// Greedy options for `prompts`, no check.
fn greedy(prompts: Vec<Vec<i64>>, max_new_tokens: usize) -> GenerationOptions {
    GenerationOptions {
        prompts,
        max_new_tokens,
        eos_token: None,
        check: None,
        max_length: None,
        sampling: SamplingOptions::default(),
        encoder_inputs: Vec::new(),
        kv_cache: KvCacheMode::default(),
    }
}

/// Issue 26 item 3: prompts of different lengths run as one batch, padded on the left (the
/// padding rows' queries see no key: issue 25's fully masked rows), and each row's greedy tokens
/// equal that prompt run alone; the fused batch equals the unfused one in lockstep.
#[test]
fn a_padded_batch_gives_each_row_the_tokens_of_its_prompt_alone() {
    let threads = Threads::new(Some(2)).unwrap();
    let prompts = vec![
        vec![3, 14, 15],
        vec![9, 2, 6, 5, 35, 89, 79],
        vec![32, 38, 46, 26],
    ];
    for file in decoders() {
        let original = load(&file);
        let fused = fuse(&original, &FusionOptions::default()).unwrap().model;
        let g = Generator::new(&fused, Some(&original), &threads, &file).unwrap();
        let mut batch = greedy(prompts.clone(), 5);
        batch.check = Some(Tolerance {
            atol: 1e-4,
            rtol: 1e-4,
        });
        let report = g.generate(&batch, |_| {}).unwrap();
        assert_eq!(report.check_ok, Some(true), "{file}: {:#?}", report.steps);
        assert_eq!(report.rows.len(), 3, "{file}");
        // A dynamically quantized decoder quantizes each activation tensor with one scale for the
        // whole batch, so a row's numbers depend on the other rows: not the prompt alone's.
        let per_tensor_quantized = file.contains(".qint8");
        for (row, prompt) in report.rows.iter().zip(&prompts) {
            if per_tensor_quantized {
                break;
            }
            let alone = g
                .generate(&greedy(vec![prompt.clone()], 5), |_| {})
                .unwrap();
            assert_eq!(row.prompt, *prompt, "{file}");
            assert_eq!(row.tokens, alone.tokens, "{file}: prompt {prompt:?}");
        }
        assert_eq!(report.tokens, report.rows[0].tokens, "{file}");
        // the prompt's plan and the decode steps' plan, made when the generator was built, each
        // serving every batch (the TorchScript and optimum exports too: their `Flatten` of the
        // mask and their `Mul` by its length plan with the batch symbolic): no other
        assert_eq!(report.plans.built, 2, "{file}: {:?}", report.plans);
        assert!(
            report.plans.refusals.is_empty(),
            "{file}: {:?}",
            report.plans
        );
    }
}

/// Issue 26 (time to first token, batches): a batch of 4 on a TorchScript decoder with a cache
/// plans nothing after the generator is built, neither its prompt nor its decode steps (tract's
/// `Flatten` and `Mul` refused the batch and the lengths symbolic together; attnrt's parsers of
/// both plan them).
#[test]
fn a_batch_of_four_plans_nothing_after_load_on_torchscript_decoders() {
    let threads = Threads::new(Some(2)).unwrap();
    let files: Vec<String> = decoders()
        .into_iter()
        .filter(|f| f.contains(".ts."))
        .collect();
    assert!(
        files.len() >= 4,
        "TorchScript decoders with a cache: {files:?}"
    );
    let prompts: Vec<Vec<i64>> = (0..4)
        .map(|row| (0..6 + row).map(|i| (i * 5 + row + 1) % 90).collect())
        .collect();
    for file in files {
        let model = load(&file);
        let fused = fuse(&model, &FusionOptions::default()).unwrap().model;
        let g = Generator::new(&fused, None, &threads, &file).unwrap();
        let loaded = g.plan_stats();
        let report = g.generate(&greedy(prompts.clone(), 3), |_| {}).unwrap();
        assert_eq!(report.rows.len(), 4, "{file}");
        let planned: Vec<f64> = report.steps.iter().map(|s| s.planning_ms).collect();
        assert_eq!(planned, [0.0, 0.0, 0.0], "{file}");
        let after = g.plan_stats();
        assert_eq!(after.built, loaded.built, "{file}: {after:?}");
        assert!(after.refusals.is_empty(), "{file}: {after:?}");
    }
}

/// A row that makes the end-of-sequence token is finished: its tokens no longer change while
/// the other rows go on; generation ends when every row has.
#[test]
fn rows_stop_at_their_own_eos() {
    let file = &decoders()[0];
    let model = load(file);
    let threads = Threads::new(Some(1)).unwrap();
    let g = Generator::new(&model, None, &threads, file).unwrap();
    let prompts = vec![vec![1, 2, 3], vec![4, 5, 6, 7]];
    let free = g.generate(&greedy(prompts.clone(), 6), |_| {}).unwrap();
    let eos = free.rows[1].tokens[1];
    let mut options = greedy(prompts, 6);
    options.eos_token = Some(eos);
    let r = g.generate(&options, |_| {}).unwrap();
    let cut = |t: &[i64]| -> Vec<i64> {
        match t.iter().position(|&x| x == eos) {
            Some(i) => t[..=i].to_vec(),
            None => t.to_vec(),
        }
    };
    for (row, free_row) in r.rows.iter().zip(&free.rows) {
        assert_eq!(row.tokens, cut(&free_row.tokens), "{file}");
        let made_eos = row.tokens.last() == Some(&eos);
        let want = if made_eos {
            StopReason::Eos
        } else {
            StopReason::MaxNewTokens
        };
        assert_eq!(row.stopped, want, "{file}");
    }
    // the finished row chose nothing in the steps after its EOS
    let done_at = r.rows[1].tokens.len();
    for s in &r.steps[done_at..] {
        assert_eq!(s.tokens[1], None, "{file}: step {}", s.step);
    }
    let no_prompt = greedy(vec![vec![1], vec![]], 2);
    let err = g.generate(&no_prompt, |_| {}).unwrap_err().to_string();
    assert!(err.contains("prompt 1 is empty"), "{err}");
}

/// A merged decoder (one `If` on `use_cache_branch`, optimum's older layout) built from
/// `llama_cache_optimum`: the no-cache branch also adds 1000 to token 7's logit, so the first
/// token shows which branch ran. Generation feeds false on the first step and true after: the
/// first token is 7 and the rest are the plain decoder's continuation of prompt + 7, fused or not.
#[test]
fn a_merged_decoder_takes_its_no_cache_branch_first_and_its_cache_branch_after() {
    use attnrt_onnx::proto::attribute_proto::AttributeType;
    use attnrt_onnx::{AttributeProto, GraphProto, NodeProto};
    let plain = load("llama_cache_optimum.onnx");
    let g = plain.graph.clone().unwrap();
    let then_branch = GraphProto {
        name: "with_past".into(),
        node: g.node.clone(),
        output: g.output.clone(),
        ..GraphProto::default()
    };
    let mut forced = g.node.clone();
    for n in &mut forced {
        for o in n.output.iter_mut().filter(|o| *o == "logits") {
            *o = "logits_raw".into();
        }
    }
    forced.push(NodeProto {
        name: "force_7".into(),
        op_type: "Add".into(),
        input: vec!["logits_raw".into(), "force".into()],
        output: vec!["logits".into()],
        ..NodeProto::default()
    });
    let mut bias = vec![0.0f32; 100];
    bias[7] = 1000.0;
    let else_branch = GraphProto {
        name: "no_past".into(),
        node: forced,
        initializer: vec![attnrt_onnx::tensor::from_f32("force", &[100], &bias)],
        output: g.output.clone(),
        ..GraphProto::default()
    };
    let branch = |name: &str, graph: GraphProto| AttributeProto {
        name: name.into(),
        r#type: AttributeType::Graph as i32,
        g: Some(graph),
        ..AttributeProto::default()
    };
    let choose = NodeProto {
        name: "optimum::if".into(),
        op_type: "If".into(),
        input: vec!["use_cache_branch".into()],
        output: g.output.iter().map(|o| o.name.clone()).collect(),
        attribute: vec![
            branch("then_branch", then_branch),
            branch("else_branch", else_branch),
        ],
        ..NodeProto::default()
    };
    let mut merged = plain.clone();
    let mg = merged.graph.as_mut().unwrap();
    mg.node = vec![choose];
    mg.input.push(attnrt_testkit::value_info(
        "use_cache_branch",
        attnrt_onnx::DataType::Bool,
        &[1i64],
    ));
    let threads = Threads::new(Some(1)).unwrap();
    let continuation = Generator::new(&plain, None, &threads, "plain")
        .unwrap()
        .generate(&greedy(vec![vec![3, 14, 15, 7]], 4), |_| {})
        .unwrap()
        .tokens;
    let fused = fuse(&merged, &FusionOptions::default()).unwrap();
    assert_eq!(fused.report.blocks.len(), 4, "both branches' blocks fuse");
    for (what, model) in [("merged", &merged), ("fused merged", &fused.model)] {
        let g = Generator::new(model, None, &threads, what).unwrap();
        assert_eq!(
            g.signature().cache_branch.as_deref(),
            Some("use_cache_branch")
        );
        let tokens = g
            .generate(&greedy(vec![vec![3, 14, 15]], 5), |_| {})
            .unwrap()
            .tokens;
        assert_eq!(
            tokens[0], 7,
            "{what}: the first step runs the no-cache branch"
        );
        assert_eq!(
            tokens[1..],
            continuation,
            "{what}: later steps run the cache branch"
        );
    }
}

/// Every step's last-position logits of `options` run with the cache kept as `mode`, and how
/// the cache was kept.
fn logits_with(
    g: &Generator,
    options: &GenerationOptions,
    mode: KvCacheMode,
) -> (Vec<Vec<Vec<f32>>>, attnrt::generate::KvCacheReport) {
    let options = GenerationOptions {
        kv_cache: mode,
        ..options.clone()
    };
    let mut generation = g.start(&options).unwrap();
    let mut logits = Vec::new();
    while g.next_step(&mut generation).unwrap().is_some() {
        logits.push(generation.last_logits().to_vec());
    }
    (logits, generation.kv_cache().clone())
}

/// Issue 26 (in-place cache): on every shipped decoder with a cache, a left-padded batch makes
/// bit-identical logits at every step with the cache held in place and with the cache copied
/// into fresh presents each step (the same kernels on the same rows; only where the rows live
/// differs), so the same tokens; the exports whose caches only the fused attention reads run
/// in place, the others fall back with the reason.
#[test]
fn the_in_place_cache_gives_the_copy_paths_logits_bit_for_bit() {
    let threads = Threads::new(Some(2)).unwrap();
    let prompts = vec![vec![3, 14, 15], vec![9, 2, 6, 5, 35, 89, 79]];
    let mut in_place = Vec::new();
    for file in decoders() {
        let original = load(&file);
        let fused = fuse(&original, &FusionOptions::default()).unwrap().model;
        let g = Generator::new(&fused, None, &threads, &file).unwrap();
        let options = greedy(prompts.clone(), 5);
        let (copied, copy) = logits_with(&g, &options, KvCacheMode::Copy);
        let (held, report) = logits_with(&g, &options, KvCacheMode::InPlace);
        assert_eq!(copy.mode, KvCacheMode::Copy, "{file}");
        assert_eq!(copied.len(), 5, "{file}");
        assert!(held == copied, "{file}: the logits differ");
        match report.mode {
            KvCacheMode::InPlace => in_place.push(file),
            KvCacheMode::Copy => {
                let why = report.fallback.unwrap_or_default();
                assert!(why.contains(" read by node "), "{file}: {why}");
            }
        }
    }
    // (the SDPA TorchScript exports read present's head size to merge the heads, and llama's
    // the GQA-repeated values' head size: those readers take the current key's and value's;
    // optimum's LLaMA cuts its mask to the GQA-repeated keys' length, which the fusion
    // computes from the past's and new keys' shapes; the opset-23 exports' Attention nodes
    // take over the joins the exporter wrote outside them)
    let sdpa_ts = decoders()
        .into_iter()
        .filter(|f| f.contains("_cache_sdpa") && f.ends_with(".ts.onnx"));
    let expected = [
        "gpt2_cache_eager.dynamo.onnx",
        "gpt2_cache_eager.ts.onnx",
        "gpt2_cache_sdpa.dynamo.onnx",
        "gpt2_cache_sdpa.dynamo.opset23.onnx",
        "gpt2_cache_sdpa.ts.onnx",
        "llama_cache_eager.dynamo.onnx",
        "llama_cache_eager.ts.onnx",
        "llama_cache_eager.ts.qint8.onnx",
        "llama_cache_optimum.onnx",
        "llama_cache_sdpa.dynamo.onnx",
        "llama_cache_sdpa.dynamo.opset23.onnx",
        "llama_cache_sdpa.ts.onnx",
    ];
    for expected in expected.into_iter().map(String::from).chain(sdpa_ts) {
        assert!(in_place.contains(&expected), "{expected}: {in_place:?}");
    }
}

/// Why the fused `file`, with a node `reader` (a `Shape` from axis 3, or another op) of `cache`
/// made a graph output, kept its cache as tensors.
fn fallback_with_reader(file: &str, reader: &str, cache: &str) -> String {
    let mut fused = fuse(&load(file), &FusionOptions::default()).unwrap().model;
    let graph = fused.graph.as_mut().unwrap();
    let start = attnrt_onnx::attr::make_int("start", 3);
    graph.node.push(attnrt_onnx::NodeProto {
        name: "head_reader".into(),
        op_type: reader.into(),
        input: vec![cache.into()],
        output: vec!["head_reader_out".into()],
        attribute: (reader == "Shape").then_some(start).into_iter().collect(),
        ..Default::default()
    });
    graph.output.push(attnrt_onnx::ValueInfoProto {
        name: "head_reader_out".into(),
        ..Default::default()
    });
    let threads = Threads::new(Some(2)).unwrap();
    let g = Generator::new(&fused, None, &threads, "with a head reader").unwrap();
    let report = g
        .generate(&greedy(vec![vec![3, 14, 15]], 2), |_| {})
        .unwrap();
    report.kv_cache.fallback.unwrap_or_default()
}

/// Issue 26 (in-place cache): a decoder whose past is read by another node than the fused
/// attention keeps the copy path, and the report names the reader.
#[test]
fn a_past_with_another_reader_keeps_the_copy_path_with_the_reason() {
    let threads = Threads::new(Some(2)).unwrap();
    // a reader of the past's values (optimum's LLaMA, which runs in place as exported)
    let why = fallback_with_reader(
        "llama_cache_optimum.onnx",
        "Identity",
        "past_key_values.0.key",
    );
    assert!(
        why.contains("past 'past_key_values.0.key' is read by node 'head_reader' (Identity)"),
        "{why}"
    );
    // a Shape that reads past's head size (the stand-ins' is 0): copied
    let why = fallback_with_reader(
        "llama_cache_eager.ts.onnx",
        "Shape",
        "past_key_values.1.value",
    );
    assert!(why.contains("read by node 'head_reader' (Shape)"), "{why}");
    // an SDPA export's present: its whole shapes are rewritten, not a Shape from axis 3 or a
    // reader of its values
    for reader in ["Shape", "Identity"] {
        let why = fallback_with_reader("llama_cache_sdpa.ts.onnx", reader, "present.1.key");
        let needle =
            format!("present 'present.1.key' is also read by node 'head_reader' ({reader})");
        assert!(why.contains(&needle), "{why}");
    }
    // llama's repeated values read through a Reshape with allowzero=1: not proven, copied
    let mut fused = fuse(&load("llama_cache_sdpa.ts.onnx"), &FusionOptions::default())
        .unwrap()
        .model;
    let graph = fused.graph.as_mut().unwrap();
    let repeat = graph
        .node
        .iter_mut()
        .find(|n| n.name == "/model/model/layers.1/self_attn/Reshape_6")
        .unwrap();
    repeat.attribute = vec![attnrt_onnx::attr::make_int("allowzero", 1)];
    let g = Generator::new(&fused, None, &threads, "allowzero").unwrap();
    let report = g
        .generate(&greedy(vec![vec![3, 14, 15]], 2), |_| {})
        .unwrap();
    let why = report.kv_cache.fallback.unwrap_or_default();
    assert!(
        why.contains("present 'present.1.value' is also read by node")
            && why.contains("(Unsqueeze)"),
        "{why}"
    );
    // unfused, no fused attention reads the cache at all
    let g = Generator::new(
        &load("llama_cache_eager.ts.onnx"),
        None,
        &threads,
        "unfused",
    )
    .unwrap();
    let report = g
        .generate(&greedy(vec![vec![3, 14, 15]], 2), |_| {})
        .unwrap();
    assert_eq!(report.kv_cache.mode, KvCacheMode::Copy);
    assert!(report.kv_cache.fallback.is_some());
}

/// With node times asked for, every step says how much of its time its nodes took (no more than
/// the step) and the report the median time outside them, with the same tokens; without, the
/// nodes are not timed and neither is reported.
#[test]
fn node_times_are_reported_when_asked_for() {
    let threads = Threads::new(Some(2)).unwrap();
    let file = "llama_cache_eager.ts.onnx";
    let fused = fuse(&load(file), &FusionOptions::default()).unwrap().model;
    let options = greedy(vec![vec![3, 14, 15, 92, 65], vec![7, 8]], 5);
    let plain = Generator::new(&fused, None, &threads, file).unwrap();
    let plain = plain.generate(&options, |_| ()).unwrap();
    assert!(plain.steps.iter().all(|s| s.nodes_ms.is_none()));
    assert_eq!(plain.median_step_outside_ms, None);
    let timed = Generator::new(&fused, None, &threads, file).unwrap();
    let timed = timed
        .with_node_times(true)
        .generate(&options, |_| ())
        .unwrap();
    for s in &timed.steps {
        let nodes = s
            .nodes_ms
            .unwrap_or_else(|| panic!("step {}: no node times", s.step));
        assert!(
            nodes > 0.0 && nodes <= s.ms,
            "step {}: {nodes} of {}",
            s.step,
            s.ms
        );
    }
    assert!(timed.median_step_outside_ms.is_some_and(|o| o >= 0.0));
    assert_eq!(timed.rows[0].tokens, plain.rows[0].tokens);
    assert_eq!(timed.rows[1].tokens, plain.rows[1].tokens);
}
