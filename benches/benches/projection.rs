//! The projection micro-kernel (`attnrt_kernels::panel`, AVX-512, weights pre-packed in panels
//! of 64 output features) against the `gemm` crate's kernel on the same packed panels — the two
//! implementations the runtime's projection op can call per task — one thread, on the shapes of
//! BERT-base / GPT-2 small projections: tokens × k · W[k, n] for (k, n) ∈ {768×768, 768×3072,
//! 3072×768} and tokens ∈ {128, 512}. Each case runs the op's task loop (blocks of up to 256
//! tokens × one panel) the two ways in alternation, rounds paired; GFLOP/s (2·tokens·k·n per
//! run) and the share of this core's FMA peak measured in the same run. Skipped on a CPU without
//! AVX-512.
//!
//! A second table runs the projection op's kernel itself (`attnrt_kernels::projection::project`
//! with this process's kernel set, as a session runs it: tasks on a pool of
//! `ATTNRT_BENCH_THREADS` threads, default 2, bias added) with its weight hot (one weight, in the
//! caches after the first call) and cold (cycled through ≥ 120 MB of weights, as a model's
//! weights stream from memory), alternating, against the peak of that many cores (on any CPU: the
//! kernels the set picks there, `gemm` without AVX-512).
//!
//! A third table runs the op at the few tokens of a (batched) decode step on the 125M LLaMA
//! decoder's shapes with cold weights: the process's kernel set (where AVX2 is the best ISA, the
//! AVX2 panel kernel up to 8 tokens) against the same set with every task on `gemm`
//! (`ATTNRT_BENCH_DECODE_TOKENS`, default 1,2,4,8,16).
//!
//! ```sh
//! cargo bench -p attnrt-benches --bench projection
//! ATTNRT_BENCH_ROUNDS=20 ATTNRT_BENCH_LENS=128 cargo bench -p attnrt-benches --bench projection
//! ```

use std::time::Instant;

use anyhow::Result;
use attnrt_benches::{env_list, machine_note, measured_fma_peak_gflops, median, Table};
use attnrt_kernels::panel::{panel_product, Onto, PanelKernel, PanelProduct, PANEL};
use attnrt_kernels::projection::{project, PackedWeight, Product};
use attnrt_kernels::{Isa, KernelSet};
use attnrt_testkit::seeded_values;

/// Tokens per task, as the runtime's projection op cuts them.
const TOKENS: usize = 256;

