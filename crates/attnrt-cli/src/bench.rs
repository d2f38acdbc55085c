//! `attnrt bench`: fused vs unfused timing.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use attnrt::harness::{time_paired, time_paired_profiled, PairedTiming};
use attnrt::{FusionOptions, Profile, Session, SessionOptions, ShapePolicy};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::common::{
    dims_line, load, threads, HalfArgs, InputArgs, LimitArgs, MatmulArgs, MemoryArgs,
};
use crate::profile::ProfileArgs;

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
    #[command(flatten)]
    pub half: HalfArgs,
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
    pub profile: ProfileArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
}

/// The two sessions timed and what the report says about them.
struct Bench {
    name: String,
    blocks: usize,
    fused: Session,
    unfused: Session,
    prepared: attnrt::harness::PreparedInputs,
    threads: attnrt::Threads,
    /// What `--half-as-float` did, for the text report and for `--json`.
    half: (Option<String>, serde_json::Value),
}

/// Runs the command.
pub fn bench(args: BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let b = sessions(&args)?;
    let (timing, profiles) = time(&args, &b)?;
    if args.json {
        let v = json_report(&args, &b, &timing, profiles.as_ref());
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_text(&args, &b, &timing, profiles.as_ref());
    }
    Ok(())
}

/// Loads and fuses the model and builds a session for each path.
fn sessions(args: &BenchArgs) -> Result<Bench> {
    let limits = args.limits.limits();
    let loaded = load(&args.model, &limits)?;
    let name = args.model.display().to_string();
    let budget = args.memory.budget();
    let prepared = args.input.prepare(&loaded, &limits, &budget)?;
    let threads = threads(args.threads)?;
    let fused = attnrt::fuse_with(
        &loaded.model,
        &FusionOptions {
            strict: args.strict,
            gelu: !args.no_gelu,
        },
    )
    .with_context(|| format!("{name}: fusion failed"))?;
    let options = SessionOptions {
        attnrt_ops: args.matmul.attnrt_ops(),
        half_as_float: args.half.on(),
        shapes: ShapePolicy::PerShape,
        max_memory: budget,
        ..SessionOptions::default()
    };
    let session = |model, what: &str| {
        Session::build_with_options(model, &prepared.tensors, &threads, what, &options)
    };
    let fused_session = session(&fused.model, &format!("fused {name}"))?;
    let unfused_session = session(&loaded.model, &name)?;
    Ok(Bench {
        blocks: fused.report.blocks.len(),
        name,
        fused: fused_session,
        unfused: unfused_session,
        prepared,
        threads,
        half: (
            args.half.report_line(&loaded.model),
            args.half.report_json(&loaded.model),
        ),
    })
}

/// Times the two paths in alternating rounds behind a progress bar, profiling the timed runs
/// with `--profile`.
fn time(args: &BenchArgs, b: &Bench) -> Result<(PairedTiming, Option<[Profile; 2]>)> {
    let total = 2 * (args.warmup + args.reps) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} runs ({elapsed})")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("timing");
    let inputs = &b.prepared.tensors;
    let timed = if args.profile.profile {
        let (t, p) =
            time_paired_profiled(&b.fused, &b.unfused, inputs, args.warmup, args.reps, || {
                bar.inc(1)
            })?;
        (t, Some(p))
    } else {
        let t = time_paired(&b.fused, &b.unfused, inputs, args.warmup, args.reps, || {
            bar.inc(1)
        })?;
        (t, None)
    };
    bar.finish_and_clear();
    Ok(timed)
}

fn json_report(
    args: &BenchArgs,
    b: &Bench,
    timing: &PairedTiming,
    profiles: Option<&[Profile; 2]>,
) -> serde_json::Value {
    let [ratio_q1, speedup, ratio_q3] = timing.ratio_b_over_a;
    json!({
        "model": b.name,
        "threads": b.threads.count(),
        "matmul": args.matmul.name(),
        "dims": b.prepared.dims,
        "blocks_fused": b.blocks,
        "half_as_float": b.half.1,
        "warmup": args.warmup,
        "reps": args.reps,
        "build": crate::common::build_kind(),
        "fused": timing.a,
        "unfused": timing.b,
        "speedup": speedup,
        "speedup_quartiles": [ratio_q1, speedup, ratio_q3],
        "ops": {
            "fused": crate::common::ops_json(&b.fused.op_counts()),
            "unfused": crate::common::ops_json(&b.unfused.op_counts()),
            "kernel_isa": attnrt::kernel_isa(),
        },
        "profile": profiles.map(|[f, u]| json!({
            "fused": args.profile.json(Some(f)),
            "unfused": args.profile.json(Some(u)),
        })),
    })
}

fn print_text(args: &BenchArgs, b: &Bench, timing: &PairedTiming, profiles: Option<&[Profile; 2]>) {
    println!("model: {}", b.name);
    println!("dims: {}", dims_line(&b.prepared));
    for note in &b.prepared.notes {
        println!("note: {note}");
    }
    println!("threads: {}", b.threads.count());
    println!("matmul: {}", args.matmul.name());
    if b.blocks == 0 {
        println!("fusion: found no attention block; both paths run the same graph");
    } else {
        println!("fusion: {} attention block(s) fused", b.blocks);
    }
    if let Some(half) = &b.half.0 {
        println!("half precision: {half}");
    }
    println!("ops (fused): {}", b.fused.op_counts());
    println!("ops (unfused): {}", b.unfused.op_counts());
    for (label, t) in [("fused", &timing.a), ("unfused", &timing.b)] {
        println!(
            "{label:>8}: median {:.3} ms  (min {:.3}, max {:.3}, mad {:.3}; {} rounds after {} warm-up)",
            t.median_ms, t.min_ms, t.max_ms, t.mad_ms, t.reps, args.warmup
        );
    }
    let [ratio_q1, speedup, ratio_q3] = timing.ratio_b_over_a;
    println!(
        "speedup (median of per-round unfused/fused): {speedup:.2}x (quartiles {ratio_q1:.2}-{ratio_q3:.2})"
    );
    if let Some([f, u]) = profiles {
        args.profile.print("fused", f);
        args.profile.print("unfused", u);
    }
    if let Some(note) = crate::common::debug_build_note() {
        println!("{note}");
    }
}
