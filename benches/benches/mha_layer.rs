//! A whole single multi-head-attention layer (d_model 768, 12 heads of 64, Q/K/V/out
//! projections with bias, B=1), fused vs unfused, plus ONNX Runtime on the same layer:
//!
//! * `unfused`: the layer as the TorchScript exporter writes it (projections, Reshape/Transpose
//!   head split, MatMul, Mul, Softmax, MatMul, head merge, output projection), run by tract
//!   as tract-onnx runs it (its own matmuls, `TRACT_OPS`): the peer baseline;
//! * `fused`: `attnrt_fusion::fuse` of that model (the attention becomes one 3-D `Attention`
//!   node on attnrt's kernel) run as `attnrt run` does: the projections on attnrt's
//!   `gemm`-backed op (`ATTNRT_OPS`);
//! * `fused_tract_mm` / `unfused_attnrt`: the fused model with tract's matmuls, and the unfused
//!   model with attnrt's projections — what the fusion alone and the projections alone bring;
//! * ONNX Runtime: `benches/python/ort_bench.py` builds the same layer with the onnx helper, as
//!   the `Attention` op (opset 23) and decomposed, and times it in the same run (skipped when no
//!   Python with onnxruntime is found).
//!
//! Cases: 2 threads at L ∈ {512, 2048, 4096}, and 1 thread at L = 2048. Threads are set for both
//! tract's matmuls and the kernel (`attnrt_runtime::Threads`), and ORT gets as many intra-op
//! threads.
//!
//! Criterion's medians of the paths are taken minutes apart, and this machine's speed moves from
//! minute to minute; so after them the bench also runs *paired rounds* (`PAIRED` lines): per
//! round, attnrt's fused layer, tract's unfused one and ONNX Runtime's `Attention` layer (a
//! persistent `ort_bench.py --serve` child) back to back, and prints the quartiles of the
//! per-round ratios — the same-moment comparison the targets are judged by.
//!
//! Run: `cargo bench -p attnrt-benches --bench mha_layer`. Environment overrides:
//! `ATTNRT_BENCH_LENS=512,2048` (the 2-thread lengths), `ATTNRT_BENCH_SINGLE=2048` (the 1-thread
//! lengths; empty for none), `ATTNRT_BENCH_ORT=0` to skip ONNX Runtime, `ATTNRT_BENCH_PAIRED=0`
//! to skip the paired rounds.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use attnrt_benches::graphs::mha_layer_model;
use attnrt_benches::{
    attention_flops, check_same_output, env_list, fmt_opt, fuse_expecting, machine_note, median,
    ort, quartiles, random_input, session, Samples, Table, ATTNRT_OPS, BERT_BASE_ATTENTION,
    TRACT_OPS,
};
use attnrt_runtime::{NamedTensor, Threads};
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};

thread_local! {
    static SAMPLES: RefCell<Samples> = RefCell::new(Samples::default());
    static OUTPUTS: RefCell<BTreeMap<String, Vec<NamedTensor>>> = const { RefCell::new(BTreeMap::new()) };
}

fn case(path: &str, threads: usize, len: usize) -> String {
    format!("{path}/t{threads}/L{len}")
}

/// Flops of the whole layer: four `L×768×768` projections plus the attention core.
fn layer_flops(len: usize) -> f64 {
    let s = BERT_BASE_ATTENTION;
    let dm = s.hidden() as f64;
    4.0 * 2.0 * len as f64 * dm * dm + attention_flops(1, s.heads, len, len, s.head_dim)
}

