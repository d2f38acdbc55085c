//! What the integration tests of attnrt-onnx share: the shipped models.

use std::path::{Path, PathBuf};

/// The repository's `models/` folder.
pub fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// Every `.onnx` file in `models/`, sorted (at least ten, or the checkout is incomplete).
pub fn shipped_models() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(models_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    assert!(v.len() >= 10, "expected the shipped models in models/");
    v
}
