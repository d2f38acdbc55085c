//! Peak heap of one run, fused vs unfused, measured with a counting global allocator.
//!
//! For each L (default 2048, 4096, 8192), with 2 threads:
//!
//! * `MHA layer, fused` / `unfused`: the single MHA layer (d_model 768, 12 heads, B=1) of the
//!   `mha_layer` bench through `attnrt_runtime::Session`: the heap growth during `run` (peak live
//!   bytes during the run minus live bytes before it: intermediates, scratch and outputs; the
//!   weights and inputs already exist). The largest of two runs is reported.
//! * `Attention op only`: a model of just the fused `Attention` node on 3-D Q/K/V, same
//!   measurement: what the op costs on top of the kernel (input conversion, output tensor).
//! * `kernel scratch`: `attnrt_kernels::attention` called directly into a preallocated output:
//!   the heap growth is the kernel's own scratch (plus rayon's bookkeeping).
//!
//! The `L² scores` column is `12·L²·4` bytes, one f32 score matrix, for scale.
//!
//! Run: `cargo run --release -p attnrt-benches --bin peak_mem` (options: `--lens 2048,4096`,
//! `--threads 2`, `--skip-unfused-above 4096` to spare the machine the unfused path's GBs).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use attnrt_benches::alloc::{self, CountingAlloc};
use attnrt_benches::graphs::{attention_op_model, mha_layer_model, seeded_values};
use attnrt_benches::{
    core_inputs, fuse_expecting, machine_note, random_input, session, CoreLayout, Table,
    ATTNRT_OPS, BERT_BASE_ATTENTION, TRACT_OPS,
};
use attnrt_kernels::{attention, scratch_bytes, AttentionParams, KernelSet, Mask, View4, ViewMut4};
use attnrt_runtime::{NamedTensor, Threads};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const MB: f64 = 1024.0 * 1024.0;

struct Options {
    lens: Vec<usize>,
    threads: usize,
    skip_unfused_above: Option<usize>,
}

fn parse_args() -> Result<Options> {
    let mut o = Options {
        lens: vec![2048, 4096, 8192],
        threads: 2,
        skip_unfused_above: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--lens" => {
                let v = value("--lens")?;
                o.lens = v
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse()
                            .with_context(|| format!("--lens {v}: '{s}' is not a number"))
                    })
                    .collect::<Result<_>>()?;
            }
            "--threads" => {
                o.threads = value("--threads")?
                    .parse()
                    .context("--threads: not a number")?
            }
            "--skip-unfused-above" => {
                o.skip_unfused_above = Some(
                    value("--skip-unfused-above")?
                        .parse()
                        .context("--skip-unfused-above: not a number")?,
                )
            }
            "--bench" => {} // cargo passes it when run through `cargo bench`
            "-h" | "--help" => {
                println!("peak_mem [--lens 2048,4096,8192] [--threads 2] [--skip-unfused-above L]");
                std::process::exit(0);
            }
            other => bail!("unknown argument '{other}' (try --help)"),
        }
    }
    if o.lens.is_empty() || o.lens.contains(&0) {
        bail!("--lens needs positive lengths");
    }
    Ok(o)
}

/// Heap growth at the peak of one session run (largest of two runs) and the run time.
fn session_peak(
    model: &attnrt_onnx::ModelProto,
    inputs: &[NamedTensor],
    threads: &Threads,
    what: &str,
    attnrt_ops: bool,
) -> Result<(usize, f64)> {
    let s = session(model, inputs, threads, what, attnrt_ops)?;
    let mut worst = 0;
    let mut ms = f64::INFINITY;
    for _ in 0..2 {
        // The run takes its inputs by value (as a caller that is done with them would), so the
        // growth is the graph's own: `Session::run(&[..])` would add one copy of every input.
        let owned = inputs.to_vec();
        let t = Instant::now();
        let (out, grew) = alloc::measure(|| s.run_owned(owned));
        ms = ms.min(t.elapsed().as_secs_f64() * 1e3);
        drop(out.with_context(|| format!("{what}: run failed"))?);
        worst = worst.max(grew);
    }
    Ok((worst, ms))
}

