//! Kernel-only benchmark of `attnrt-kernels` (no ONNX, no tract).
//!
//! * `kernel_vs_reference`: the flash kernel against the naive f64 reference at small L.
//! * `kernel/<isa>/t<threads>/L<len>`: the kernel alone, B=1, H=12, D=64, L ∈ {128, 512, 2048,
//!   4096}, every ISA path of this CPU (the portable path only up to L=512: it is slow), 1 and 2
//!   threads for the best path, plus causal and three padding-mask cases at L=2048 (one row; the
//!   same row widened to `[1, 1, L, L]`; an `[1, 1, L, L]` mask whose rows differ).
//!
//! Throughput is reported as elements = flops (4·B·H·Lq·Lk·D, dense count even for causal), so
//! criterion's "elem/s" reads as flop/s; a `GFLOP/s` summary table is printed at the end, then
//! the single-thread share of FMA peak from rounds that pair each kernel call with the probe
//! (`SHARE` lines, see `interleaved_share`).
//! Run: `cargo bench -p attnrt-benches --bench kernel`.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use attnrt_kernels::{
    attention, reference, AttentionParams, Isa, KernelSet, Mask, View4, ViewMut4,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// What is applied on top of the plain scaled dot product.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Dense,
    Causal,
    /// An additive padding mask (last 7 keys −10000), one row `[1, 1, 1, L]` for every query.
    MaskRow,
    /// The same mask widened to `[1, 1, L, L]` (as models that expand their mask pass it): the
    /// kernel finds the rows equal and reads it as `MaskRow`.
    MaskFull,
    /// A `[1, 1, L, L]` mask whose rows differ (query `i` loses its last `7 + i % 3` keys): read
    /// as an `L×L` block, transposed per head.
    MaskVarying,
}

struct Problem {
    mask_row: Vec<f32>,
    mask_full: Vec<f32>,
    mask_varying: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    out: Vec<f32>,
    heads: usize,
    len: usize,
    head_dim: usize,
}

impl Problem {
    fn new(heads: usize, len: usize, head_dim: usize) -> Self {
        let n = heads * len * head_dim;
        let fill = |c: f32| {
            (0..n)
                .map(|i| ((i as f32) * 0.013 + c).sin())
                .collect::<Vec<f32>>()
        };
        let pad = |j: usize| if j + 7 < len { 0.0 } else { -10000.0 };
        Problem {
            mask_row: (0..len).map(pad).collect(),
            mask_full: (0..len * len).map(|i| pad(i % len)).collect(),
            mask_varying: (0..len * len)
                .map(|i| pad(i % len + (i / len) % 3))
                .collect(),
            q: fill(0.1),
            k: fill(0.2),
            v: fill(0.3),
            out: vec![0.0; n],
            heads,
            len,
            head_dim,
        }
    }

    fn flops(&self) -> u64 {
        4 * (self.heads * self.len * self.len * self.head_dim) as u64
    }

    /// The 3-D `[B, L, H·D]` layout, as the runtime passes ONNX tensors.
    fn run(&mut self, isa: Isa, variant: Variant, use_reference: bool) {
        let (h, l, d) = (self.heads, self.len, self.head_dim);
        let q = View4::from_bshd(&self.q, 1, l, h, d).unwrap();
        let k = View4::from_bshd(&self.k, 1, l, h, d).unwrap();
        let v = View4::from_bshd(&self.v, 1, l, h, d).unwrap();
        let mut out = ViewMut4::from_bshd(&mut self.out, 1, l, h, d).unwrap();
        let params = AttentionParams {
            scale: AttentionParams::default_scale(d),
            causal: (variant == Variant::Causal).then_some(0),
            softcap: None,
        };
        let mask = match variant {
            Variant::MaskRow => {
                Mask::Additive(View4::contiguous(&self.mask_row, [1, 1, 1, l]).unwrap())
            }
            Variant::MaskFull => {
                Mask::Additive(View4::contiguous(&self.mask_full, [1, 1, l, l]).unwrap())
            }
            Variant::MaskVarying => {
                Mask::Additive(View4::contiguous(&self.mask_varying, [1, 1, l, l]).unwrap())
            }
            Variant::Dense | Variant::Causal => Mask::None,
        };
        if use_reference {
            reference::attention(&q, &k, &v, &mask, &params, &mut out).unwrap();
        } else {
            let kernels = KernelSet::for_isa(isa).unwrap();
            attention(&kernels, &q, &k, &v, &mask, &params, &mut out).unwrap();
        }
    }
}

thread_local! {
    static SUMMARY: RefCell<Vec<(String, u64, Vec<Duration>)>> = const { RefCell::new(Vec::new()) };
}

