//! One decode step of attention with a key/value cache: 32 query heads, 8 KV heads, head 128,
//! batch 1, one new token, past length P ∈ {1024, 4096, 16384}, 2 threads.
//!
//! * `bandwidth`: the machine's memory bandwidth in this run, with the same threads: a copy of
//!   256 MB into another 256 MB buffer (bytes read + written per second) and a read-sum of
//!   256 MB (bytes read per second); best of 5.
//! * `kernel/<route>/P<p>`: `attnrt_kernels::attention` alone on the present cache, with the
//!   kernel set on that route,
//!   (`P + 1` keys), route `decode` (the new path) and `flash` (the path before it). Bytes moved:
//!   K and V read once; compared with the read bandwidth.
//! * `op/<route>/P<p>`: the ONNX model of one `Attention` node (opset 23, `past_key`/`past_value`
//!   in, `present_key`/`present_value` out) through `attnrt_runtime::Session::run_owned` (inputs
//!   moved in, as `attnrt generate` feeds the cache back), with `Route::set_current` choosing
//!   the path. Bytes moved: the least any implementation moves, past K/V read + present K/V
//!   written (attnrt also reads present once more to attend); compared with the copy bandwidth.
//! * ONNX Runtime on the same model file (`python/ort_decode_bench.py`, run right after attnrt's
//!   cases of each length), when `$ATTNRT_PYTHON` (else `python3`) imports onnxruntime.
//!
//! A table at the end: median ms, GB/s, share of the measured bandwidth, flash/decode and
//! ORT/attnrt ratios. Options: `ATTNRT_BENCH_LENS` (past lengths), `ATTNRT_BENCH_THREADS` (first
//! value), `ATTNRT_BENCH_ORT=0`.
//! Run: `cargo bench -p attnrt-benches --bench decode`.

use std::cell::RefCell;
use std::process::Command;
use std::time::{Duration, Instant};

use attnrt_benches::graphs::{attention_decode_model, seeded_values, DecodeShape};
use attnrt_benches::{
    env_list, machine_note, median, ort, random_input, read_sum, session, Samples, Table,
    ATTNRT_OPS,
};
use attnrt_kernels::{attention, AttentionParams, KernelSet, Mask, Route, View4, ViewMut4};
use attnrt_onnx::{save_model, SaveOptions};
use attnrt_runtime::{NamedTensor, Threads};
use criterion::{criterion_group, criterion_main, Criterion};
use rayon::prelude::*;

/// The allocator the shipped CLI and Python module use (`--no-default-features`: the system's).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SHAPE: DecodeShape = DecodeShape {
    q_heads: 32,
    kv_heads: 8,
    head_dim: 128,
};

thread_local! {
    static SAMPLES: RefCell<Samples> = RefCell::new(Samples::default());
}

fn timed(b: &mut criterion::Bencher, name: &str, mut run: impl FnMut() -> Duration) {
    b.iter_custom(|iters| {
        let total: Duration = (0..iters).map(|_| run()).sum();
        SAMPLES.with(|s| s.borrow_mut().record(name, total, iters));
        total
    });
}

