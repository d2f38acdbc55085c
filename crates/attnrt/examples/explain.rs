//! Why each attention candidate of a model was or was not fused: the blocks fused, then every
//! near miss with the node and the check that failed (what `attnrt fuse --explain` prints), or
//! the whole report as JSON with `--json` (what `attnrt fuse --json` prints).
//!
//! ```sh
//! cargo run -p attnrt --example explain -- models/gpt2_cache_eager.ts.onnx
//! cargo run -p attnrt --example explain -- models/bert_eager.ts.onnx --json
//! ```

use std::process::ExitCode;

use anyhow::{Context, Result};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .context("usage: explain MODEL.onnx [--json]")?;
    let json = args.iter().any(|a| a == "--json");

    let model = attnrt::load(path)?;
    let fused = attnrt::fuse(&model)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&fused.report)?);
        return Ok(());
    }
    for line in fused.report.summary_lines() {
        println!("{line}");
    }
    for line in fused.report.explain_lines() {
        println!("  {line}");
    }
    Ok(())
}
