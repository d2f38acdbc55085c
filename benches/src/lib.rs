//! Shared pieces of attnrt's benchmarks (`benches/benches/*.rs`, `src/bin/peak_mem.rs`):
//!
//! - [`graphs`]: the ONNX graphs, built in Rust at bench start (attention core fused/unfused,
//!   one MHA layer, a BERT-shaped encoder);
//! - [`alloc`]: a counting global allocator for peak-heap measurements;
//! - [`ort`]: runs `benches/python/ort_bench.py` (ONNX Runtime) in the same run, when a Python
//!   with onnxruntime is available;
//! - small helpers: seeded inputs, flop counts, fusion with a check that it happened, output
//!   comparison, env-var overrides of the benchmark sizes, and a results table.
//!
//! See `benches/README.md` for the commands and the measured numbers.

pub mod alloc;
pub mod graphs;
pub mod ort;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use attnrt::harness::{diff_tensor, Tolerance};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::ModelProto;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};

pub use graphs::{AttentionShape, CoreLayout, EncoderShape};

/// The attention shape of the benchmarks: 12 heads of 64 (`d_model` 768).
/// One layer's projections of the 125M LLaMA-style decoder of the generation benchmarks
/// (hidden 768, 12 query / 4 KV heads of 64, MLP 2048), `(k, n)`: q, k, v, o, gate, up, down.
pub const LLAMA_125M_LAYER: [(usize, usize); 7] = [
    (768, 768),
    (768, 256),
    (768, 256),
    (768, 768),
    (768, 2048),
    (768, 2048),
    (2048, 768),
];

pub const BERT_BASE_ATTENTION: AttentionShape = AttentionShape {
    heads: 12,
    head_dim: 64,
};

/// Flops of the attention core, `4·B·H·Lq·Lk·D` (two matmuls, multiply-add = 2 flops).
pub fn attention_flops(
    batch: usize,
    heads: usize,
    q_len: usize,
    kv_len: usize,
    head_dim: usize,
) -> f64 {
    4.0 * batch as f64 * heads as f64 * q_len as f64 * kv_len as f64 * head_dim as f64
}

/// A float input of `shape` filled with seeded uniform values in `±1`.
pub fn random_input(name: &str, shape: &[usize], seed: u64) -> Result<NamedTensor> {
    let n = shape.iter().product();
    let data = graphs::seeded_values(seed, n, 1.0);
    let tensor = Tensor::from_shape(shape, &data)
        .with_context(|| format!("building input '{name}' {shape:?}"))?;
    Ok(NamedTensor {
        name: name.into(),
        tensor,
    })
}

/// Inputs `q`, `k`, `v` of the attention-core graphs for sequence length `len`.
pub fn core_inputs(
    shape: AttentionShape,
    layout: CoreLayout,
    len: usize,
    seed: u64,
) -> Result<Vec<NamedTensor>> {
    let dims = match layout {
        CoreLayout::FourD => vec![1, shape.heads, len, shape.head_dim],
        CoreLayout::ThreeD => vec![1, len, shape.hidden()],
    };
    ["q", "k", "v"]
        .iter()
        .enumerate()
        .map(|(i, n)| random_input(n, &dims, seed + i as u64))
        .collect()
}

/// Fuses `model` and fails unless exactly `expected_blocks` attention blocks were fused: a
/// "fused" benchmark that fused nothing would silently time the unfused graph.
pub fn fuse_expecting(
    model: &ModelProto,
    expected_blocks: usize,
    what: &str,
) -> Result<ModelProto> {
    let fused = fuse(model, &FusionOptions::default()).with_context(|| format!("fusing {what}"))?;
    let got = fused.report.blocks.len();
    if got != expected_blocks {
        bail!(
            "fusing {what}: {got} block(s) fused, expected {expected_blocks}:\n{}",
            fused.report.explain_lines().join("\n")
        );
    }
    Ok(fused.model)
}

/// Largest `|a − b|` between the first outputs of two runs, failing if shapes differ or the
/// values are outside attnrt's default tolerance (the fused and unfused paths must agree).
pub fn check_same_output(
    actual: &[NamedTensor],
    reference: &[NamedTensor],
    what: &str,
) -> Result<f64> {
    let (a, r) = match (actual.first(), reference.first()) {
        (Some(a), Some(r)) => (a, r),
        _ => bail!("{what}: a run produced no output"),
    };
    let d = diff_tensor(&r.name, &a.tensor, &r.tensor, Tolerance::default());
    ensure!(
        d.ok,
        "{what}: fused and unfused outputs differ (max |a−b| {:.3e}, {} mismatches{})",
        d.max_abs,
        d.mismatches,
        d.problem.map(|p| format!(", {p}")).unwrap_or_default()
    );
    Ok(d.max_abs)
}