/// Times with `iter_custom` so the per-iteration times are also kept for the summary.
#[allow(clippy::too_many_arguments)]
fn bench_case(
    c: &mut Criterion,
    group: &str,
    id: String,
    heads: usize,
    len: usize,
    threads: usize,
    isa: Isa,
    variant: Variant,
    use_reference: bool,
) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut p = Problem::new(heads, len, 64);
    let flops = p.flops();
    let name = format!("{group}/{id}");
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(flops));
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(if len >= 2048 { 6 } else { 2 }));
    g.bench_function(BenchmarkId::from_parameter(&id), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                pool.install(|| p.run(isa, variant, use_reference));
            }
            let total = start.elapsed();
            SUMMARY.with(|s| {
                let mut s = s.borrow_mut();
                match s.iter_mut().find(|e| e.0 == name) {
                    Some(e) => e.2.push(total / iters as u32),
                    None => s.push((name.clone(), flops, vec![total / iters as u32])),
                }
            });
            total
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let best = Isa::best_available();
    let peak_before = attnrt_benches::measured_fma_peak_gflops();
    bench_case(
        c,
        "kernel_vs_reference",
        format!("{best}/H4/L128"),
        4,
        128,
        1,
        best,
        Variant::Dense,
        false,
    );
    bench_case(
        c,
        "kernel_vs_reference",
        "reference/H4/L128".into(),
        4,
        128,
        1,
        best,
        Variant::Dense,
        true,
    );

    for isa in Isa::available() {
        let lens: &[usize] = match isa {
            Isa::Scalar => &[128, 512],
            _ if isa == best => &[128, 512, 2048, 4096],
            _ => &[128, 512, 2048],
        };
        let threads: &[usize] = if isa == best { &[1, 2] } else { &[1] };
        for &t in threads {
            for &len in lens {
                bench_case(
                    c,
                    "kernel",
                    format!("{isa}/t{t}/L{len}"),
                    12,
                    len,
                    t,
                    isa,
                    Variant::Dense,
                    false,
                );
            }
        }
    }
    for t in [1, 2] {
        bench_case(
            c,
            "kernel",
            format!("{best}/t{t}/L2048-causal"),
            12,
            2048,
            t,
            best,
            Variant::Causal,
            false,
        );
    }
    // Padding masks at L=2048: one row for all queries, the same widened to [1, 1, L, L], and
    // an [1, 1, L, L] mask whose rows differ.
    for (name, variant) in [
        ("mask-row", Variant::MaskRow),
        ("mask-full", Variant::MaskFull),
        ("mask-varying", Variant::MaskVarying),
    ] {
        bench_case(
            c,
            "kernel",
            format!("{best}/t1/L2048-{name}"),
            12,
            2048,
            1,
            best,
            variant,
            false,
        );
    }

    // Interleaved kernel/probe rounds (see `interleaved_share`), after criterion's cases.
    let shares: Vec<(usize, Shares)> = if best == Isa::Scalar {
        Vec::new()
    } else {
        [(512, 40), (2048, 12), (4096, 6)]
            .into_iter()
            .map(|(len, rounds)| (len, interleaved_share(best, len, rounds)))
            .collect()
    };

    // One core's FMA throughput measured in this run (the larger of a probe before and after).
    let peak = peak_before.max(attnrt_benches::measured_fma_peak_gflops());
    SUMMARY.with(|s| {
        println!("\nattention core, B=1 H=12 D=64 (H=4 for kernel_vs_reference); flops = 4·B·H·L²·D (dense count); one core's measured FMA peak {peak:.1} GFLOP/s");
        println!("{:<44} {:>12} {:>12} {:>16}", "case", "median ms", "GFLOP/s", "% of peak×thr");
        for (name, flops, times) in s.borrow().iter() {
            let mut t = times.clone();
            t.sort();
            let med = t[t.len() / 2].as_secs_f64();
            let gflops = *flops as f64 / med / 1e9;
            // The thread count is the `t<n>` part of the case name (1 when absent).
            let threads = name
                .split('/')
                .find_map(|p| p.strip_prefix('t').and_then(|n| n.parse::<f64>().ok()))
                .unwrap_or(1.0);
            let pct = if peak > 0.0 { 100.0 * gflops / (peak * threads) } else { f64::NAN };
            println!("GFLOPS {:<37} {:>12.3} {:>12.1} {:>15.0}%", name, med * 1e3, gflops, pct);
        }
    });
    if !shares.is_empty() {
        println!(
            "\nshare of FMA peak, {best} 1 thread, dense: each round times one kernel call, then the probe \
             (best of three), and divides the two; median and quartiles over the rounds"
        );
        println!(
            "{:<10} {:>8} {:>10} {:>10} {:>10}",
            "L", "rounds", "p25", "median", "p75"
        );
        for (len, sh) in &shares {
            println!(
                "SHARE L{:<8} {:>8} {:>9.0}% {:>9.0}% {:>9.0}%",
                len,
                sh.rounds,
                100.0 * sh.p25,
                100.0 * sh.median,
                100.0 * sh.p75
            );
        }
    }
}

/// Quartiles of the per-round ratio kernel GFLOP/s ÷ probe GFLOP/s.
struct Shares {
    rounds: usize,
    p25: f64,
    median: f64,
    p75: f64,
}

/// The kernel's share of one core's FMA peak with both measured at the same moment: `rounds`
/// times, one single-thread kernel call (dense, 3-D layout, H=12, D=64) and right after it the
/// FMA probe, their ratio kept per round. On a shared VM the core's speed drifts by tens of
/// percent between seconds (neighbours, the SMT sibling); the summary table above divides a
/// median over many seconds by the best probe of the run, which counts that drift against the
/// kernel. This pairs each call with the probe's reading of the same moment instead.
fn interleaved_share(isa: Isa, len: usize, rounds: usize) -> Shares {
    let mut p = Problem::new(12, len, 64);
    let flops = p.flops() as f64;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("thread pool");
    let ratios: Vec<f64> = pool.install(|| {
        p.run(isa, Variant::Dense, false);
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                p.run(isa, Variant::Dense, false);
                let kernel = flops / t.elapsed().as_secs_f64() / 1e9;
                kernel / attnrt_benches::measured_fma_peak_gflops()
            })
            .collect()
    });
    let [p25, median, p75] = attnrt_benches::quartiles(&ratios);
    Shares {
        rounds,
        p25,
        median,
        p75,
    }
}

criterion_group!(kernel, benches);
criterion_main!(kernel);
