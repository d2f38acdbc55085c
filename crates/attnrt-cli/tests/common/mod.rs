//! Helpers shared by the CLI's integration tests (each test binary uses its own subset).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs the `attnrt` binary built for these tests.
pub fn attnrt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnrt"))
        .args(args)
        .output()
        .expect("the attnrt binary runs")
}

/// The path of a shipped model (`models/<file>`), as an argument.
pub fn model(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file)
        .display()
        .to_string()
}
