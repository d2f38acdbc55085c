//! Shared helpers of attnrt's end-to-end tests: where the shipped models are, what their
//! manifest says, and how to reach the Python checks CI installs.

use std::path::{Path, PathBuf};

use anyhow::Result;

pub use attnrt_testkit::manifest::{
    models_dir, ExpectedFused, ManifestCase, ManifestModel, PartialFusion,
};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every model of `models/manifest.json`, in file-name order.
pub fn manifest() -> Result<Vec<ManifestModel>> {
    attnrt_testkit::manifest::read_manifest(&models_dir())
}

/// `models/expected_fused.json`: the files that fuse fewer blocks than they have, and why.
pub fn expected_fused(models: &[ManifestModel]) -> Result<ExpectedFused> {
    attnrt_testkit::manifest::read_expected_fused(&models_dir(), models)
}

/// The Python interpreter with onnx and onnxruntime installed (`ATTNRT_PYTHON`, set by
/// `scripts/test.sh`). Panics with the fix when it is not set: these checks are part of the
/// suite, not optional.
pub fn python() -> PathBuf {
    match std::env::var_os("ATTNRT_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "ATTNRT_PYTHON is not set: run the suite with scripts/test.sh, which installs \
             tests/python/requirements.txt into a venv and points ATTNRT_PYTHON at it"
        ),
    }
}

/// Runs `tests/python/ort_check.py` with [`python`]: the ONNX checker (full check) on
/// `emitted`, then `original` and `emitted` in ONNX Runtime on the inputs of `npz`, their
/// outputs within `|emitted − original| ≤ atol + rtol·|original|`. `Err` with the script's
/// output when either fails.
pub fn ort_check(
    original: &Path,
    emitted: &Path,
    npz: &Path,
    atol: f64,
    rtol: f64,
) -> Result<(), String> {
    let result = std::process::Command::new(python())
        .arg(repo_root().join("tests/python/ort_check.py"))
        .args([original, emitted, npz])
        .args(["--atol", &atol.to_string(), "--rtol", &rtol.to_string()])
        .output()
        .expect("running ort_check.py");
    match result.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{}{}",
            String::from_utf8_lossy(&result.stdout).trim(),
            String::from_utf8_lossy(&result.stderr).trim()
        )),
    }
}