/// y = x · W with the op's task loop, on attnrt's panel kernel (`Some`) or the `gemm` crate.
fn run(panel: Option<PanelKernel>, x: &[f32], panels: &[f32], y: &mut [f32], m: usize, k: usize) {
    let n = y.len() / m;
    for t0 in (0..m).step_by(TOKENS) {
        let tokens = TOKENS.min(m - t0);
        for c in 0..n.div_ceil(PANEL) {
            let c0 = c * PANEL;
            let width = PANEL.min(n - c0);
            let w = &panels[c * k * PANEL..(c + 1) * k * PANEL];
            if let Some(kernel) = panel {
                let p = PanelProduct {
                    x: &x[t0 * k..(t0 + tokens) * k],
                    x_stride: k,
                    tokens,
                    k,
                    panel: w,
                    width,
                    alpha: 1.0,
                    onto: Onto::Zero,
                    activation: None,
                };
                panel_product(kernel, &p, &mut y[t0 * n + c0..], n);
                continue;
            }
            // SAFETY: the same block as above: y[t0.., c0..c0 + width] (row stride n) =
            // x[t0.., ..] · panel, every pointer inside its slice.
            unsafe {
                gemm::gemm(
                    width,
                    tokens,
                    k,
                    y.as_mut_ptr().add(t0 * n + c0),
                    n as isize,
                    1,
                    false,
                    w.as_ptr(),
                    PANEL as isize,
                    1,
                    x.as_ptr().add(t0 * k),
                    k as isize,
                    1,
                    1.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
    }
}

fn main() -> Result<()> {
    let lens = env_list("ATTNRT_BENCH_LENS", &[128, 512])?;
    let rounds = env_list("ATTNRT_BENCH_ROUNDS", &[10])?[0];
    println!("{}", machine_note());
    let peak = measured_fma_peak_gflops();
    let avx512_panel = KernelSet::for_isa(Isa::Avx512)
        .ok()
        .and_then(|set| set.projection().panel())
        .map(|(kernel, _)| kernel);
    match avx512_panel {
        Some(panel) => {
            println!(
                "one core's FMA peak, measured: {peak:.1} GFLOP/s; 1 thread, {rounds} paired rounds"
            );
            println!("{}", panel_table(panel, &lens, rounds, peak).render());
        }
        None => println!("no AVX-512 on this CPU: the panel kernel's table is skipped"),
    }
    let threads = env_list("ATTNRT_BENCH_THREADS", &[2])?[0];
    println!("{}", op_table(&lens, rounds, threads, peak)?.render());
    let decode_tokens = env_list("ATTNRT_BENCH_DECODE_TOKENS", &[1, 2, 4, 8, 16])?;
    match decode_table(&decode_tokens, rounds, threads)? {
        Some(table) => println!("{}", table.render()),
        None => println!("the projection kernel runs no task on a panel kernel: no decode table"),
    }
    Ok(())
}

/// The op at the few tokens of a (batched) decode step, weights cold (a pass over ≥ 240 MB of
/// the 125M LLaMA decoder's projection shapes per sample, as a step streams its weights): the
/// process's kernel set (the panel kernel up to its limit) against the same set with every
/// task on `gemm`, alternating, `threads` threads. `None` when the set runs no panel kernel.
fn decode_table(tokens: &[usize], rounds: usize, threads: usize) -> Result<Option<Table>> {
    let kernels = KernelSet::resolve()?;
    let new = *kernels.projection();
    if new.panel().is_none() {
        return Ok(None);
    }
    let old = new.gemm_only();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut table = Table::new(&[
        "decode: tokens × (k × n)",
        "panel ms (min)",
        "gemm ms (min)",
        "gemm / panel (median)",
        "panel GB/s",
        "gemm GB/s",
        "max |Δ|",
    ]);
    // One layer's projections of the decoder (q, k, v, o, gate, up, down) and its lm_head.
    let layer = attnrt_benches::LLAMA_125M_LAYER;
    for (name, shapes) in [
        ("layer", &layer[..]),
        ("lm_head", &[(768usize, 32000usize)][..]),
    ] {
        let bytes: usize = shapes.iter().map(|(k, n)| k * n * 4).sum();
        let copies = (240_000_000 / bytes).max(2);
        let weights: Vec<PackedWeight> = (0..copies)
            .flat_map(|c| {
                shapes
                    .iter()
                    .enumerate()
                    .map(move |(i, &(k, n))| (c * 8 + i, k, n))
            })
            .map(|(seed, k, n)| PackedWeight::new(&seeded_values(k * n, 10 + seed as u32), k, n))
            .collect();
        for &m in tokens {
            let xs: Vec<Vec<f32>> = weights
                .iter()
                .map(|w| seeded_values(m * w.k(), 1))
                .collect();
            let mut ys: Vec<Vec<f32>> = weights.iter().map(|w| vec![0.0; m * w.n()]).collect();
            let mut last = [Vec::new(), Vec::new()];
            let mut samples = [Vec::new(), Vec::new()];
            pool.install(|| {
                for r in 0..rounds + 1 {
                    for which in [r % 2, 1 - r % 2] {
                        let kernel = [&new, &old][which];
                        let t = Instant::now();
                        for ((w, x), y) in weights.iter().zip(&xs).zip(ys.iter_mut()) {
                            let product = Product {
                                w,
                                alpha: 1.0,
                                bias: None,
                                activation: None,
                            };
                            project(kernel, kernels.threads(), x, &product, y, m);
                        }
                        if r > 0 {
                            samples[which].push(t.elapsed().as_secs_f64() * 1e3 / copies as f64);
                        }
                        last[which] = ys.last().cloned().unwrap_or_default();
                    }
                }
            });
            let diff = last[0]
                .iter()
                .zip(&last[1])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            let min = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
            let ratios: Vec<f64> = samples[1]
                .iter()
                .zip(&samples[0])
                .map(|(g, p)| g / p)
                .collect();
            let gbs = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
            let (p, g) = (min(&samples[0]), min(&samples[1]));
            table.row(vec![
                format!("{m} × {name}"),
                format!("{p:.3}"),
                format!("{g:.3}"),
                format!("{:.2}", median(&ratios)),
                format!("{:.1}", gbs(p)),
                format!("{:.1}", gbs(g)),
                format!("{diff:.1e}"),
            ]);
        }
    }
    Ok(Some(table))
}

/// The AVX-512 panel kernel against `gemm` on the op's task loop, one thread, paired rounds.
fn panel_table(panel: PanelKernel, lens: &[usize], rounds: usize, peak: f64) -> Table {
    let mut table = Table::new(&[
        "tokens × k × n",
        "panel ms",
        "gemm ms",
        "gemm / panel",
        "panel GFLOP/s",
        "panel % peak",
        "gemm % peak",
        "max |Δ|",
    ]);
    for &m in lens {
        for (k, n) in [(768usize, 768usize), (768, 3072), (3072, 768)] {
            let x = seeded_values(m * k, 1);
            let panels = seeded_values(n.div_ceil(PANEL) * k * PANEL, 2);
            let (mut y1, mut y2) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for r in 0..rounds + 1 {
                let order = if r % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                };
                for panel_kernel in order {
                    let y = if panel_kernel { &mut y1 } else { &mut y2 };
                    let t = Instant::now();
                    run(panel_kernel.then_some(panel), &x, &panels, y, m, k);
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    if r > 0 {
                        if panel_kernel {
                            a.push(ms)
                        } else {
                            b.push(ms)
                        }
                    }
                }
            }
            let diff = y1
                .iter()
                .zip(&y2)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f32::max);
            let (pa, pb) = (median(&a), median(&b));
            let gflop = 2.0 * (m * k * n) as f64 / 1e9;
            table.row(vec![
                format!("{m} × {k} × {n}"),
                format!("{pa:.3}"),
                format!("{pb:.3}"),
                format!("{:.2}", pb / pa),
                format!("{:.1}", gflop / (pa * 1e-3)),
                format!("{:.0}", 100.0 * gflop / (pa * 1e-3) / peak),
                format!("{:.0}", 100.0 * gflop / (pb * 1e-3) / peak),
                format!("{diff:.1e}"),
            ]);
        }
    }
    table
}

/// The op's time per call with a hot and a cold weight, `threads` threads.
fn op_table(lens: &[usize], rounds: usize, threads: usize, peak: f64) -> Result<Table> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let kernels = KernelSet::resolve()?;
    let mut table = Table::new(&[
        "op: tokens × k × n",
        "hot ms",
        "cold ms",
        "cold / hot",
        "hot % peak",
        "cold % peak",
    ]);
    for &m in lens {
        for (k, n) in [(768usize, 768usize), (768, 3072), (3072, 768)] {
            // Enough distinct weights that a cycle through them does not fit the caches.
            let count = (120_000_000 / (k * n * 4)).max(2);
            let weights: Vec<PackedWeight> = (0..count)
                .map(|i| PackedWeight::new(&seeded_values(k * n, 10 + i as u32), k, n))
                .collect();
            let (x, bias) = (seeded_values(m * k, 1), seeded_values(n, 2));
            let mut y = vec![0.0f32; m * n];
            let (mut hot, mut cold) = (Vec::new(), Vec::new());
            let mut next = 0;
            pool.install(|| {
                for r in 0..rounds + 1 {
                    for is_cold in [r % 2 == 0, r % 2 != 0] {
                        // Calls per sample: enough to pass through every cold weight once.
                        let calls = count.max(10);
                        let t = Instant::now();
                        for _ in 0..calls {
                            let w = if is_cold {
                                next = (next + 1) % count;
                                &weights[next]
                            } else {
                                &weights[0]
                            };
                            let product = Product {
                                w,
                                alpha: 1.0,
                                bias: Some(&bias),
                                activation: None,
                            };
                            let (kernel, policy) = (kernels.projection(), kernels.threads());
                            project(kernel, policy, &x, &product, &mut y, m);
                        }
                        let ms = t.elapsed().as_secs_f64() * 1e3 / calls as f64;
                        if r > 0 {
                            if is_cold { &mut cold } else { &mut hot }.push(ms);
                        }
                    }
                }
            });
            let (h, c) = (median(&hot), median(&cold));
            let gflop = 2.0 * (m * k * n) as f64 / 1e9;
            let share = |ms: f64| 100.0 * gflop / (ms * 1e-3) / (peak * threads as f64);
            table.row(vec![
                format!("{m} × {k} × {n}"),
                format!("{h:.3}"),
                format!("{c:.3}"),
                format!("{:.2}", c / h),
                format!("{:.0}", share(h)),
                format!("{:.0}", share(c)),
            ]);
        }
    }
    Ok(table)
}
