//! The attention core alone, B=1, H=12, D=64, L ∈ {128, 512, 2048, 4096}, three ways in one run:
//!
//! * `fused`: an ONNX model of one `Attention` node (opset 23) run by attnrt's runtime (tract
//!   with attnrt's kernel behind the op);
//! * `unfused`: the same attention as the decomposed chain `MatMul(Q, Kᵀ) → Mul → Softmax →
//!   MatMul` run by tract through the same `Session` (nothing fused);
//! * `kernel`: `attnrt_kernels::attention` called directly on the same data.
//!
//! Prints a table at the end: median ms, achieved GFLOP/s (4·B·H·L²·D flops), share of the
//! FMA peak, the unfused/fused ratio, and the largest |fused − unfused| (every case is checked
//! to agree within attnrt's default tolerance before it is timed).
//!
//! Run: `cargo bench -p attnrt-benches --bench attention_core`. Environment overrides:
//! `ATTNRT_BENCH_LENS=128,512` (sequence lengths), `ATTNRT_BENCH_THREADS=1,2` (default 1: the
//! issue's core target is single-threaded), `ATTNRT_BENCH_LAYOUT=3d` (Q/K/V as `[B, L, H·D]`
//! with the Reshape/Transpose chain instead of 4-D `[B, H, L, D]`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use attnrt_benches::graphs::{attention_chain_model, attention_op_model, seeded_values};
use attnrt_benches::{
    attention_flops, check_same_output, core_inputs, env_list, fmt_opt, machine_note,
    measured_fma_peak_gflops, process_cpu_seconds, session, CoreLayout, Samples, Table, ATTNRT_OPS,
    BERT_BASE_ATTENTION, TRACT_OPS,
};
use attnrt_kernels::{attention, AttentionParams, KernelSet, Mask, View4, ViewMut4};
use attnrt_runtime::{NamedTensor, Tensor, Threads};
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};

const SEED: u64 = 11;

thread_local! {
    static SAMPLES: RefCell<Samples> = RefCell::new(Samples::default());
    /// First output of each path per (threads, L), for the agreement check.
    static OUTPUTS: RefCell<BTreeMap<String, Vec<NamedTensor>>> = const { RefCell::new(BTreeMap::new()) };
    /// Per case: (iterations, CPU seconds) summed over the timed loops.
    static CPU: RefCell<BTreeMap<String, (u64, f64)>> = const { RefCell::new(BTreeMap::new()) };
}

fn case(path: &str, threads: usize, len: usize) -> String {
    format!("{path}/t{threads}/L{len}")
}

fn layout() -> CoreLayout {
    match std::env::var("ATTNRT_BENCH_LAYOUT").as_deref() {
        Ok("3d") | Ok("3D") => CoreLayout::ThreeD,
        Ok("4d") | Ok("4D") | Err(_) => CoreLayout::FourD,
        Ok(other) => panic!("ATTNRT_BENCH_LAYOUT={other}: expected 3d or 4d"),
    }
}

/// Times `run` with criterion's `iter_custom`, keeping the per-iteration times for the table.
fn timed(b: &mut criterion::Bencher, name: &str, mut run: impl FnMut()) {
    b.iter_custom(|iters| {
        let cpu0 = process_cpu_seconds();
        let start = Instant::now();
        for _ in 0..iters {
            run();
        }
        let total = start.elapsed();
        SAMPLES.with(|s| s.borrow_mut().record(name, total, iters));
        if let (Some(a), Some(b)) = (cpu0, process_cpu_seconds()) {
            CPU.with(|c| {
                let mut c = c.borrow_mut();
                let e = c.entry(name.to_string()).or_insert((0, 0.0));
                e.0 += iters;
                e.1 += b - a;
            });
        }
        total
    });
}

