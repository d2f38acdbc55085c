//! `attnrt run`: fuse in memory, run fused and unfused, diff, report.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use attnrt_fusion::{FusionOptions, FusionReport};
use attnrt_runtime::{
    diff_outputs, dtype_name, read_npz_tensors, run_once, summarize, write_npz, OutputDiff,
    RunResult, Tolerance,
};
use clap::Args;
use serde_json::json;

use crate::common::{dims_line, load, threads, InputArgs, LimitArgs, MatmulArgs};

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
    /// Absolute tolerance of the diffs.
    #[arg(long, value_name = "A", default_value_t = Tolerance::default().atol)]
    pub atol: f64,
    /// Relative tolerance of the diffs: |a − b| ≤ atol + rtol·|b| elementwise.
    #[arg(long, value_name = "R", default_value_t = Tolerance::default().rtol)]
    pub rtol: f64,
    /// Fuse only blocks whose fused form is exact on every input (no caveats).
    #[arg(long)]
    pub strict: bool,
    /// Also diff the outputs against saved reference outputs (e.g. models/*.outputs.npz).
    #[arg(long, value_name = "FILE.npz")]
    pub expect: Option<PathBuf>,
    #[command(flatten)]
    pub limits: LimitArgs,
}

fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Runs the command; the exit code is 3 when a diff exceeds the tolerance.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let tol = Tolerance {
        atol: args.atol,
        rtol: args.rtol,
    };
    if !(tol.atol >= 0.0 && tol.rtol >= 0.0) {
        bail!("--atol and --rtol must be non-negative numbers");
    }
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
    let prepared = args.input.prepare(&loaded, &limits)?;
    let expected = match &args.expect {
        Some(p) => Some(read_npz_tensors(p, limits.max_tensor_elements)?),
        None => None,
    };
    let threads = threads(args.threads)?;

    let fused = if args.no_fuse {
        None
    } else {
        Some(
            attnrt_fusion::fuse(
                &loaded.model,
                &FusionOptions {
                    strict: args.strict,
                },
            )
            .with_context(|| format!("{model_name}: fusion failed"))?,
        )
    };
    let blocks = fused.as_ref().map_or(0, |f| f.report.blocks.len());
    let fused_run: Option<RunResult> = match &fused {
        Some(f) if blocks > 0 => Some(run_once(
            &f.model,
            &prepared.tensors,
            &threads,
            &format!("fused {model_name}"),
            args.matmul.backend(),
        )?),
        _ => None,
    };
    let unfused_run: Option<RunResult> = if fused_run.is_none() || !args.no_diff {
        Some(run_once(
            &loaded.model,
            &prepared.tensors,
            &threads,
            &model_name,
            args.matmul.backend(),
        )?)
    } else {
        None
    };
    let primary = fused_run
        .as_ref()
        .or(unfused_run.as_ref())
        .expect("one path ran");
    let diffs: Option<Vec<OutputDiff>> = match (&fused_run, &unfused_run) {
        (Some(f), Some(u)) => Some(diff_outputs(&f.outputs, &u.outputs, tol)),
        _ => None,
    };
    let expect_diffs: Vec<(&str, Vec<OutputDiff>)> = match &expected {
        Some(exp) => {
            let mut v = Vec::new();
            if let Some(f) = &fused_run {
                v.push(("fused", diff_outputs(&f.outputs, exp, tol)));
            }
            if let Some(u) = &unfused_run {
                v.push(("unfused", diff_outputs(&u.outputs, exp, tol)));
            }
            v
        }
        None => vec![],
    };
    let mut write_notes = Vec::new();
    if let Some(out) = &args.output {
        write_notes = write_npz(out, &primary.outputs)?;
    }

    let diff_ok = diffs.as_ref().is_none_or(|d| d.iter().all(|x| x.ok));
    let expect_ok = expect_diffs.iter().all(|(_, d)| d.iter().all(|x| x.ok));
    let ok = diff_ok && expect_ok;

    let fusion_note = match &fused {
        None => "not attempted (--no-fuse)".to_string(),
        Some(_) if blocks == 0 => {
            "found no attention block to fuse; ran the original graph".to_string()
        }
        Some(_) => format!("{blocks} attention block(s) fused"),
    };
    if args.json {
        let outputs: Vec<_> = primary
            .outputs
            .iter()
            .map(|o| {
                let d = diffs
                    .as_ref()
                    .and_then(|ds| ds.iter().find(|d| d.name == o.name));
                json!({
                    "name": o.name,
                    "shape": o.tensor.shape(),
                    "dtype": dtype_name(o.tensor.datum_type()),
                    "summary": summarize(&o.tensor),
                    "diff_vs_unfused": d,
                })
            })
            .collect();
        let expect: serde_json::Map<String, serde_json::Value> = expect_diffs
            .iter()
            .map(|(k, d)| (k.to_string(), json!(d)))
            .collect();
        let v = json!({
            "model": model_name,
            "threads": threads.count(),
            "dims": prepared.dims,
            "inputs": prepared.sources.iter().zip(&prepared.tensors).map(|((n, how), t)| json!({
                "name": n, "shape": t.tensor.shape(), "dtype": dtype_name(t.tensor.datum_type()), "source": how,
            })).collect::<Vec<_>>(),
            "fusion": fused.as_ref().map(|f| &f.report),
            "fusion_note": fusion_note,
            "ran": {"fused": fused_run.is_some(), "unfused": unfused_run.is_some()},
            "ops": {
                "fused": fused_run.as_ref().map(|r| crate::common::ops_json(&r.ops)),
                "unfused": unfused_run.as_ref().map(|r| crate::common::ops_json(&r.ops)),
                "kernel_isa": attnrt_runtime::kernel_isa(),
            },
            "time_ms": {
                "fused": fused_run.as_ref().map(|r| r.run_ms),
                "unfused": unfused_run.as_ref().map(|r| r.run_ms),
                "fused_build": fused_run.as_ref().map(|r| r.build_ms),
                "unfused_build": unfused_run.as_ref().map(|r| r.build_ms),
            },
            "tolerance": tol,
            "outputs": outputs,
            "expect": if expected.is_some() { json!(expect) } else { json!(null) },
            "output_file": args.output.as_ref().map(|p| p.display().to_string()),
            "notes": write_notes,
            "ok": ok,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_text(
            &args,
            &model_name,
            &prepared,
            fused.as_ref().map(|f| &f.report),
            &fusion_note,
            &threads,
            fused_run.as_ref(),
            unfused_run.as_ref(),
            primary,
            diffs.as_deref(),
            &expect_diffs,
            tol,
            &write_notes,
        );
    }
    if ok {
        Ok(ExitCode::SUCCESS)
    } else {
        let mut bad: Vec<String> = Vec::new();
        if let Some(d) = &diffs {
            bad.extend(
                d.iter()
                    .filter(|x| !x.ok)
                    .map(|x| format!("'{}' fused vs unfused", x.name)),
            );
        }
        for (path, d) in &expect_diffs {
            bad.extend(
                d.iter()
                    .filter(|x| !x.ok)
                    .map(|x| format!("'{}' {path} vs --expect", x.name)),
            );
        }
        eprintln!(
            "error: outputs differ beyond atol={} rtol={}: {}",
            tol.atol,
            tol.rtol,
            bad.join(", ")
        );
        Ok(ExitCode::from(crate::EXIT_DIFF))
    }
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

#[allow(clippy::too_many_arguments)]
fn print_text(
    args: &RunArgs,
    model_name: &str,
    prepared: &attnrt_runtime::PreparedInputs,
    report: Option<&FusionReport>,
    fusion_note: &str,
    threads: &attnrt_runtime::Threads,
    fused_run: Option<&RunResult>,
    unfused_run: Option<&RunResult>,
    primary: &RunResult,
    diffs: Option<&[OutputDiff]>,
    expect_diffs: &[(&str, Vec<OutputDiff>)],
    tol: Tolerance,
    write_notes: &[String],
) {
    println!("model: {model_name}");
    println!("dims: {}", dims_line(prepared));
    for ((name, how), t) in prepared.sources.iter().zip(&prepared.tensors) {
        println!(
            "input {name}: {} {:?} <- {how}",
            dtype_name(t.tensor.datum_type()),
            t.tensor.shape()
        );
    }
    println!("fusion: {fusion_note}");
    if let Some(r) = report {
        if !r.blocks.is_empty() {
            for l in r.summary_lines() {
                println!("  {l}");
            }
        }
    }
    println!("threads: {}", threads.count());
    for (what, r) in [("fused", fused_run), ("unfused", unfused_run)] {
        if let Some(r) = r {
            println!("ops ({what}): {}", r.ops);
        }
    }
    let path = if fused_run.is_some() {
        "fused"
    } else {
        "unfused"
    };
    for o in &primary.outputs {
        let s = summarize(&o.tensor)
            .map(|s| {
                format!(
                    "min={:.6} max={:.6} mean={:.6}{}",
                    s.min,
                    s.max,
                    s.mean,
                    if s.nan > 0 {
                        format!(" nan={}", s.nan)
                    } else {
                        String::new()
                    }
                )
            })
            .unwrap_or_default();
        println!(
            "output {} ({path}): {} {:?} {s}",
            o.name,
            dtype_name(o.tensor.datum_type()),
            o.tensor.shape()
        );
        if let Some(d) = diffs.and_then(|ds| ds.iter().find(|d| d.name == o.name)) {
            println!("  fused vs unfused: {}", fmt_err(d));
        }
    }
    for (p, ds) in expect_diffs {
        for d in ds {
            println!(
                "  {p} vs {}: {}: {}",
                args.expect
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                d.name,
                fmt_err(d)
            );
        }
    }
    let t = |r: Option<&RunResult>| {
        r.map(|r| format!("{:.3} ms (build {:.1} ms)", r.run_ms, r.build_ms))
    };
    match (t(fused_run), t(unfused_run)) {
        (Some(f), Some(u)) => println!("time: fused {f}, unfused {u}"),
        (Some(f), None) => println!("time: fused {f}"),
        (None, Some(u)) => println!("time: unfused {u}"),
        (None, None) => {}
    }
    if diffs.is_some() || !expect_diffs.is_empty() {
        println!("tolerance: |a-b| <= {} + {}*|b|", tol.atol, tol.rtol);
    }
    if let Some(out) = &args.output {
        println!("wrote {}", out.display());
    }
    for n in write_notes {
        println!("note: {n}");
    }
}
