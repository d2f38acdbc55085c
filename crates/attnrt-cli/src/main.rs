//! `attnrt`: fuse multi-head attention in ONNX models, run fused vs unfused and diff, benchmark.
//!
//! This binary only parses arguments and calls the attnrt crates; see `--help` for exit codes.

mod bench;
mod common;
mod fuse;
mod generate;
mod memory;
mod profile;
mod run;
mod stream;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc keeps freed blocks for reuse: with glibc's allocator every decode step of
/// `attnrt generate` page-faulted its fresh `present_*` cache tensors in (glibc unmaps blocks
/// above its mmap threshold when they are freed). See benches/README.md, "Decode step".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const EXIT_CODES: &str = "\
Exit codes:
  0   success
  1   error (bad model, bad input file, failed run...), printed as one `error: ...` line
  2   usage error (unknown flag, missing argument)
  3   `run`: an output differs beyond --atol/--rtol (fused vs unfused, or vs --expect)
  70  internal error (a bug in attnrt)";

/// Fuse multi-head attention in ONNX models and run them on attnrt's kernel.
#[derive(Parser, Debug)]
#[command(name = "attnrt", version, about, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a model: fused (attnrt kernel) and unfused (original graph on tract), and diff them.
    #[command(after_help = EXIT_CODES)]
    Run(run::RunArgs),
    /// Fuse the attention blocks of a model into ONNX `Attention` nodes and write the result.
    #[command(after_help = EXIT_CODES)]
    Fuse(fuse::FuseArgs),
    /// Time the fused and the unfused model (warm-up, repetitions, median and spread).
    #[command(after_help = EXIT_CODES)]
    Bench(bench::BenchArgs),
    /// Generate tokens greedily with a decoder exported with its key/value cache.
    #[command(after_help = EXIT_CODES)]
    Generate(generate::GenerateArgs),
}

/// Exit code for an output that differs beyond tolerance.
pub const EXIT_DIFF: u8 = 3;
/// Exit code for an internal error (panic).
const EXIT_INTERNAL: i32 = 70;

fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        // Panics inside tract calls are caught by the runtime and reported as errors.
        if attnrt::panic_is_guarded() {
            return;
        }
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal error: {msg}{at} (this is a bug in attnrt)");
        std::process::exit(EXIT_INTERNAL);
    }));
}

fn main() -> ExitCode {
    install_panic_hook();
    memory::keep_freed_memory();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Fuse(a) => fuse::fuse(a).map(|()| ExitCode::SUCCESS),
        Command::Bench(a) => bench::bench(a).map(|()| ExitCode::SUCCESS),
        Command::Generate(a) => generate::generate(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its context chain on one line, outermost first, without repeating a cause
/// that the message above it already contains.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string().replace('\n', " ");
        if parts.last().is_some_and(|p| p.contains(&s)) {
            continue;
        }
        parts.push(s);
    }
    parts.join(": ")
}
