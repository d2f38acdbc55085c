//! `attnrt run`: fuse in memory, run fused and unfused, diff, report.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use attnrt::harness::{
    compare, read_npz_tensors, summarize, write_npz, CompareOptions, Comparison, OutputDiff,
    PathRun, PreparedInputs, Tolerance, ToleranceChoice,
};
use attnrt::runtime::quant_pins::PinReport;
use attnrt::{dtype_name, Threads};
use clap::Args;
use serde_json::json;

use crate::common::{
    dims_line, load, threads, HalfArgs, InputArgs, LimitArgs, MatmulArgs, MemoryArgs,
};
use crate::profile::ProfileArgs;

/// Arguments of `attnrt run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The ONNX model.
    pub model: PathBuf,
    #[command(flatten)]
    pub input: InputArgs,
    /// Threads for tract's matmuls and attnrt's kernel (default: all cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub matmul: MatmulArgs,
    #[command(flatten)]
    pub half: HalfArgs,
    /// Write the outputs (of the fused path, or the only path run) to this .npz.
    #[arg(long, value_name = "FILE.npz")]
    pub output: Option<PathBuf>,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Do not fuse: run the original graph only.
    #[arg(long, conflicts_with = "no_diff")]
    pub no_fuse: bool,
    /// Run the fused model only (no unfused reference, no diff).
    #[arg(long)]
    pub no_diff: bool,
    /// Absolute tolerance of the diffs (default: by output dtype, float32 1e-4, float16 2e-3,
    /// bfloat16 1.6e-2, float64 1e-6, integers exact).
    #[arg(long, value_name = "A")]
    pub atol: Option<f64>,
    /// Relative tolerance of the diffs: |a − b| ≤ atol + rtol·|b| elementwise (default: by
    /// output dtype, as --atol). A dynamically quantized model (int8 projections) whose paths
    /// differ beyond it is compared with its int8 steps pinned: the fused path runs again with
    /// the unfused run's activation quantizations, taken by each projection whose input is
    /// within this tolerance of the unfused one (else it diverges: exit 3), and those outputs
    /// must be within it (README, "Exit codes"; `quantization pinned:` in the report).
    #[arg(long, value_name = "R")]
    pub rtol: Option<f64>,
    /// Fuse only blocks whose fused form is exact on every input (no caveats).
    #[arg(long)]
    pub strict: bool,
    /// Leave GELU activations as they are (by default their exported forms become one `Gelu`).
    #[arg(long)]
    pub no_gelu: bool,
    /// Also diff the outputs against saved reference outputs (e.g. models/*.outputs.npz).
    #[arg(long, value_name = "FILE.npz")]
    pub expect: Option<PathBuf>,
    #[command(flatten)]
    pub profile: ProfileArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
}

/// What `attnrt run`'s times are: one first (cold) run of each path, which a small model's
/// one-off costs (thread wake-up, first-touch allocations) dominate.
const COLD_RUN_NOTE: &str =
    "times are one cold run of each path; `attnrt bench` times warm runs, alternating the paths";

fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Runs the command; the exit code is 3 when a diff exceeds the tolerance.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let tolerance = ToleranceChoice::from_flags(args.atol, args.rtol)?;
    if let Some(out) = &args.output {
        if same_file(out, &args.model) {
            bail!(
                "--output {} is the model itself; refusing to overwrite it",
                out.display()
            );
        }
    }
    let limits = args.limits.limits();
    let loaded = load(&args.model, &limits)?;
    let model_name = args.model.display().to_string();
    let budget = args.memory.budget();
    let prepared = args.input.prepare(&loaded, &limits, &budget)?;
    let expected = match &args.expect {
        Some(p) => Some(read_npz_tensors(p, limits.max_tensor_elements)?),
        None => None,
    };
    let threads = threads(args.threads)?;
    let options = CompareOptions {
        no_fuse: args.no_fuse,
        no_diff: args.no_diff,
        strict: args.strict,
        no_gelu: args.no_gelu,
        tolerance,
        expect_tolerance: None,
        attnrt_ops: args.matmul.attnrt_ops(),
        half_as_float: args.half.on(),
        profile: args.profile.profile,
        budget,
    };
    let cmp = compare(
        &loaded.model,
        &model_name,
        &prepared.tensors,
        expected.as_deref(),
        &threads,
        &options,
    )?;
    let mut write_notes = Vec::new();
    if let Some(out) = &args.output {
        write_notes = write_npz(out, &cmp.primary().outputs)?;
    }
    if args.json {
        let mut v = json_report(&args, &cmp, &prepared, &threads, &write_notes);
        v["half_as_float"] = args.half.report_json(&loaded.model);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let half = args.half.report_line(&loaded.model);
        print_text(
            &args,
            &cmp,
            &prepared,
            &threads,
            &write_notes,
            half.as_deref(),
        );
    }
    let bad = cmp.failures();
    if bad.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "error: outputs differ beyond {}: {}",
        tolerance_phrase(&cmp),
        bad.join(", ").replace(" vs expected", " vs --expect")
    );
    Ok(ExitCode::from(crate::EXIT_DIFF))
}

