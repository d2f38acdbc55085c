//! The integer projection of dynamically quantized models (`attnrt_kernels::quant`: the
//! activations quantized per tensor, then the exact i16-pair product with the float epilogue,
//! as `AttnrtQuantProjection` runs them) against the float32 projection op
//! (`attnrt_kernels::projection::project`) on the same shapes, on this process's kernel set and
//! a pool of `ATTNRT_BENCH_THREADS` threads (default 2): BERT-base / GPT-2 small projections,
//! tokens × k · W[k, n] for (k, n) ∈ {768×768, 768×3072, 3072×768}, bias added, weights hot.
//! Every SIMD build of the integer product this CPU runs is timed in the same rounds
//! (`avx2 vpmaddwd`, and where the CPU has them the VNNI builds, `vpdpbusd` on weights packed
//! in quads; each build packs the weight its own way), the session's build marked `*`. Rounds
//! rotate which runs first; medians, each build's multiply-accumulates per second, the AVX2
//! build's time over the session's, and each weight's packed bytes streamed per second (at one
//! token, a decode step, the weight is read once per call and its bytes are the cost: int8
//! weights are packed as i8, float32 ones as f32).
//!
//! ```sh
//! cargo bench -p attnrt-benches --bench quant_projection
//! ATTNRT_BENCH_ROUNDS=20 ATTNRT_BENCH_LENS=128 cargo bench -p attnrt-benches --bench quant_projection
//! ATTNRT_BENCH_ROUNDS=50 ATTNRT_BENCH_LENS=1 cargo bench -p attnrt-benches --bench quant_projection
//! ```

use std::time::Instant;

use anyhow::Result;
use attnrt_benches::{env_list, machine_note, median, Table};
use attnrt_kernels::projection::{project, PackedWeight, Product};
use attnrt_kernels::quant::{
    quant_matmul, QuantKernel, QuantOutput, QuantizedRows, QuantizedWeight,
};
use attnrt_kernels::KernelSet;
use attnrt_testkit::seeded_values;

fn main() -> Result<()> {
    let lens = env_list("ATTNRT_BENCH_LENS", &[128, 512])?;
    let rounds = env_list("ATTNRT_BENCH_ROUNDS", &[10])?[0];
    let threads = env_list("ATTNRT_BENCH_THREADS", &[2])?[0];
    println!("{}", machine_note());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let kernels = KernelSet::resolve()?;
    let session = *kernels.quant();
    let builds: Vec<QuantKernel> = QuantKernel::every_build()
        .into_iter()
        .filter(|b| b.is_simd() || *b == session)
        .collect();
    let avx2 = builds.iter().position(|b| b.is_simd() && !b.is_vnni());
    let at = builds
        .iter()
        .position(|b| *b == session)
        .expect("the session's build");
    println!(
        "{threads} threads, {rounds} rotated rounds; int8 builds {}; float32 on {}",
        builds
            .iter()
            .enumerate()
            .map(|(i, b)| format!("[{i}] {b}{}", if i == at { " *" } else { "" }))
            .collect::<Vec<_>>()
            .join(", "),
        kernels.projection()
    );
    let mut header = vec!["tokens × k × n".to_string(), "f32 ms".to_string()];
    for i in 0..builds.len() {
        header.push(format!("[{i}] ms"));
        header.push(format!("[{i}] GMAC/s"));
    }
    header.extend(["avx2 / *", "f32 / *", "* weight GB/s", "f32 weight GB/s"].map(String::from));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = Table::new(&header);
    for &m in &lens {
        for (k, n) in [(768usize, 768usize), (768, 3072), (3072, 768)] {
            let x = seeded_values(m * k, 1);
            let bias = seeded_values(n, 2);
            let w = seeded_values(k * n, 3);
            let w_i8: Vec<i8> = w.iter().map(|v| (v * 127.0) as i8).collect();
            let packed: Vec<QuantizedWeight> = builds
                .iter()
                .map(|b| QuantizedWeight::from_i8(b, &w_i8, k, n, &[0]))
                .collect();
            let float_w = PackedWeight::new(&w, k, n);
            let w_scale = vec![0.01f32; n];
            let mut y = vec![0.0f32; m * n];
            // Contestant 0 is float32, 1.. the int8 builds.
            let mut times = vec![Vec::new(); builds.len() + 1];
            pool.install(|| {
                for r in 0..rounds + 1 {
                    for i in 0..times.len() {
                        let c = (i + r) % times.len();
                        let t = Instant::now();
                        if c == 0 {
                            let product = Product {
                                w: &float_w,
                                alpha: 1.0,
                                bias: Some(&bias),
                                activation: None,
                            };
                            let (p, policy) = (kernels.projection(), kernels.threads());
                            project(p, policy, &x, &product, &mut y, m);
                        } else {
                            let (q, policy) = (&builds[c - 1], kernels.threads());
                            let rows = QuantizedRows::quantize_dynamic(q, policy, &x, m, k);
                            let scale: Vec<f32> =
                                w_scale.iter().map(|s| s * rows.scale()).collect();
                            let out = QuantOutput::Float {
                                y: &mut y,
                                scale: &scale,
                                requantize: None,
                                bias: Some(&bias),
                                activation: None,
                            };
                            quant_matmul(q, policy, &rows, &packed[c - 1], out);
                        }
                        if r > 0 {
                            times[c].push(t.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                }
            });
            let ms: Vec<f64> = times.iter().map(|t| median(t)).collect();
            let (float, int8) = (ms[0], ms[at + 1]);
            let mut row = vec![format!("{m} × {k} × {n}"), format!("{float:.3}")];
            for &t in &ms[1..] {
                row.push(format!("{t:.3}"));
                row.push(format!("{:.1}", (m * k * n) as f64 / 1e9 / (t * 1e-3)));
            }
            row.push(avx2.map_or("-".into(), |i| format!("{:.2}", ms[i + 1] / int8)));
            row.push(format!("{:.2}", float / int8));
            let bytes = packed[at].bytes() as f64;
            row.push(format!("{:.1}", bytes / 1e9 / (int8 * 1e-3)));
            row.push(format!("{:.1}", (k * n * 4) as f64 / 1e9 / (float * 1e-3)));
            table.row(row);
        }
    }
    println!("{}", table.render());
    Ok(())
}