/// Builds a session for `model` on `inputs`, naming the model in errors (the same path as
/// `attnrt run`: shapes come from the given inputs, declared `value_info` shapes are ignored).
/// `attnrt_ops` ([`SessionOptions::attnrt_ops`]): the projections, `LayerNormalization` and
/// `Gelu` on attnrt's ops as `attnrt run` runs them ([`ATTNRT_OPS`]), or on tract's as plain
/// tract-onnx does ([`TRACT_OPS`], the peer baseline).
pub fn session(
    model: &ModelProto,
    inputs: &[NamedTensor],
    threads: &Threads,
    what: &str,
    attnrt_ops: bool,
) -> Result<Session> {
    let options = SessionOptions {
        attnrt_ops,
        ..SessionOptions::per_shape()
    };
    Session::build_with_options(model, inputs, threads, what, &options)
}

/// [`session`]'s `attnrt_ops` as `attnrt run` runs a model: attnrt's projection,
/// `LayerNormalization` and `Gelu` ops.
pub const ATTNRT_OPS: bool = true;

/// [`session`]'s `attnrt_ops` for the peer baseline: tract's own ops, as plain tract-onnx.
pub const TRACT_OPS: bool = false;

/// A comma-separated list of numbers from environment variable `var`, or `default` when unset.
/// Lets a user run a subset, e.g. `ATTNRT_BENCH_LENS=128,512 cargo bench ...`.
pub fn env_list(var: &str, default: &[usize]) -> Result<Vec<usize>> {
    match std::env::var(var) {
        Err(_) => Ok(default.to_vec()),
        Ok(s) => s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                p.trim()
                    .parse::<usize>()
                    .with_context(|| format!("{var}={s}: '{p}' is not a number"))
            })
            .collect(),
    }
}

/// CPU time (user + system) this process has used, in seconds, from `/proc/self/stat` (10 ms
/// resolution); `None` off Linux. On a shared machine, work / CPU-second estimates what an
/// uncontended core would do, where work / wall-second also counts time the OS gave to others.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // USER_HZ is 100 on every Linux configuration Rust targets.
    Some((utime + stime) / 100.0)
}

/// Median of `samples` (0 for none).
pub fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub use attnrt::harness::quartiles;

/// Per-iteration times of each benchmark case, kept alongside criterion's own analysis so the
/// benches can print one table with medians, GFLOP/s and ratios at the end of the run.
#[derive(Default, Debug)]
pub struct Samples {
    ms: BTreeMap<String, Vec<f64>>,
}

impl Samples {
    /// Records `total / iters` for `case` (what criterion's `iter_custom` measured).
    pub fn record(&mut self, case: &str, total: Duration, iters: u64) {
        let per = total.as_secs_f64() * 1e3 / iters.max(1) as f64;
        self.ms.entry(case.to_string()).or_default().push(per);
    }

    /// Median per-iteration milliseconds of `case`, if it ran.
    pub fn median_ms(&self, case: &str) -> Option<f64> {
        self.ms.get(case).map(|s| median(s))
    }
}

/// A plain-text table, printed after the criterion output.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (cells beyond the header are kept; missing ones print empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as Markdown, columns padded for reading in a terminal.
    pub fn render(&self) -> String {
        let cols = self
            .header
            .len()
            .max(self.rows.iter().map(Vec::len).max().unwrap_or(0));
        let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
        let width: Vec<usize> = (0..cols)
            .map(|i| {
                std::iter::once(&self.header)
                    .chain(&self.rows)
                    .map(|r| cell(r, i).chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |r: &Vec<String>| {
            let cells: Vec<String> = (0..cols)
                .map(|i| format!("{:<w$}", cell(r, i), w = width[i]))
                .collect();
            format!("| {} |", cells.join(" | "))
        };
        let mut out = vec![line(&self.header)];
        out.push(format!(
            "|{}|",
            width
                .iter()
                .map(|w| "-".repeat(w + 2))
                .collect::<Vec<_>>()
                .join("|")
        ));
        out.extend(self.rows.iter().map(line));
        out.join("\n")
    }
}

/// Formats an optional number with `digits` decimals, or `–`.
pub fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// A row of a paired table (`case`, threads, `b`'s median ms, `a`'s, the median of the
/// per-round ratios `b / a` with its quartiles), times to `decimals` places.
pub fn paired_row(
    case: &str,
    threads: usize,
    t: &attnrt::harness::PairedTiming,
    decimals: usize,
) -> Vec<String> {
    let [q1, ratio, q3] = t.ratio_b_over_a;
    vec![
        case.to_string(),
        threads.to_string(),
        format!("{:.decimals$}", t.b.median_ms),
        format!("{:.decimals$}", t.a.median_ms),
        format!("{ratio:.2}x ({q1:.2}-{q3:.2})"),
    ]
}

/// The load average and whether other heavy processes (compilers) are running, to print next to
/// timings: the machine is shared, and a timing taken during a build is not worth much.
pub fn machine_note() -> String {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let busy = busy_processes();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if busy.is_empty() {
        format!("{cores} cores, load average (1 min) {load}, no rustc/cargo build running")
    } else {
        format!(
            "{cores} cores, load average (1 min) {load}; WARNING: also running: {}",
            busy.join(", ")
        )
    }
}

/// Names of running compiler processes (rustc, cc, ld), read from `/proc`.
fn busy_processes() -> Vec<String> {
    let mut found = BTreeMap::<String, usize>::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) {
                let comm = comm.trim();
                if ["rustc", "cc1", "cc1plus", "ld", "lld", "python3", "python"].contains(&comm) {
                    *found.entry(comm.to_string()).or_default() += 1;
                }
            }
        }
    }
    found.into_iter().map(|(k, n)| format!("{k}×{n}")).collect()
}

