//! Conformance with the ONNX `Attention` op: the 128 `test_attention_*` node tests of the
//! onnx 1.22.0 wheel (fetched by `tests/python/fetch_onnx_attention_cases.py`, which
//! `scripts/test.sh` runs; `ATTNRT_ONNX_CASES` points at them).
//!
//! - The 64 op cases run the `Attention` node on attnrt's kernel (attnrt's parser replaces
//!   tract's). Each must match the expected outputs, or, for a case listed in `UNSUPPORTED`,
//!   fail with a clear error — never give a wrong answer.
//! - The 64 `_expanded` cases are the same computations decomposed into plain ops; they run
//!   unfused on tract, and again after attnrt's fusion, which must agree too. Fusion must
//!   keep finding the attention block in at least [`MIN_FUSED_EXPANSIONS`] of them (the fused
//!   graph then runs the `Attention` node on attnrt's kernel); the others are listed with the
//!   reason `attnrt fuse --explain` gives.
//!
//! Tolerance: |a − b| ≤ 1e-5 + 1e-3·|b| (the onnx backend tests use rtol 1e-3; their
//! expected data is computed in float64 by the reference implementation), 1e-3 + 1e-3·|b|
//! for float16 cases.

use std::path::PathBuf;

use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::{load_model, Limits};
use attnrt_runtime::{diff_outputs, read_npz_tensors, run_once, Backend, Threads, Tolerance};
use serde::Deserialize;

/// Cases attnrt refuses, with the reason; the refusal must name the node or input. None since
/// the opset-24 `nonpad_kv_seqlen` input and the 1-element `Pad` constant of its expansion
/// (`attnrt-runtime`) are handled.
const UNSUPPORTED: &[(&str, &str)] = &[];

/// Expansions whose attention block fusion finds. Measured: all 64 (fusion accepts the
/// expansions' same-type `Cast`s around the Softmax, their softcap, their GQA repeat, the
/// `Pad` of the opset-24 padding mask, and emits their `qk_matmul_output` as the fused
/// node's 4th output); before those rules, none. The number must not drop.
const MIN_FUSED_EXPANSIONS: usize = 64;

#[derive(Deserialize)]
struct Case {
    case: String,
    expanded: bool,
    dtype: String,
}

fn cases_dir() -> PathBuf {
    match std::env::var_os("ATTNRT_ONNX_CASES") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "ATTNRT_ONNX_CASES is not set: run the suite with scripts/test.sh, which fetches the \
             onnx 1.22.0 Attention cases (tests/python/fetch_onnx_attention_cases.py)"
        ),
    }
}

enum Outcome {
    Pass(f64),
    Refused(String),
    Wrong(String),
}

/// What fusion did to an expanded case: blocks fused, or the first near miss.
enum Fusion {
    NotAsked,
    Fused(usize),
    NotFused(String),
}

fn run_case(
    dir: &std::path::Path,
    tol: Tolerance,
    fused: bool,
    threads: &Threads,
) -> (Outcome, Fusion) {
    let model = match load_model(&dir.join("model.onnx"), &Limits::default()) {
        Ok(m) => m.model,
        Err(e) => return (Outcome::Refused(format!("{e:#}")), Fusion::NotAsked),
    };
    let (model, fusion) = if fused {
        match fuse(&model, &FusionOptions::default()) {
            Ok(f) if f.report.blocks.is_empty() => {
                let why = f
                    .report
                    .explain_lines()
                    .into_iter()
                    .find(|l| l.starts_with("not fused"))
                    .unwrap_or_else(|| "no Softmax looked like attention".into());
                (f.model, Fusion::NotFused(why))
            }
            Ok(f) => {
                let n = f.report.blocks.len();
                (f.model, Fusion::Fused(n))
            }
            Err(e) => {
                return (
                    Outcome::Wrong(format!("fusion failed: {e:#}")),
                    Fusion::NotAsked,
                )
            }
        }
    } else {
        (model, Fusion::NotAsked)
    };
    (run_model(dir, &model, tol, threads), fusion)
}

