//! The integer projection of dynamically quantized models (`attnrt_kernels::quant`: the
//! activations quantized per tensor, then the exact i16-pair product with the float epilogue,
//! as `AttnrtQuantProjection` runs them) against the float32 projection op
//! (`attnrt_kernels::projection::project`) on the same shapes, on this process's kernel set and
//! a pool of `ATTNRT_BENCH_THREADS` threads (default 2): BERT-base / GPT-2 small projections,
//! tokens × k · W[k, n] for (k, n) ∈ {768×768, 768×3072, 3072×768}, bias added, weights hot.
//! Rounds alternate which runs first; medians, the int8 run's multiply-accumulates per second,
//! and each weight's packed bytes streamed per second (at one token, a decode step, the weight
//! is read once per call and its bytes are the cost: int8 weights are packed as i8, float32 ones
//! as f32).
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
use attnrt_kernels::quant::{quant_matmul, QuantOutput, QuantizedRows, QuantizedWeight};
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
    println!(
        "{threads} threads, {rounds} paired rounds; int8 on {}, float32 on {}",
        kernels.quant(),
        kernels.projection()
    );
    let mut table = Table::new(&[
        "tokens × k × n",
        "int8 ms",
        "f32 ms",
        "f32 / int8",
        "int8 GMAC/s",
        "int8 weight GB/s",
        "f32 weight GB/s",
    ]);
    for &m in &lens {
        for (k, n) in [(768usize, 768usize), (768, 3072), (3072, 768)] {
            let x = seeded_values(m * k, 1);
            let bias = seeded_values(n, 2);
            let w = seeded_values(k * n, 3);
            let w_i8: Vec<i8> = w.iter().map(|v| (v * 127.0) as i8).collect();
            let quant_w = QuantizedWeight::from_i8(&w_i8, k, n, &[0]);
            let float_w = PackedWeight::new(&w, k, n);
            let w_scale = vec![0.01f32; n];
            let mut y = vec![0.0f32; m * n];
            let (mut int8, mut float) = (Vec::new(), Vec::new());
            pool.install(|| {
                for r in 0..rounds + 1 {
                    for quantized in [r % 2 == 0, r % 2 != 0] {
                        let t = Instant::now();
                        if quantized {
                            let (q, policy) = (kernels.quant(), kernels.threads());
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
                            quant_matmul(q, policy, &rows, &quant_w, out);
                        } else {
                            let product = Product {
                                w: &float_w,
                                alpha: 1.0,
                                bias: Some(&bias),
                                activation: None,
                            };
                            project(
                                kernels.projection(),
                                kernels.threads(),
                                &x,
                                &product,
                                &mut y,
                                m,
                            );
                        }
                        let ms = t.elapsed().as_secs_f64() * 1e3;
                        if r > 0 {
                            if quantized { &mut int8 } else { &mut float }.push(ms);
                        }
                    }
                }
            });
            let (a, b) = (median(&int8), median(&float));
            table.row(vec![
                format!("{m} × {k} × {n}"),
                format!("{a:.3}"),
                format!("{b:.3}"),
                format!("{:.2}", b / a),
                format!("{:.1}", (m * k * n) as f64 / 1e9 / (a * 1e-3)),
                format!("{:.1}", quant_w.bytes() as f64 / 1e9 / (a * 1e-3)),
                format!("{:.1}", (k * n * 4) as f64 / 1e9 / (b * 1e-3)),
            ]);
        }
    }
    println!("{}", table.render());
    Ok(())
}