/// `x` as `[1, H, L, D]`, from a 4-D buffer or a 3-D `[1, L, H·D]` one.
fn view(x: &[f32], layout: CoreLayout, h: usize, len: usize, d: usize) -> View4<'_> {
    match layout {
        CoreLayout::FourD => View4::contiguous(x, [1, h, len, d]),
        CoreLayout::ThreeD => View4::from_bshd(x, 1, len, h, d),
    }
    .expect("view")
}

fn benches(c: &mut Criterion) {
    let lens = env_list("ATTNRT_BENCH_LENS", &[128, 512, 2048, 4096]).expect("ATTNRT_BENCH_LENS");
    let thread_counts = env_list("ATTNRT_BENCH_THREADS", &[1]).expect("ATTNRT_BENCH_THREADS");
    let shape = BERT_BASE_ATTENTION;
    let layout = layout();
    let fused_model = attention_op_model(shape, layout).expect("fused graph");
    let chain_model = attention_chain_model(shape, layout).expect("unfused graph");
    // The "% of peak" column divides by one core's FMA throughput measured here, in this run
    // (the larger of a probe before and after the benches), not by a nominal figure.
    let peak_before = measured_fma_peak_gflops();
    println!(
        "attention core: B=1 H={} D={} layout {layout:?}; threads {thread_counts:?} (tract matmuls and attnrt's kernel pool, set by Threads::new); kernel ISA {}; {}",
        shape.heads,
        shape.head_dim,
        KernelSet::resolve().map(|k| k.isa().to_string()).unwrap_or_else(|e| e.to_string()),
        machine_note()
    );

    for &t in &thread_counts {
        let threads = Threads::new(Some(t)).expect("thread pool");
        assert_eq!(threads.count(), t);
        for &len in &lens {
            let flops = attention_flops(1, shape.heads, len, len, shape.head_dim);
            let inputs = core_inputs(shape, layout, len, SEED).expect("inputs");
            let mut g = c.benchmark_group(format!("attention_core/t{t}"));
            g.throughput(Throughput::Elements(flops as u64));
            g.sample_size(10);
            g.sampling_mode(SamplingMode::Flat);
            g.warm_up_time(Duration::from_millis(if len >= 2048 { 1500 } else { 500 }));
            g.measurement_time(Duration::from_secs(if len >= 2048 { 8 } else { 3 }));

            for (path, model, attnrt_ops) in [
                ("fused", &fused_model, ATTNRT_OPS),
                ("unfused", &chain_model, TRACT_OPS),
            ] {
                let name = case(path, t, len);
                g.bench_function(BenchmarkId::new(path, len), |b| {
                    let s = session(model, &inputs, &threads, &name, attnrt_ops).expect("session");
                    let first = s.run(&inputs).expect("first run");
                    OUTPUTS.with(|o| o.borrow_mut().insert(name.clone(), first));
                    timed(b, &name, || {
                        std::hint::black_box(s.run(&inputs).expect("run"));
                    });
                });
            }

            let name = case("kernel", t, len);
            g.bench_function(BenchmarkId::new("kernel", len), |b| {
                let (h, d) = (shape.heads, shape.head_dim);
                let n = h * len * d;
                // The same values as `core_inputs` (same seeds), so the outputs are comparable.
                let data: Vec<Vec<f32>> = (0..3).map(|i| seeded_values(SEED + i, n, 1.0)).collect();
                let mut out = vec![0f32; n];
                let params = AttentionParams::new(AttentionParams::default_scale(d));
                let kernels = KernelSet::resolve().expect("kernel set");
                let (q, k, v) = (
                    view(&data[0], layout, h, len, d),
                    view(&data[1], layout, h, len, d),
                    view(&data[2], layout, h, len, d),
                );
                let call = |out: &mut [f32]| {
                    let mut o = match layout {
                        CoreLayout::FourD => ViewMut4::contiguous(out, [1, h, len, d]),
                        CoreLayout::ThreeD => ViewMut4::from_bshd(out, 1, len, h, d),
                    }
                    .expect("out view");
                    threads
                        .install(|| attention(&kernels, &q, &k, &v, &Mask::None, &params, &mut o))
                        .expect("kernel");
                };
                call(&mut out);
                let dims: Vec<usize> = match layout {
                    CoreLayout::FourD => vec![1, h, len, d],
                    CoreLayout::ThreeD => vec![1, len, h * d],
                };
                let t_out = Tensor::from_shape(&dims, &out).expect("kernel output tensor");
                OUTPUTS.with(|o| {
                    o.borrow_mut().insert(
                        name.clone(),
                        vec![NamedTensor {
                            name: "y".into(),
                            tensor: t_out,
                        }],
                    )
                });
                timed(b, &name, || call(&mut out));
            });
            g.finish();
        }
    }

    // The table, with the agreement of the three paths.
    let peak_after = measured_fma_peak_gflops();
    let peak = peak_before.max(peak_after);
    let mut table = Table::new(&[
        "threads",
        "L",
        "fused ms",
        "fused GFLOP/s",
        "unfused ms",
        "unfused GFLOP/s",
        "kernel ms",
        "kernel GFLOP/s",
        "kernel % of peak",
        "kernel GFLOP/CPU-s",
        "fused GFLOP/CPU-s",
        "unfused/fused",
        "max |fused−unfused|",
        "max |kernel−unfused|",
    ]);
    // Flops per CPU-second: what the path achieves per core it actually got (see
    // `process_cpu_seconds`); equals GFLOP/s × threads on an idle machine with busy workers.
    let per_cpu = |name: &str, flops: f64| {
        CPU.with(|c| {
            c.borrow()
                .get(name)
                .filter(|e| e.1 > 0.0)
                .map(|&(iters, secs)| flops * iters as f64 / secs / 1e9)
        })
    };
    SAMPLES.with(|s| {
        let s = s.borrow();
        OUTPUTS.with(|o| {
            let o = o.borrow();
            for &t in &thread_counts {
                for &len in &lens {
                    let flops = attention_flops(1, shape.heads, len, len, shape.head_dim);
                    let ms = |p: &str| s.median_ms(&case(p, t, len));
                    let gf = |p: &str| ms(p).map(|m| flops / (m * 1e-3) / 1e9);
                    let diff = |p: &str| match (
                        o.get(&case(p, t, len)),
                        o.get(&case("unfused", t, len)),
                    ) {
                        (Some(a), Some(r)) => {
                            match check_same_output(a, r, &format!("{p} L={len}")) {
                                Ok(d) => format!("{d:.1e}"),
                                Err(e) => format!("MISMATCH: {e:#}"),
                            }
                        }
                        _ => "–".into(),
                    };
                    if ms("fused").is_none() && ms("unfused").is_none() && ms("kernel").is_none() {
                        continue; // filtered out on the command line
                    }
                    table.row(vec![
                        t.to_string(),
                        len.to_string(),
                        fmt_opt(ms("fused"), 2),
                        fmt_opt(gf("fused"), 1),
                        fmt_opt(ms("unfused"), 2),
                        fmt_opt(gf("unfused"), 1),
                        fmt_opt(ms("kernel"), 2),
                        fmt_opt(gf("kernel"), 1),
                        fmt_opt(gf("kernel").map(|g| 100.0 * g / (peak * t as f64)), 0),
                        fmt_opt(per_cpu(&case("kernel", t, len), flops), 1),
                        fmt_opt(per_cpu(&case("fused", t, len), flops), 1),
                        fmt_opt(ms("unfused").zip(ms("fused")).map(|(u, f)| u / f), 2),
                        diff("fused"),
                        diff("kernel"),
                    ]);
                }
            }
        });
    });
    println!(
        "\nattention core, B=1 H={} D={} ({layout:?}); flops = 4·B·H·L²·D; peak = {peak:.1} GFLOP/s per thread (FMA loop measured in this run, before and after the benches: {peak_before:.1} / {peak_after:.1})\n{}\n{}",
        shape.heads,
        shape.head_dim,
        table.render(),
        machine_note()
    );
}

criterion_group!(attention_core, benches);
criterion_main!(attention_core);
