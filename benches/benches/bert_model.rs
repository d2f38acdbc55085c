//! BERT-shaped models, fused vs unfused, 2 threads:
//!
//! * `bert_eager_ts`: `models/bert_eager.ts.onnx` (transformers BertModel, eager attention,
//!   TorchScript export: hidden 64, 4 heads, 2 layers) at B=1 and L=128, the longest sequence
//!   its 128 position embeddings allow, all tokens attended;
//! * `encoder768`: a 2-layer BERT-base-shaped encoder built in Rust (d_model 768, 12 heads,
//!   FFN 3072, GELU, post-LayerNorm, additive padding bias `[1,1,1,L]` as BERT exports it, the
//!   last 5% of positions padded) at L ∈ {512, 2048}.
//!
//! The fused model is `attnrt_fusion::fuse` of the unfused one (2 blocks each); all run through
//! `attnrt_runtime::Session`: `fused` and `unfused_attnrt` as `attnrt run` does (constant-weight
//! matmuls on attnrt's `gemm`-backed op), `unfused` with tract's own matmuls (plain tract, the
//! peer baseline). fused vs `unfused_attnrt` is what the fusion alone brings.
//!
//! Run: `cargo bench -p attnrt-benches --bench bert_model`. Environment overrides:
//! `ATTNRT_BENCH_LENS=512` (encoder lengths), `ATTNRT_BENCH_THREADS=2`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use attnrt_benches::graphs::bert_encoder_model;
use attnrt_benches::{
    check_same_output, env_list, fmt_opt, fuse_expecting, machine_note, random_input, session,
    EncoderShape, Samples, Table, ATTNRT_OPS, BERT_BASE_ATTENTION, TRACT_OPS,
};
use attnrt_onnx::{load_model, Limits, ModelProto};
use attnrt_runtime::{NamedTensor, Tensor, Threads};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};

thread_local! {
    static SAMPLES: RefCell<Samples> = RefCell::new(Samples::default());
    static OUTPUTS: RefCell<BTreeMap<String, Vec<NamedTensor>>> = const { RefCell::new(BTreeMap::new()) };
}

/// One model at one length: its unfused and fused forms and its inputs.
struct Case {
    id: String,
    unfused: ModelProto,
    fused: ModelProto,
    inputs: Vec<NamedTensor>,
    len: usize,
}

fn bert_eager_case(len: usize) -> anyhow::Result<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/bert_eager.ts.onnx");
    let unfused = load_model(&path, &Limits::default())?.model;
    let fused = fuse_expecting(&unfused, 2, &path.display().to_string())?;
    // Token ids in the model's vocabulary (100), every position attended.
    let ids: Vec<i64> = (0..len as i64).map(|i| (i * 37 + 11) % 100).collect();
    let inputs = vec![
        NamedTensor {
            name: "input_ids".into(),
            tensor: Tensor::from_shape(&[1, len], &ids)?,
        },
        NamedTensor {
            name: "attention_mask".into(),
            tensor: Tensor::from_shape(&[1, len], &vec![1i64; len])?,
        },
    ];
    Ok(Case {
        id: format!("bert_eager_ts/L{len}"),
        unfused,
        fused,
        inputs,
        len,
    })
}

fn encoder_case(len: usize) -> anyhow::Result<Case> {
    let shape = EncoderShape {
        attention: BERT_BASE_ATTENTION,
        layers: 2,
        ffn: 3072,
    };
    let unfused = bert_encoder_model(shape, 7)?;
    let fused = fuse_expecting(&unfused, shape.layers, "the 2-layer encoder")?;
    let padded = len / 20;
    let bias: Vec<f32> = (0..len)
        .map(|i| if i >= len - padded { -10000.0 } else { 0.0 })
        .collect();
    let inputs = vec![
        random_input("x", &[1, len, shape.attention.hidden()], 3)?,
        NamedTensor {
            name: "mask_bias".into(),
            tensor: Tensor::from_shape(&[1, 1, 1, len], &bias)?,
        },
    ];
    Ok(Case {
        id: format!("encoder768/L{len}"),
        unfused,
        fused,
        inputs,
        len,
    })
}

