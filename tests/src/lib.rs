//! Shared helpers of attnrt's end-to-end tests: where the shipped models are, what their
//! manifest says, and how to reach the Python checks CI installs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

/// The repository's `models/` folder.
pub fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One shipped model, as `models/manifest.json` describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct ManifestModel {
    /// File name inside `models/`.
    pub file: String,
    /// Model family name (`mha_seed`, `bert_eager`, ...).
    pub model: String,
    /// `ts` or `dynamo`.
    pub exporter: String,
    /// Default-domain opset of the export.
    pub opset: i64,
    /// Seeded inputs, keys = graph input names.
    pub inputs_npz: String,
    /// PyTorch outputs, keys = graph output names.
    pub outputs_npz: String,
    /// Softmaxes in the graph that are attention.
    pub attention_blocks: usize,
    /// Standard `Attention` nodes already in the export (dynamo at opset 23).
    #[serde(default)]
    pub attention_ops: usize,
    /// Variant tags (div-scale, additive-mask, gqa, ...).
    #[serde(default)]
    pub tags: Vec<String>,
    /// Max |ONNX Runtime − PyTorch| observed at export time.
    pub ort_vs_torch_max_abs: f64,
    /// The export-time run at another batch and sequence length (`ok`: PyTorch agreed).
    #[serde(default)]
    pub other_shapes_check: Option<serde_json::Value>,
}

impl ManifestModel {
    /// Whether the export really serves other batch and sequence lengths (TorchScript exports
    /// of nn.MultiheadAttention bake the example's sizes into their Reshapes).
    pub fn dynamic_shapes_work(&self) -> bool {
        self.other_shapes_check
            .as_ref()
            .and_then(|c| c.get("ok"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }
}

#[derive(Deserialize)]
struct Manifest {
    models: Vec<ManifestModel>,
}

/// Every model of `models/manifest.json`, in file-name order.
pub fn manifest() -> Result<Vec<ManifestModel>> {
    let path = models_dir().join("manifest.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let m: Manifest = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let mut models = m.models;
    models.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(models)
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
