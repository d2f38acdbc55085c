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