/// Copy and read bandwidth, GB/s, with the pool's threads (best of 5; buffers far past L3).
fn bandwidth(threads: &Threads) -> (f64, f64) {
    let n = 64 << 20; // floats: 256 MB per buffer
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let chunk = n / threads.count().max(1);
    let (mut copy, mut read) = (0.0f64, 0.0f64);
    for _ in 0..5 {
        let t = Instant::now();
        threads.install(|| {
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(|(d, s)| d.copy_from_slice(s))
        });
        copy = copy.max(2.0 * 4.0 * n as f64 / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        let sum = threads.install(|| read_sum(&src, threads.count()));
        std::hint::black_box(sum);
        read = read.max(4.0 * n as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&dst);
    (copy, read)
}

/// Bytes of K and V of `keys` keys.
fn cache_bytes(keys: usize) -> f64 {
    2.0 * (SHAPE.kv_heads * keys * SHAPE.head_dim * 4) as f64
}

/// The kernel alone on `route` over a present cache of `past + 1` keys.
fn bench_kernel(c: &mut Criterion, threads: &Threads, past: usize) {
    let (hq, hkv, d) = (SHAPE.q_heads, SHAPE.kv_heads, SHAPE.head_dim);
    let keys = past + 1;
    let q = seeded_values(1, hq * d, 1.0);
    let k = seeded_values(2, hkv * keys * d, 1.0);
    let v = seeded_values(3, hkv * keys * d, 1.0);
    let params = AttentionParams::new(AttentionParams::default_scale(d));
    let kernels = KernelSet::resolve().expect("kernel set");
    let mut outs = Vec::new();
    for route in [Route::Decode, Route::Flash] {
        let kernels = kernels.with_route(route);
        let name = format!("kernel/{}/P{past}", route.name());
        let mut out = vec![0.0f32; hq * d];
        let call = |out: &mut [f32]| {
            let qv = View4::contiguous(&q, [1, hq, 1, d]).expect("q");
            let kv = View4::contiguous(&k, [1, hkv, keys, d]).expect("k");
            let vv = View4::contiguous(&v, [1, hkv, keys, d]).expect("v");
            let mut ov = ViewMut4::contiguous(out, [1, hq, 1, d]).expect("out");
            threads
                .install(|| attention(&kernels, &qv, &kv, &vv, &Mask::None, &params, &mut ov))
                .expect("kernel");
        };
        call(&mut out);
        c.bench_function(&name, |b| {
            timed(b, &name, || {
                let t = Instant::now();
                call(&mut out);
                t.elapsed()
            })
        });
        outs.push(out);
    }
    let diff = outs[0]
        .iter()
        .zip(&outs[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("kernel P{past}: max |decode − flash| = {diff:.2e}");
    assert!(diff < 1e-4, "decode and flash disagree at P{past}");
}

fn decode_inputs(past: usize) -> Vec<NamedTensor> {
    let (hq, hkv, d) = (SHAPE.q_heads, SHAPE.kv_heads, SHAPE.head_dim);
    [
        ("q", vec![1, hq, 1, d]),
        ("k", vec![1, hkv, 1, d]),
        ("v", vec![1, hkv, 1, d]),
        ("past_key", vec![1, hkv, past, d]),
        ("past_value", vec![1, hkv, past, d]),
    ]
    .iter()
    .enumerate()
    .map(|(i, (n, s))| random_input(n, s, 10 + i as u64).expect("input"))
    .collect()
}

/// The `Attention` model through a session, on the decode route and on the flash route.
fn bench_op(c: &mut Criterion, threads: &Threads, past: usize) {
    let model = attention_decode_model(SHAPE).expect("decode model");
    let inputs = decode_inputs(past);
    let mut ys = Vec::new();
    for route in [Route::Decode, Route::Flash] {
        // A session takes the route when it is built.
        Route::set_current(route);
        let s = session(&model, &inputs, threads, "decode step", ATTNRT_OPS).expect("session");
        let name = format!("op/{}/P{past}", route.name());
        let first = s.run(&inputs).expect("first run");
        ys.push(first.into_iter().next().expect("y").tensor);
        c.bench_function(&name, |b| {
            timed(b, &name, || {
                let owned = inputs.clone();
                let t = Instant::now();
                std::hint::black_box(s.run_owned(owned).expect("run"));
                t.elapsed()
            })
        });
    }
    Route::set_current(Route::Auto);
    let (a, b) = (
        ys[0]
            .try_as_plain_ram()
            .expect("plain")
            .as_slice::<f32>()
            .expect("y"),
        ys[1]
            .try_as_plain_ram()
            .expect("plain")
            .as_slice::<f32>()
            .expect("y"),
    );
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    println!("op P{past}: max |decode − flash| = {diff:.2e}");
    assert!(diff < 1e-4, "decode and flash routes disagree at P{past}");
}

/// ONNX Runtime's median ms on the same model at `past`, if it runs here.
fn ort_ms(model_path: &std::path::Path, past: usize, threads: usize) -> Option<(f64, String)> {
    let script = ort::script_path().with_file_name("ort_decode_bench.py");
    let out = Command::new(ort::python())
        .arg(script)
        .args(["--model", &model_path.to_string_lossy()])
        .args([
            "--past",
            &past.to_string(),
            "--threads",
            &threads.to_string(),
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "ONNX Runtime skipped at P{past}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last()?).ok()?;
    let ms: Vec<f64> = v["ms"]
        .as_array()?
        .iter()
        .filter_map(|x| x.as_f64())
        .collect();
    Some((median(&ms), v["onnxruntime"].as_str()?.to_string()))
}

fn decode_step(c: &mut Criterion) {
    let lens = env_list("ATTNRT_BENCH_LENS", &[1024, 4096, 16384]).expect("ATTNRT_BENCH_LENS");
    let t = env_list("ATTNRT_BENCH_THREADS", &[2]).expect("ATTNRT_BENCH_THREADS")[0];
    let threads = Threads::new(Some(t)).expect("threads");
    let with_ort = std::env::var("ATTNRT_BENCH_ORT").map_or(true, |v| v != "0");
    println!("{}", machine_note());
    println!(
        "threads: {t}, ISA: {}",
        KernelSet::resolve().expect("kernels").isa()
    );
    let (copy_bw, read_bw) = bandwidth(&threads);
    println!("measured bandwidth ({t} threads): copy {copy_bw:.1} GB/s (read+write), read {read_bw:.1} GB/s");
    let model_path =
        std::env::temp_dir().join(format!("attnrt-decode-{}.onnx", std::process::id()));
    save_model(
        &attention_decode_model(SHAPE).expect("model"),
        &model_path,
        &SaveOptions::default(),
    )
    .expect("saving the decode model");
    let mut ort_results = Vec::new();
    for &past in &lens {
        bench_kernel(c, &threads, past);
        bench_op(c, &threads, past);
        ort_results.push(if with_ort {
            ort_ms(&model_path, past, t)
        } else {
            None
        });
    }
    let _ = std::fs::remove_file(&model_path);
    print_table(&lens, &ort_results, copy_bw, read_bw);
}

fn print_table(lens: &[usize], ort: &[Option<(f64, String)>], copy_bw: f64, read_bw: f64) {
    let mut table = Table::new(&[
        "past",
        "case",
        "decode ms",
        "flash ms",
        "flash/decode",
        "GB/s",
        "% of bandwidth",
        "ORT ms",
        "ORT/attnrt",
    ]);
    let ms = |case: &str| SAMPLES.with(|s| s.borrow().median_ms(case));
    let fmt = |x: Option<f64>, digits: usize| x.map_or("-".into(), |v| format!("{v:.digits$}"));
    for (&past, ort) in lens.iter().zip(ort) {
        for (what, bytes, bw) in [
            ("kernel", cache_bytes(past + 1), read_bw),
            ("op", cache_bytes(past) + cache_bytes(past + 1), copy_bw),
        ] {
            let dec = ms(&format!("{what}/decode/P{past}"));
            let fl = ms(&format!("{what}/flash/P{past}"));
            let gbs = dec.map(|m| bytes / (m * 1e-3) / 1e9);
            let ort_ms = ort.as_ref().filter(|_| what == "op").map(|o| o.0);
            table.row(vec![
                past.to_string(),
                what.into(),
                fmt(dec, 3),
                fmt(fl, 3),
                fmt(dec.zip(fl).map(|(d, f)| f / d), 2),
                fmt(gbs, 1),
                fmt(gbs.map(|g| 100.0 * g / bw), 0),
                fmt(ort_ms, 3),
                fmt(ort_ms.zip(dec).map(|(o, d)| o / d), 2),
            ]);
        }
    }
    if let Some(Some((_, version))) = ort.iter().find(|o| o.is_some()) {
        println!("onnxruntime {version}");
    }
    println!("kernel: bytes = present K+V read, vs read bandwidth {read_bw:.1} GB/s; op: bytes = past K+V read + present K+V written, vs copy bandwidth {copy_bw:.1} GB/s");
    println!("{}", table.render());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = decode_step
}
criterion_main!(benches);