/// Heap growth of one direct kernel call (output preallocated), largest of two calls, on a
/// fresh pool of `threads` threads: the kernel keeps its scratch in thread-locals across calls,
/// so on a pool that already ran attention the growth would read 0.
fn kernel_peak(len: usize, threads: usize) -> Result<usize> {
    let threads = Threads::new(Some(threads))?;
    let s = BERT_BASE_ATTENTION;
    let (h, d) = (s.heads, s.head_dim);
    let n = h * len * d;
    let data: Vec<Vec<f32>> = (0..3).map(|i| seeded_values(i, n, 1.0)).collect();
    let mut out = vec![0f32; n];
    let params = AttentionParams::new(AttentionParams::default_scale(d));
    let kernels = KernelSet::resolve()?;
    let mut worst = 0;
    for _ in 0..2 {
        let q = View4::from_bshd(&data[0], 1, len, h, d)?;
        let k = View4::from_bshd(&data[1], 1, len, h, d)?;
        let v = View4::from_bshd(&data[2], 1, len, h, d)?;
        let mut o = ViewMut4::from_bshd(&mut out, 1, len, h, d)?;
        let (r, grew) = alloc::measure(|| {
            threads.install(|| attention(&kernels, &q, &k, &v, &Mask::None, &params, &mut o))
        });
        r.context("kernel")?;
        worst = worst.max(grew);
    }
    Ok(worst)
}

fn main() -> Result<()> {
    let opts = parse_args()?;
    let shape = BERT_BASE_ATTENTION;
    let threads = Threads::new(Some(opts.threads))?;
    let unfused = mha_layer_model(shape, 42)?;
    let fused = fuse_expecting(&unfused, 1, "the MHA layer")?;
    let op_only = attention_op_model(shape, CoreLayout::ThreeD)?;
    let kernels = KernelSet::resolve()?;
    let isa = kernels.isa();
    println!(
        "peak heap of one run, MHA layer d_model 768 / 12 heads / B=1, threads {} (tract + kernel pool); kernel ISA {isa}, declared scratch per task {} KB; {}",
        threads.count(),
        scratch_bytes(kernels.flash(), shape.head_dim, shape.head_dim) / 1024,
        machine_note()
    );
    let mut table = Table::new(&[
        "L",
        "MHA fused MB",
        "MHA unfused MB",
        "unfused/fused",
        "Attention op only MB",
        "kernel scratch MB",
        "L² scores MB (1 matrix)",
        "fused run ms",
        "unfused run ms",
    ]);
    for &len in &opts.lens {
        let x = vec![random_input("x", &[1, len, shape.hidden()], 5)?];
        let (f, f_ms) = session_peak(&fused, &x, &threads, &format!("fused L={len}"), ATTNRT_OPS)?;
        let u = match opts.skip_unfused_above {
            Some(max) if len > max => None,
            _ => Some(session_peak(
                &unfused,
                &x,
                &threads,
                &format!("unfused L={len}"),
                TRACT_OPS,
            )?),
        };
        let qkv = core_inputs(shape, CoreLayout::ThreeD, len, 1)?;
        let (op, _) = session_peak(
            &op_only,
            &qkv,
            &threads,
            &format!("Attention op L={len}"),
            ATTNRT_OPS,
        )?;
        drop(qkv);
        let k = kernel_peak(len, threads.count())?;
        let scores = (shape.heads * len * len * 4) as f64 / MB;
        let row = vec![
            len.to_string(),
            format!("{:.1}", f as f64 / MB),
            u.map_or("skipped".into(), |(u, _)| format!("{:.1}", u as f64 / MB)),
            u.map_or("–".into(), |(u, _)| {
                format!("{:.1}", u as f64 / f.max(1) as f64)
            }),
            format!("{:.1}", op as f64 / MB),
            format!("{:.2}", k as f64 / MB),
            format!("{scores:.0}"),
            format!("{f_ms:.0}"),
            u.map_or("–".into(), |(_, ms)| format!("{ms:.0}")),
        ];
        eprintln!("L={len}: {}", row.join(" | "));
        table.row(row);
    }
    println!("\n{}\n{}", table.render(), machine_note());
    Ok(())
}
