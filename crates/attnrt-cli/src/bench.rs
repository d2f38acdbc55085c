//! `attnrt bench`: fused vs unfused timing.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use attnrt::harness::time_paired;
use attnrt_fusion::FusionOptions;
use attnrt_runtime::Session;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::common::{dims_line, load, threads, InputArgs, LimitArgs, MatmulArgs};

/// Arguments of `attnrt bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// Untimed runs before timing, per path.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub warmup: usize,
    /// Timed rounds; each round runs the fused and the unfused model once, in alternating order,
    /// so that the speedup is the median of ratios measured seconds apart.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub reps: usize,
    /// Threads for tract's matmuls and attnrt's kernel (default: all cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub matmul: MatmulArgs,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Fuse only blocks whose fused form is exact on every input (no caveats).
    #[arg(long)]
    pub strict: bool,
    /// Leave GELU activations as they are (by default their exported forms become one `Gelu`).
    #[arg(long)]
    pub no_gelu: bool,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Runs the command.
pub fn bench(args: BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let limits = args.limits.limits();
    let loaded = load(&args.model, &limits)?;
    let name = args.model.display().to_string();
    let prepared = args.input.prepare(&loaded, &limits)?;
    let threads = threads(args.threads)?;
    let fused = attnrt_fusion::fuse(
        &loaded.model,
        &FusionOptions {
            strict: args.strict,
            gelu: !args.no_gelu,
        },
    )
    .with_context(|| format!("{name}: fusion failed"))?;
    let blocks = fused.report.blocks.len();

    let backend = args.matmul.backend();
    let fused_session = Session::build_with(
        &fused.model,
        &prepared.tensors,
        &threads,
        &format!("fused {name}"),
        backend,
    )?;
    let unfused_session =
        Session::build_with(&loaded.model, &prepared.tensors, &threads, &name, backend)?;

    let total = 2 * (args.warmup + args.reps) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} runs ({elapsed})")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("timing");
    let timing = time_paired(
        &fused_session,
        &unfused_session,
        &prepared.tensors,
        args.warmup,
        args.reps,
        || bar.inc(1),
    )?;
    bar.finish_and_clear();

    let (fused_t, unfused_t) = (&timing.a, &timing.b);
    let [ratio_q1, speedup, ratio_q3] = timing.ratio_b_over_a;
    if args.json {
        let v = json!({
            "model": name,
            "threads": threads.count(),
            "matmul": args.matmul.name(),
            "dims": prepared.dims,
            "blocks_fused": blocks,
            "warmup": args.warmup,
            "reps": args.reps,
            "build": crate::common::build_kind(),
            "fused": fused_t,
            "unfused": unfused_t,
            "speedup": speedup,
            "speedup_quartiles": [ratio_q1, speedup, ratio_q3],
            "ops": {
                "fused": crate::common::ops_json(&fused_session.op_counts()),
                "unfused": crate::common::ops_json(&unfused_session.op_counts()),
                "kernel_isa": attnrt_runtime::kernel_isa(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("model: {name}");
    println!("dims: {}", dims_line(&prepared));
    println!("threads: {}", threads.count());
    println!("matmul: {}", args.matmul.name());
    if blocks == 0 {
        println!("fusion: found no attention block; both paths run the same graph");
    } else {
        println!("fusion: {blocks} attention block(s) fused");
    }
    println!("ops (fused): {}", fused_session.op_counts());
    println!("ops (unfused): {}", unfused_session.op_counts());
    for (label, t) in [("fused", fused_t), ("unfused", unfused_t)] {
        println!(
            "{label:>8}: median {:.3} ms  (min {:.3}, max {:.3}, mad {:.3}; {} rounds after {} warm-up)",
            t.median_ms, t.min_ms, t.max_ms, t.mad_ms, t.reps, args.warmup
        );
    }
    println!(
        "speedup (median of per-round unfused/fused): {speedup:.2}x (quartiles {ratio_q1:.2}-{ratio_q3:.2})"
    );
    if let Some(note) = crate::common::debug_build_note() {
        println!("{note}");
    }
    Ok(())
}
