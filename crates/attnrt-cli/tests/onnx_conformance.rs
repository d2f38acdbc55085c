//! Conformance with the ONNX `Attention` op (opset 23/24), through the `attnrt run` command:
//! the 128 `test_attention_*` node tests of the onnx 1.22.0 wheel, each run by this build's
//! `attnrt` binary by `tests/python/run_onnx_conformance.py` (its doc says what every case must
//! show: the 64 op cases on attnrt's kernel, the 64 `_expanded` graphs fused back into one
//! `Attention` node, every output within attnrt's default tolerance for its element type: the
//! cases run with default flags, as a user would run them).
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

/// The float16 expansions, run with default flags: fused vs unfused is judged by the float16
/// defaults (they differ by more than the float32 ones allow: the fused path rounds once, the
/// unfused one after every op), and the report says which tolerance it used.
#[test]
fn float16_cases_pass_with_the_float16_default_tolerance() {
    let cases = env_path("ATTNRT_ONNX_CASES", "the onnx 1.22.0 Attention cases");
    for case in [
        "test_attention_4d_fp16_expanded",
        "test_attention_4d_gqa_with_past_and_present_fp16_expanded",
    ] {
        let dir = cases.join(case);
        let out = Command::new(env!("CARGO_BIN_EXE_attnrt"))
            .arg("run")
            .arg(dir.join("model.onnx"))
            .arg("--input-npz")
            .arg(dir.join("inputs.npz"))
            .arg("--expect")
            .arg(dir.join("outputs.npz"))
            .arg("--json")
            .output()
            .expect("attnrt starts");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{case}: {}\n{stderr}", out.status);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        assert_eq!(v["tolerance_source"], "dtype defaults", "{case}");
        assert_eq!(v["tolerance"]["atol"], 2e-3, "{case}");
        let diff = &v["outputs"][0]["diff_vs_unfused"];
        assert_eq!(diff["dtype"], "float16", "{case}");
        assert_eq!(diff["tolerance"]["rtol"], 2e-3, "{case}");
        // The same run with the float32 tolerance forced, the unfused graph's float16
        // arithmetic as declared (`--half-as-float off`; on, both paths compute in float32),
        // fails on the diff (exit 3): the per-dtype default is what makes it pass, not a
        // loose comparison.
        let strict = Command::new(env!("CARGO_BIN_EXE_attnrt"))
            .arg("run")
            .arg(dir.join("model.onnx"))
            .arg("--input-npz")
            .arg(dir.join("inputs.npz"))
            .args(["--atol", "1e-4", "--rtol", "1e-4", "--half-as-float", "off"])
            .output()
            .expect("attnrt starts");
        assert_eq!(
            strict.status.code(),
            Some(3),
            "{case} with float32 tolerances: {}",
            String::from_utf8_lossy(&strict.stderr)
        );
    }
}
