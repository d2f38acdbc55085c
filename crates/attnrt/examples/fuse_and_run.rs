//! Load a model, fuse its attention, run it, and check the fused outputs against the unfused
//! graph (and against saved reference outputs when given).
//!
//! ```sh
//! cargo run --release -p attnrt --example fuse_and_run -- models/bert_eager.ts.onnx \
//!     models/bert_eager.inputs.npz models/bert_eager.outputs.npz
//! ```
//!
//! Arguments: the model, then optionally an `.npz` of inputs (else seeded random inputs) and an
//! `.npz` of expected outputs. Exits 1 with one `error:` line on bad input, 3 when an output is
//! out of tolerance.

use std::process::ExitCode;

use anyhow::{Context, Result};
use attnrt::harness::{diff_outputs, read_npz_tensors, ToleranceChoice};

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(3),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .context("usage: fuse_and_run MODEL.onnx [INPUTS.npz [EXPECTED.npz]]")?;
    let inputs_npz = args.next();
    let expected_npz = args.next();

    let model = attnrt::load(&path)?;
    let fused = attnrt::fuse(&model)?;
    for line in fused.report.summary_lines() {
        println!("{line}");
    }
    let inputs = match &inputs_npz {
        Some(p) => read_npz_tensors(p.as_ref(), 1 << 28)?,
        None => attnrt::random_inputs(&model, 0)?,
    };

    // One session per graph; each serves any input shape it is given.
    let outputs = attnrt::session(&fused.model)?.run(&inputs)?;
    let reference = attnrt::session(&model)?.run(&inputs)?;
    let mut ok = true;
    for d in diff_outputs(&outputs, &reference, ToleranceChoice::ByDtype) {
        println!(
            "{}: fused vs unfused max |a-b| {:.2e} ({})",
            d.name,
            d.max_abs,
            if d.ok { "ok" } else { "OUT OF TOLERANCE" }
        );
        ok &= d.ok;
    }
    if let Some(p) = &expected_npz {
        let expected = read_npz_tensors(p.as_ref(), 1 << 28)?;
        for d in diff_outputs(&outputs, &expected, ToleranceChoice::ByDtype) {
            println!(
                "{}: fused vs {p} max |a-b| {:.2e} ({})",
                d.name,
                d.max_abs,
                if d.ok { "ok" } else { "OUT OF TOLERANCE" }
            );
            ok &= d.ok;
        }
    }
    Ok(ok)
}