/// Single-thread f32 FMA throughput of this core right now, in GFLOP/s (2 flops per lane per
/// FMA): 12 independent vector accumulators on the widest FMA the CPU has (AVX-512, else
/// AVX2+FMA, else 0.0 = unknown), best of three ≈ 0.1 s runs. Benchmarks report the kernel's
/// share of *this* figure, measured in the same run, because a nominal peak depends on the
/// machine and on how much of the host the VM gets at the moment.
pub fn measured_fma_peak_gflops() -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        use attnrt_kernels::Isa;
        // The CPU's features as attnrt's kernels see them (`Isa` is the one place that probes).
        let (run, lanes): (fn(u64) -> f32, f64) = match Isa::best_available() {
            // SAFETY (inside): only called on a CPU with the features.
            Isa::Avx512 => (|n| unsafe { fma_loop_avx512(n) }, 16.0),
            Isa::Avx2 => (|n| unsafe { fma_loop_avx2(n) }, 8.0),
            Isa::Scalar => return 0.0,
        };
        let iters = 4_000_000u64;
        let mut best = 0.0f64;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            std::hint::black_box(run(std::hint::black_box(iters)));
            let s = t.elapsed().as_secs_f64();
            best = best.max(iters as f64 * 24.0 * lanes * 2.0 / s / 1e9);
        }
        best
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0.0
    }
}

/// Expands to `n` rounds of one FMA on each of the named accumulators (separate locals, so they
/// live in registers; an array would be kept in memory), then their sum through `$reduce`.
macro_rules! fma_rounds {
    ($n:expr, $fma:ident, $set1:ident, $reduce:expr, [$($a:ident),*]) => {{
        let b = $set1(0.999_999);
        let c = $set1(1e-7);
        let mut k = 0.0f32;
        $( let mut $a = $set1(k); k += 1e-3; )*
        let _ = k;
        for _ in 0..$n {
            $( $a = $fma($a, b, c); )*
        }
        0.0 $( + $reduce($a) )*
    }};
}

/// `2n` rounds of 12 independent FMAs on zmm registers (more than the 8 needed to cover the FMA
/// latency on two ports; with 24, LLVM spills some to the stack). Returns a value depending on
/// every accumulator.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(n: u64) -> f32 {
    use std::arch::x86_64::*;
    fma_rounds!(
        2 * n,
        _mm512_fmadd_ps,
        _mm512_set1_ps,
        _mm512_reduce_add_ps,
        [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11]
    )
}

/// As [`fma_loop_avx512`] on ymm registers: 12 accumulators (AVX2 has 16 registers), twice per
/// round so the flop count per round matches the 24-FMA AVX-512 loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(n: u64) -> f32 {
    use std::arch::x86_64::*;
    let first = |v: __m256| _mm256_cvtss_f32(v);
    fma_rounds!(
        2 * n,
        _mm256_fmadd_ps,
        _mm256_set1_ps,
        first,
        [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11]
    )
}