fn run_model(
    dir: &std::path::Path,
    model: &attnrt_onnx::ModelProto,
    tol: Tolerance,
    threads: &Threads,
) -> Outcome {
    let inputs = read_npz_tensors(&dir.join("inputs.npz"), 1 << 26).unwrap();
    let expected = read_npz_tensors(&dir.join("outputs.npz"), 1 << 26).unwrap();
    match run_once(
        model,
        &inputs,
        threads,
        &dir.display().to_string(),
        Backend::default(),
    ) {
        Err(e) => Outcome::Refused(format!("{e:#}")),
        Ok(r) => {
            let diffs = diff_outputs(&r.outputs, &expected, tol);
            let worst = diffs.iter().map(|d| d.max_abs).fold(0.0, f64::max);
            let bad: Vec<String> = diffs
                .iter()
                .filter(|d| !d.ok)
                .map(|d| {
                    format!(
                        "{}: max_abs {:.3e}, {} mismatches {}",
                        d.name,
                        d.max_abs,
                        d.mismatches,
                        d.problem.clone().unwrap_or_default()
                    )
                })
                .collect();
            if bad.is_empty() {
                Outcome::Pass(worst)
            } else {
                Outcome::Wrong(bad.join("; "))
            }
        }
    }
}

#[test]
fn onnx_attention_node_tests() {
    let dir = cases_dir();
    let text = std::fs::read_to_string(dir.join("cases.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    assert_eq!(
        cases.len(),
        128,
        "the onnx 1.22.0 wheel has 128 attention cases"
    );
    let threads = Threads::new(Some(2)).unwrap();
    let mut problems = Vec::new();
    let (mut passed, mut refused) = (0, 0);
    let mut fused_expansions = 0;
    let mut not_fused = Vec::new();
    println!("| case | path | outcome |");
    println!("|---|---|---|");
    for c in &cases {
        let tol = if c.dtype == "float16" {
            Tolerance {
                atol: 1e-3,
                rtol: 1e-3,
            }
        } else {
            Tolerance {
                atol: 1e-5,
                rtol: 1e-3,
            }
        };
        let paths: &[bool] = if c.expanded { &[false, true] } else { &[false] };
        for &fused in paths {
            let label = match (c.expanded, fused) {
                (false, _) => "Attention op",
                (true, false) => "expanded, unfused",
                (true, true) => "expanded, fused",
            };
            let (outcome, fusion) = run_case(&dir.join(&c.case), tol, fused, &threads);
            let label = match &fusion {
                Fusion::NotAsked => label.to_string(),
                Fusion::Fused(n) => {
                    fused_expansions += 1;
                    format!("{label} ({n} block)")
                }
                Fusion::NotFused(why) => {
                    not_fused.push(format!("{}: {why}", c.case));
                    format!("{label} (nothing fused)")
                }
            };
            let known = UNSUPPORTED.iter().find(|(name, _)| *name == c.case);
            let shown = match (&outcome, known) {
                (Outcome::Pass(e), None) => {
                    passed += 1;
                    format!("pass (max abs {e:.1e})")
                }
                (Outcome::Pass(_), Some(_)) => {
                    problems.push(format!(
                        "{} ({label}): passes; remove it from UNSUPPORTED",
                        c.case
                    ));
                    "pass (listed as unsupported)".into()
                }
                (Outcome::Refused(e), Some((_, why))) => {
                    refused += 1;
                    format!(
                        "refused as expected ({why}): {}",
                        e.lines().next().unwrap_or("")
                    )
                }
                (Outcome::Refused(e), None) => {
                    problems.push(format!("{} ({label}): refused: {e}", c.case));
                    format!("REFUSED: {e}")
                }
                (Outcome::Wrong(e), _) => {
                    problems.push(format!("{} ({label}): WRONG ANSWER: {e}", c.case));
                    format!("WRONG: {e}")
                }
            };
            println!("| {} | {label} | {shown} |", c.case);
        }
    }
    println!("passed {passed}, refused as documented {refused}");
    println!(
        "expansions fused: {fused_expansions} of {}; not fused:\n  {}",
        cases.iter().filter(|c| c.expanded).count(),
        not_fused.join("\n  ")
    );
    if fused_expansions < MIN_FUSED_EXPANSIONS {
        problems.push(format!(
            "only {fused_expansions} expansions fused, expected at least {MIN_FUSED_EXPANSIONS}"
        ));
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
