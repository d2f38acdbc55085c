//! `attnrt fuse`: fuse attention blocks and write the model atomically.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use attnrt::{FusionOptions, SaveOptions};
use clap::Args;
use serde_json::json;

use crate::common::{load, LimitArgs};

/// Arguments of `attnrt fuse`.
#[derive(Args, Debug)]
pub struct FuseArgs {
    /// The ONNX model to fuse.
    pub model: PathBuf,
    /// Where to write the fused model (never the input, unless --in-place).
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FILE.onnx",
        required_unless_present = "in_place"
    )]
    pub output: Option<PathBuf>,
    /// Overwrite the input model with the fused one (atomically).
    #[arg(long)]
    pub in_place: bool,
    /// List every Softmax that looked like attention but was not fused, and why.
    #[arg(long)]
    pub explain: bool,
    /// Print one JSON object (the fusion report) on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write Graphviz drawings of each fused block, before and after, into this folder.
    #[arg(long, value_name = "DIR")]
    pub dot: Option<PathBuf>,
    /// Fuse only blocks whose fused form is exact on every input (no caveats).
    #[arg(long)]
    pub strict: bool,
    /// Leave GELU activations as they are (by default their exported forms become one `Gelu`).
    #[arg(long)]
    pub no_gelu: bool,
    /// Store tensors of at least this many bytes in `<output>.data` beside the model.
    #[arg(long, value_name = "BYTES")]
    pub external_data_threshold: Option<usize>,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Whether two paths name the same file (following links; false if either does not exist).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Runs the command.
pub fn fuse(args: FuseArgs) -> Result<()> {
    let output = match (&args.output, args.in_place) {
        (Some(o), true) if !same_file(o, &args.model) => {
            bail!(
                "--in-place writes over the input; do not also give -o {}",
                o.display()
            )
        }
        (_, true) => args.model.clone(),
        (Some(o), false) => {
            if same_file(o, &args.model) {
                bail!(
                    "-o {} is the input model; refusing to overwrite it (use --in-place to do that)",
                    o.display()
                );
            }
            o.clone()
        }
        (None, false) => bail!("no output: give -o FILE.onnx or --in-place"),
    };
    if output.is_dir() {
        bail!("-o {}: is a folder; give a file name", output.display());
    }
    let limits = args.limits.limits();
    let loaded = load(&args.model, &limits)?;
    if args.in_place && !loaded.external_files.is_empty() && args.external_data_threshold.is_none()
    {
        // Writing inline is safe (the old data files stay untouched); say where the data went.
        eprintln!(
            "note: {} had external data ({}); the fused model stores it inline",
            args.model.display(),
            loaded.external_files.join(", ")
        );
    }
    let fused = attnrt::fuse_with(
        &loaded.model,
        &FusionOptions {
            strict: args.strict,
            gelu: !args.no_gelu,
        },
    )
    .with_context(|| format!("{}: fusion failed", args.model.display()))?;
    let save = SaveOptions {
        external_threshold: args.external_data_threshold,
        skip_validation: false,
    };
    attnrt::save_model(&fused.model, &output, &save)?;

    let mut dot_files = Vec::new();
    if let Some(dir) = &args.dot {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (i, b) in fused.report.blocks.iter().enumerate() {
            let text = attnrt::block_dot(&loaded.model, &fused, i);
            let file_name: String = b
                .node
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let path = dir.join(format!("{i:02}_{file_name}.dot"));
            attnrt::write_atomic(&path, text.as_bytes())?;
            dot_files.push(path.display().to_string());
        }
    }

    if args.json {
        let v = json!({
            "input": args.model.display().to_string(),
            "output": output.display().to_string(),
            "report": fused.report,
            "dot_files": dot_files,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if fused.report.blocks.is_empty() {
        println!("no attention block fused in {}", args.model.display());
    }
    for l in fused.report.summary_lines() {
        println!("{l}");
    }
    if args.explain {
        for l in fused.report.explain_lines() {
            println!("{l}");
        }
    }
    for f in &dot_files {
        println!("drew {f}");
    }
    println!("wrote {}", output.display());
    Ok(())
}