/// What pinning the unfused run's activation quantizations did (`Comparison::pinned`).
fn pins_line(p: &PinReport) -> String {
    let mut line = format!(
        "quantization pinned (a rounding difference flipped int8 steps): {} of {} quantized \
         projection(s) took the unfused run's quantization, their inputs within {:.3e} of it \
         ({} value(s) a step apart, {} range(s) moved)",
        p.pinned, p.projections, p.input_max_abs, p.steps_flipped, p.ranges_moved
    );
    for why in &p.diverged {
        line.push_str(&format!("\n  diverged: {why}"));
    }
    line
}

/// The tolerances the diffs used, e.g. `atol=0.0001 rtol=0.0001` or, for per-dtype defaults,
/// `the float16 defaults (atol=0.002 rtol=0.002)`.
fn tolerance_phrase(cmp: &Comparison) -> String {
    let show = |t: Tolerance| format!("atol={} rtol={}", t.atol, t.rtol);
    match cmp.tolerance {
        ToleranceChoice::Fixed(t) => show(t),
        ToleranceChoice::ByDtype => {
            let mut seen: Vec<(String, Tolerance)> = Vec::new();
            for d in all_diffs(cmp) {
                if !seen.iter().any(|(n, _)| *n == d.reference_dtype) {
                    seen.push((d.reference_dtype.clone(), d.tolerance));
                }
            }
            let parts: Vec<String> = seen
                .iter()
                .map(|(n, t)| format!("{n} {}", show(*t)))
                .collect();
            format!("the defaults for {}", parts.join("; "))
        }
    }
}

fn all_diffs(cmp: &Comparison) -> impl Iterator<Item = &OutputDiff> {
    cmp.diffs
        .iter()
        .flatten()
        .chain(cmp.expect.iter().flat_map(|m| m.values().flatten()))
}

/// The tolerance shown as `"tolerance"` in `--json` (an `{atol, rtol}` object, as before
/// per-dtype defaults existed): the fixed one, or that of the first compared output.
fn headline_tolerance(cmp: &Comparison) -> Tolerance {
    match cmp.tolerance {
        ToleranceChoice::Fixed(t) => t,
        ToleranceChoice::ByDtype => all_diffs(cmp)
            .next()
            .map_or(Tolerance::default(), |d| d.tolerance),
    }
}

fn json_report(
    args: &RunArgs,
    cmp: &Comparison,
    prepared: &PreparedInputs,
    threads: &Threads,
    write_notes: &[String],
) -> serde_json::Value {
    let outputs: Vec<_> = cmp
        .primary()
        .outputs
        .iter()
        .map(|o| {
            let d = cmp
                .diffs
                .as_ref()
                .and_then(|ds| ds.iter().find(|d| d.name == o.name));
            let pinned = cmp.pinned.iter().flat_map(|p| &p.diffs);
            json!({
                "name": o.name,
                "shape": o.tensor.shape(),
                "dtype": dtype_name(o.tensor.datum_type()),
                "summary": summarize(&o.tensor),
                "diff_vs_unfused": d,
                "diff_vs_unfused_pinned": pinned.into_iter().find(|d| d.name == o.name),
            })
        })
        .collect();
    let run_ms = |r: &Option<PathRun>| r.as_ref().map(|r| r.run_ms);
    let build_ms = |r: &Option<PathRun>| r.as_ref().map(|r| r.build_ms);
    json!({
        "model": cmp.model,
        "threads": threads.count(),
        "dims": prepared.dims,
        "input_notes": prepared.notes,
        "inputs": prepared.sources.iter().zip(&prepared.tensors).map(|((n, how), t)| json!({
            "name": n, "shape": t.tensor.shape(), "dtype": dtype_name(t.tensor.datum_type()), "source": how,
        })).collect::<Vec<_>>(),
        "fusion": cmp.fusion,
        "fusion_note": cmp.fusion_note(),
        "ran": {"fused": cmp.fused.is_some(), "unfused": cmp.unfused.is_some()},
        "ops": {
            "fused": cmp.fused.as_ref().map(|r| crate::common::ops_json(&r.ops)),
            "unfused": cmp.unfused.as_ref().map(|r| crate::common::ops_json(&r.ops)),
            "kernel_isa": attnrt::kernel_isa(),
        },
        "time_ms": {
            "fused": run_ms(&cmp.fused),
            "unfused": run_ms(&cmp.unfused),
            "fused_build": build_ms(&cmp.fused),
            "unfused_build": build_ms(&cmp.unfused),
        },
        "build": crate::common::build_kind(),
        "time_note": COLD_RUN_NOTE,
        "profile": args.profile.profile.then(|| json!({
            "fused": args.profile.json(cmp.fused.as_ref().and_then(|r| r.profile.as_ref())),
            "unfused": args.profile.json(cmp.unfused.as_ref().and_then(|r| r.profile.as_ref())),
        })),
        "tolerance": headline_tolerance(cmp),
        "tolerance_source": match cmp.tolerance {
            ToleranceChoice::Fixed(_) => "flags",
            ToleranceChoice::ByDtype => "dtype defaults",
        },
        "outputs": outputs,
        "quantization_pins": cmp.pinned.as_ref().map(|p| &p.pins),
        "expect": cmp.expect,
        "output_file": args.output.as_ref().map(|p| p.display().to_string()),
        "notes": write_notes,
        "ok": cmp.ok(),
    })
}