fn benches(c: &mut Criterion) {
    let lens = env_list("ATTNRT_BENCH_LENS", &[512, 2048]).expect("ATTNRT_BENCH_LENS");
    let t = env_list("ATTNRT_BENCH_THREADS", &[2]).expect("ATTNRT_BENCH_THREADS");
    let t = *t.first().expect("ATTNRT_BENCH_THREADS is empty");
    let threads = Threads::new(Some(t)).expect("thread pool");
    println!(
        "BERT-shaped models, B=1; threads {t} (tract matmuls + attnrt kernel pool); {}",
        machine_note()
    );

    let mut cases = Vec::new();
    match bert_eager_case(128) {
        Ok(c) => cases.push(c),
        Err(e) => eprintln!("bert_eager.ts.onnx skipped: {e:#}"),
    }
    for &len in &lens {
        match encoder_case(len) {
            Ok(c) => cases.push(c),
            Err(e) => eprintln!("encoder L={len} skipped: {e:#}"),
        }
    }

    for case in &cases {
        let mut g = c.benchmark_group(format!("bert_model/t{t}"));
        g.sample_size(10);
        g.sampling_mode(SamplingMode::Flat);
        g.warm_up_time(Duration::from_millis(if case.len >= 2048 {
            1500
        } else {
            500
        }));
        g.measurement_time(Duration::from_secs(if case.len >= 2048 { 10 } else { 3 }));
        for (path, model, attnrt_ops) in [
            ("fused", &case.fused, ATTNRT_OPS),
            ("unfused_attnrt", &case.unfused, ATTNRT_OPS),
            ("unfused", &case.unfused, TRACT_OPS),
        ] {
            let name = format!("{}/{path}", case.id);
            g.bench_function(BenchmarkId::new(path, &case.id), |b| {
                let s = session(model, &case.inputs, &threads, &name, attnrt_ops).expect("session");
                OUTPUTS.with(|o| {
                    o.borrow_mut()
                        .insert(name.clone(), s.run(&case.inputs).expect("first run"))
                });
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        std::hint::black_box(s.run(&case.inputs).expect("run"));
                    }
                    let total = start.elapsed();
                    SAMPLES.with(|s| s.borrow_mut().record(&name, total, iters));
                    total
                });
            });
        }
        g.finish();
    }

    let mut table = Table::new(&[
        "model",
        "threads",
        "attnrt fused ms",
        "attnrt unfused ms",
        "attnrt unfused/fused",
        "tract unfused ms",
        "tract unfused/attnrt fused",
        "max |fused−unfused|",
    ]);
    SAMPLES.with(|s| {
        let s = s.borrow();
        OUTPUTS.with(|o| {
            let o = o.borrow();
            for case in &cases {
                let f = s.median_ms(&format!("{}/fused", case.id));
                let u = s.median_ms(&format!("{}/unfused", case.id));
                let ua = s.median_ms(&format!("{}/unfused_attnrt", case.id));
                if f.is_none() && u.is_none() {
                    continue;
                }
                let diff = match (
                    o.get(&format!("{}/fused", case.id)),
                    o.get(&format!("{}/unfused", case.id)),
                ) {
                    (Some(a), Some(r)) => match check_same_output(a, r, &case.id) {
                        Ok(d) => format!("{d:.1e}"),
                        Err(e) => format!("MISMATCH: {e:#}"),
                    },
                    _ => "–".into(),
                };
                table.row(vec![
                    case.id.clone(),
                    t.to_string(),
                    fmt_opt(f, 2),
                    fmt_opt(ua, 2),
                    fmt_opt(ua.zip(f).map(|(u, f)| u / f), 2),
                    fmt_opt(u, 2),
                    fmt_opt(u.zip(f).map(|(u, f)| u / f), 2),
                    diff,
                ]);
            }
        });
    });
    println!(
        "\nBERT-shaped models, B=1, median ms\n{}\n{}",
        table.render(),
        machine_note()
    );
}

criterion_group!(bert_model, benches);
criterion_main!(bert_model);