fn benches(c: &mut Criterion) {
    let two = env_list("ATTNRT_BENCH_LENS", &[512, 2048, 4096]).expect("ATTNRT_BENCH_LENS");
    let one = env_list("ATTNRT_BENCH_SINGLE", &[2048]).expect("ATTNRT_BENCH_SINGLE");
    let cases: Vec<(usize, usize)> = two
        .iter()
        .map(|&l| (2, l))
        .chain(one.iter().map(|&l| (1, l)))
        .collect();
    let shape = BERT_BASE_ATTENTION;
    let unfused = mha_layer_model(shape, 42).expect("layer graph");
    let fused = fuse_expecting(&unfused, 1, "the MHA layer").expect("fusion");
    println!(
        "MHA layer: d_model {} heads {} B=1; cases (threads, L) {cases:?}; threads = tract matmuls + attnrt kernel pool (Threads::new(Some(n))); {}",
        shape.hidden(),
        shape.heads,
        machine_note()
    );
    let pools: BTreeMap<usize, Threads> = cases
        .iter()
        .map(|&(t, _)| (t, Threads::new(Some(t)).expect("thread pool")))
        .collect();

    for &(t, len) in &cases {
        let threads = &pools[&t];
        let inputs = vec![random_input("x", &[1, len, shape.hidden()], 5).expect("input")];
        let mut g = c.benchmark_group(format!("mha_layer/t{t}"));
        g.throughput(Throughput::Elements(layer_flops(len) as u64));
        g.sample_size(10);
        g.sampling_mode(SamplingMode::Flat);
        g.warm_up_time(Duration::from_millis(if len >= 2048 { 1500 } else { 500 }));
        g.measurement_time(Duration::from_secs(if len >= 2048 { 8 } else { 3 }));
        for (path, model, attnrt_ops) in [
            ("fused", &fused, ATTNRT_OPS),
            ("fused_tract_mm", &fused, TRACT_OPS),
            ("unfused_attnrt", &unfused, ATTNRT_OPS),
            ("unfused", &unfused, TRACT_OPS),
        ] {
            let name = case(path, t, len);
            g.bench_function(BenchmarkId::new(path, len), |b| {
                let s = session(model, &inputs, threads, &name, attnrt_ops).expect("session");
                OUTPUTS.with(|o| {
                    o.borrow_mut()
                        .insert(name.clone(), s.run(&inputs).expect("first run"))
                });
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        std::hint::black_box(s.run(&inputs).expect("run"));
                    }
                    let total = start.elapsed();
                    SAMPLES.with(|s| s.borrow_mut().record(&name, total, iters));
                    total
                });
            });
        }
        g.finish();
    }

    // ONNX Runtime on the same layer, same thread counts.
    let mut ort_ms: BTreeMap<(String, usize, usize), (f64, f64, String)> = BTreeMap::new();
    if std::env::var("ATTNRT_BENCH_ORT").as_deref() != Ok("0") {
        for (t, lens) in [(2usize, &two), (1usize, &one)] {
            if lens.is_empty() {
                continue;
            }
            match ort::run(lens, t, 10) {
                Ok(Some(rs)) => {
                    for r in rs {
                        ort_ms.insert(
                            (r.form.clone(), r.threads, r.len),
                            (r.median_ms, r.peak_rss_mb, r.version),
                        );
                    }
                }
                Ok(None) => {}
                Err(e) => eprintln!("ONNX Runtime comparison failed: {e:#}"),
            }
        }
    }

    let mut table = Table::new(&[
        "threads",
        "L",
        "attnrt fused ms",
        "fused, tract matmuls ms",
        "unfused, attnrt matmuls ms",
        "tract unfused ms",
        "tract unfused/attnrt fused",
        "ORT Attention ms",
        "ORT decomposed ms",
        "ORT Attention/attnrt fused",
        "max |fused−unfused|",
    ]);
    SAMPLES.with(|s| {
        let s = s.borrow();
        OUTPUTS.with(|o| {
            let o = o.borrow();
            for &(t, len) in &cases {
                let f = s.median_ms(&case("fused", t, len));
                let u = s.median_ms(&case("unfused", t, len));
                let ft = s.median_ms(&case("fused_tract_mm", t, len));
                let ua = s.median_ms(&case("unfused_attnrt", t, len));
                if f.is_none() && u.is_none() {
                    continue;
                }
                let ort_a = ort_ms
                    .get(&("attention_op".to_string(), t, len))
                    .map(|r| r.0);
                let ort_d = ort_ms.get(&("decomposed".to_string(), t, len)).map(|r| r.0);
                let diff = match (
                    o.get(&case("fused", t, len)),
                    o.get(&case("unfused", t, len)),
                ) {
                    (Some(a), Some(r)) => {
                        match check_same_output(a, r, &format!("MHA layer L={len}")) {
                            Ok(d) => format!("{d:.1e}"),
                            Err(e) => format!("MISMATCH: {e:#}"),
                        }
                    }
                    _ => "–".into(),
                };
                table.row(vec![
                    t.to_string(),
                    len.to_string(),
                    fmt_opt(f, 1),
                    fmt_opt(ft, 1),
                    fmt_opt(ua, 1),
                    fmt_opt(u, 1),
                    fmt_opt(u.zip(f).map(|(u, f)| u / f), 2),
                    fmt_opt(ort_a, 1),
                    fmt_opt(ort_d, 1),
                    fmt_opt(ort_a.zip(f).map(|(a, f)| a / f), 2),
                    diff,
                ]);
            }
        });
    });
    let version = ort_ms
        .values()
        .next()
        .map(|r| r.2.clone())
        .unwrap_or_else(|| "not run".into());
    println!(
        "\nMHA layer (d_model 768, 12 heads, B=1), median ms; ONNX Runtime {version} with default graph optimizations\n{}\n{}",
        table.render(),
        machine_note()
    );
    if !ort_ms.is_empty() {
        println!(
            "ONNX Runtime peak RSS per case (MB, whole process): {}",
            ort_ms
                .iter()
                .map(|((f, t, l), r)| format!("{f} t{t} L{l}: {:.0}", r.1))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if std::env::var("ATTNRT_BENCH_PAIRED").as_deref() != Ok("0") {
        paired_rounds(&cases, &pools, &fused, &unfused);
    }
}

/// Rounds of attnrt fused, tract unfused and ONNX Runtime's `Attention` layer timed back to back
/// (see the module docs); prints the quartiles of the per-round ratios, one `PAIRED` line per case.
fn paired_rounds(
    cases: &[(usize, usize)],
    pools: &BTreeMap<usize, Threads>,
    fused: &attnrt_onnx::ModelProto,
    unfused: &attnrt_onnx::ModelProto,
) {
    let with_ort = std::env::var("ATTNRT_BENCH_ORT").as_deref() != Ok("0");
    println!(
        "\npaired rounds: per round the fused layer (attnrt), the unfused one (tract) and ONNX Runtime's Attention layer, each the median of a few runs back to back; quartiles of the per-round ratios"
    );
    println!(
        "{:<12} {:>6} {:>10} {:>26} {:>26}",
        "case", "rounds", "fused ms", "tract unfused / fused", "ORT Attention / fused"
    );
    for &(t, len) in cases {
        let threads = &pools[&t];
        let inputs = vec![random_input("x", &[1, len, 768], 5).expect("input")];
        let name = case("paired", t, len);
        let f = session(fused, &inputs, threads, &name, ATTNRT_OPS).expect("session");
        let u = session(unfused, &inputs, threads, &name, TRACT_OPS).expect("session");
        let mut server = if with_ort {
            match ort::OrtServer::start("attention_op", len, t) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("ONNX Runtime pairing failed: {e:#}");
                    None
                }
            }
        } else {
            None
        };
        let (rounds, runs) = if len >= 2048 { (12, 3) } else { (16, 5) };
        let time = |s: &attnrt_runtime::Session| {
            let ms: Vec<f64> = (0..runs)
                .map(|_| {
                    let start = Instant::now();
                    std::hint::black_box(s.run(&inputs).expect("run"));
                    start.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            median(&ms)
        };
        // Each path's worker threads must be idle before the next path starts: ONNX Runtime's
        // spin for ≈ 50 ms after a run (measured: 0.05 CPU-s in the 0.1 s after a run, none
        // after), which a shorter pause would let steal a core from the next attnrt run.
        let idle = || std::thread::sleep(Duration::from_millis(150));
        // Warm-up of both sessions (the server warmed up before answering).
        time(&f);
        time(&u);
        let (mut fused_ms, mut unfused_ratio, mut ort_ratio) = (vec![], vec![], vec![]);
        for _ in 0..rounds {
            let fm = time(&f);
            idle();
            let um = time(&u);
            idle();
            if let Some(s) = server.as_mut() {
                match s.time(runs) {
                    Ok(ms) => ort_ratio.push(median(&ms) / fm),
                    Err(e) => {
                        eprintln!("ONNX Runtime pairing failed: {e:#}");
                        server = None;
                    }
                }
                idle();
            }
            fused_ms.push(fm);
            unfused_ratio.push(um / fm);
        }
        let show = |r: &[f64]| {
            if r.is_empty() {
                "–".to_string()
            } else {
                let [p25, m, p75] = quartiles(r);
                format!("{m:.2} ({p25:.2}–{p75:.2})")
            }
        };
        println!(
            "PAIRED {:<12} {:>6} {:>10.1} {:>26} {:>26}",
            format!("t{t} L{len}"),
            rounds,
            median(&fused_ms),
            show(&unfused_ratio),
            show(&ort_ratio)
        );
    }
}

criterion_group!(mha_layer, benches);
criterion_main!(mha_layer);