fn fmt_err(d: &OutputDiff) -> String {
    match &d.problem {
        Some(p) => format!("FAIL: {p}"),
        None => format!(
            "max_abs={:.3e} max_rel={:.3e}{}{}",
            d.max_abs,
            d.max_rel,
            if d.nan_mismatches > 0 {
                format!(" nan_mismatches={}", d.nan_mismatches)
            } else {
                String::new()
            },
            if d.ok {
                String::new()
            } else {
                format!(" FAIL ({} elements out of tolerance)", d.mismatches)
            }
        ),
    }
}

fn print_text(
    args: &RunArgs,
    cmp: &Comparison,
    prepared: &PreparedInputs,
    threads: &Threads,
    write_notes: &[String],
    half: Option<&str>,
) {
    println!("model: {}", cmp.model);
    println!("dims: {}", dims_line(prepared));
    for ((name, how), t) in prepared.sources.iter().zip(&prepared.tensors) {
        println!(
            "input {name}: {} {:?} <- {how}",
            dtype_name(t.tensor.datum_type()),
            t.tensor.shape()
        );
    }
    for note in &prepared.notes {
        println!("note: {note}");
    }
    println!("fusion: {}", cmp.fusion_note());
    if let Some(r) = cmp.fusion.as_ref().filter(|r| !r.blocks.is_empty()) {
        for l in r.summary_lines() {
            println!("  {l}");
        }
    }
    if let Some(half) = half {
        println!("half precision: {half}");
    }
    println!("threads: {}", threads.count());
    for (what, r) in [("fused", &cmp.fused), ("unfused", &cmp.unfused)] {
        if let Some(r) = r {
            println!("ops ({what}): {}", r.ops);
        }
    }
    print_outputs(args, cmp);
    let t = |r: &Option<PathRun>| {
        r.as_ref()
            .map(|r| format!("{:.3} ms (build {:.1} ms)", r.run_ms, r.build_ms))
    };
    match (t(&cmp.fused), t(&cmp.unfused)) {
        (Some(f), Some(u)) => println!("time: fused {f}, unfused {u}"),
        (Some(f), None) => println!("time: fused {f}"),
        (None, Some(u)) => println!("time: unfused {u}"),
        (None, None) => {}
    }
    println!("note: {COLD_RUN_NOTE}");
    for (what, r) in [("fused", &cmp.fused), ("unfused", &cmp.unfused)] {
        if let Some(p) = r.as_ref().and_then(|r| r.profile.as_ref()) {
            args.profile.print(what, p);
        }
    }
    if let Some(note) = crate::common::debug_build_note() {
        println!("{note}");
    }
    if all_diffs(cmp).next().is_some() {
        println!(
            "tolerance: |a-b| <= atol + rtol*|b| with {}",
            tolerance_phrase(cmp)
        );
    }
    if let Some(out) = &args.output {
        println!("wrote {}", out.display());
    }
    for n in write_notes {
        println!("note: {n}");
    }
}

/// One line per output of the path the user gets, with its diffs.
fn print_outputs(args: &RunArgs, cmp: &Comparison) {
    let path = if cmp.fused.is_some() {
        "fused"
    } else {
        "unfused"
    };
    for o in &cmp.primary().outputs {
        let s = summarize(&o.tensor)
            .map(|s| {
                let nan = if s.nan > 0 {
                    format!(" nan={}", s.nan)
                } else {
                    String::new()
                };
                format!("min={:.6} max={:.6} mean={:.6}{nan}", s.min, s.max, s.mean)
            })
            .unwrap_or_default();
        println!(
            "output {} ({path}): {} {:?} {s}",
            o.name,
            dtype_name(o.tensor.datum_type()),
            o.tensor.shape()
        );
        if let Some(d) = cmp.diffs.iter().flatten().find(|d| d.name == o.name) {
            println!("  fused vs unfused: {}", fmt_err(d));
        }
        let pinned = cmp.pinned.iter().flat_map(|p| &p.diffs);
        if let Some(d) = pinned.into_iter().find(|d| d.name == o.name) {
            println!("  fused vs unfused, quantization pinned: {}", fmt_err(d));
        }
    }
    if let Some(p) = &cmp.pinned {
        println!("{}", pins_line(&p.pins));
    }
    let expect_file = args
        .expect
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    for (p, ds) in cmp.expect.iter().flatten() {
        for d in ds {
            println!("  {p} vs {expect_file}: {}: {}", d.name, fmt_err(d));
        }
    }
}
