//! Conformance with the ONNX `Attention` op (opset 23/24), through the `attnrt run` command:
//! the 128 `test_attention_*` node tests of the onnx 1.22.0 wheel, each run by this build's
//! `attnrt` binary by `tests/python/run_onnx_conformance.py` (its doc says what every case must
//! show: the 64 op cases on attnrt's kernel, the 64 `_expanded` graphs fused back into one
//! `Attention` node, every output within 1e-5 + 1e-3·|b| of the expected data).
//!
//! `scripts/test.sh` fetches the cases (`ATTNRT_ONNX_CASES`) and the Python environment
//! (`ATTNRT_PYTHON`); without them this test fails and says so: it is part of the suite.

use std::path::PathBuf;
use std::process::Command;

fn env_path(var: &str, what: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => panic!("{var} is not set ({what}): run the suite with scripts/test.sh"),
    }
}

#[test]
fn every_onnx_attention_case_passes_through_attnrt_run() {
    let python = env_path("ATTNRT_PYTHON", "the venv with onnx and numpy");
    let cases = env_path(
        "ATTNRT_ONNX_CASES",
        "the onnx 1.22.0 Attention cases, fetched by tests/python/fetch_onnx_attention_cases.py",
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/python/run_onnx_conformance.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg("--attnrt")
        .arg(env!("CARGO_BIN_EXE_attnrt"))
        .arg("--cases")
        .arg(&cases)
        .output()
        .expect("the conformance script starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{} exited with {}:\n{stderr}",
        script.display(),
        out.status
    );
    assert!(
        stdout.contains("64/64 op cases on the kernel, 64/64 expansions fused"),
        "summary line missing:\n{stdout}"
    );
}