/// Sums `data` in `parts` chunks on the current rayon pool: a read of the buffer at the memory's
/// bandwidth (16 running sums per chunk, so the loop is bound by loads, not by adds), the
/// reference the decode benches compare their cache reads with.
pub fn read_sum(data: &[f32], parts: usize) -> f32 {
    use rayon::prelude::*;
    data.par_chunks(data.len().div_ceil(parts.max(1)).max(1))
        .map(|s| {
            let mut acc = [0.0f32; 16];
            for c in s.chunks_exact(16) {
                for (a, x) in acc.iter_mut().zip(c) {
                    *a += x;
                }
            }
            acc.iter().sum::<f32>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(model: &ModelProto, inputs: &[NamedTensor], what: &str) -> Vec<NamedTensor> {
        let threads = Threads::new(Some(1)).unwrap();
        session(model, inputs, &threads, what, ATTNRT_OPS)
            .unwrap()
            .run(inputs)
            .unwrap()
    }

    /// The fused `Attention` node and the decomposed chain compute the same thing, in both
    /// layouts: otherwise the core benchmark would compare different work.
    #[test]
    fn attention_core_graphs_agree() {
        let shape = AttentionShape {
            heads: 3,
            head_dim: 8,
        };
        for layout in [CoreLayout::FourD, CoreLayout::ThreeD] {
            let inputs = core_inputs(shape, layout, 17, 5).unwrap();
            let fused = run(
                &graphs::attention_op_model(shape, layout).unwrap(),
                &inputs,
                "fused",
            );
            let chain = run(
                &graphs::attention_chain_model(shape, layout).unwrap(),
                &inputs,
                "chain",
            );
            let d = check_same_output(&fused, &chain, "core").unwrap();
            assert!(d < 1e-5, "{layout:?}: {d}");
            let dims = match layout {
                CoreLayout::FourD => vec![1, 3, 17, 8],
                CoreLayout::ThreeD => vec![1, 17, 24],
            };
            assert_eq!(fused[0].tensor.shape(), dims.as_slice());
        }
    }

    /// attnrt's fusion recognises the benchmark's chains (one block per attention), and the
    /// fused models give the unfused outputs.
    #[test]
    fn benchmark_graphs_fuse_and_agree() {
        let shape = AttentionShape {
            heads: 2,
            head_dim: 8,
        };
        let chain = graphs::attention_chain_model(shape, CoreLayout::ThreeD).unwrap();
        fuse_expecting(&chain, 1, "core chain").unwrap();

        let layer = graphs::mha_layer_model(shape, 7).unwrap();
        let fused = fuse_expecting(&layer, 1, "mha layer").unwrap();
        let x = vec![random_input("x", &[1, 11, 16], 3).unwrap()];
        let d = check_same_output(
            &run(&fused, &x, "fused"),
            &run(&layer, &x, "unfused"),
            "mha",
        )
        .unwrap();
        assert!(d < 1e-4, "{d}");

        let enc = graphs::bert_encoder_model(
            EncoderShape {
                attention: shape,
                layers: 2,
                ffn: 32,
            },
            9,
        )
        .unwrap();
        let fused = fuse_expecting(&enc, 2, "encoder").unwrap();
        let mut mask = vec![0f32; 11];
        mask[9] = -10000.0;
        mask[10] = -10000.0;
        let inputs = vec![
            random_input("x", &[1, 11, 16], 4).unwrap(),
            NamedTensor {
                name: "mask_bias".into(),
                tensor: Tensor::from_shape(&[1, 1, 1, 11], &mask).unwrap(),
            },
        ];
        let d = check_same_output(
            &run(&fused, &inputs, "fused"),
            &run(&enc, &inputs, "unfused"),
            "encoder",
        )
        .unwrap();
        assert!(d < 1e-4, "{d}");
    }

    /// A wrong fusion count is an error, not a silently unfused "fused" benchmark.
    #[test]
    fn fuse_expecting_rejects_a_wrong_count() {
        let shape = AttentionShape {
            heads: 2,
            head_dim: 8,
        };
        let layer = graphs::mha_layer_model(shape, 7).unwrap();
        let err = fuse_expecting(&layer, 2, "mha layer").unwrap_err();
        assert!(
            format!("{err:#}").contains("1 block(s) fused, expected 2"),
            "{err:#}"
        );
    }

    #[test]
    fn helpers() {
        assert_eq!(
            attention_flops(1, 12, 2048, 2048, 64),
            4.0 * 12.0 * 2048.0 * 2048.0 * 64.0
        );
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        if cfg!(target_os = "linux") {
            let a = process_cpu_seconds().unwrap();
            let mut x = 0u64;
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_millis(300) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let b = process_cpu_seconds().unwrap();
            assert!(b - a >= 0.05, "busy loop of 300 ms counted {} CPU s", b - a);
        }
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let mut s = Samples::default();
        s.record("a", Duration::from_millis(30), 3);
        s.record("a", Duration::from_millis(50), 1);
        s.record("a", Duration::from_millis(20), 1);
        assert_eq!(s.median_ms("a"), Some(20.0));
        assert_eq!(s.median_ms("b"), None);
        let mut t = Table::new(&["case", "ms"]);
        t.row(vec!["x".into(), "1.0".into()]);
        assert_eq!(t.render(), "| case | ms  |\n|------|-----|\n| x    | 1.0 |");
    }

    #[test]
    fn counting_allocator_is_inert_when_not_installed() {
        // The test binary uses the system allocator: the counters stay at 0 and measure() works.
        let (v, grew) = alloc::measure(|| vec![0u8; 1 << 20]);
        assert_eq!(v.len(), 1 << 20);
        assert_eq!(grew, 0);
    }
}
