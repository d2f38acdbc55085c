//! The shipped models as `models/manifest.json` lists them, with their saved input cases, and
//! how many attention blocks each file is expected to fuse (`models/expected_fused.json`).
//!
//! A manifest entry has one or several cases: decoders with a key/value cache carry a prefill
//! and decode steps under `cases: [{name, inputs_npz, outputs_npz, ...}]`; older entries have
//! only the single-case fields `inputs_npz`/`outputs_npz`, read as one case named `default`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

/// The repository's `models/` folder.
pub fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// One saved input case of a model: the inputs and PyTorch's outputs on them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ManifestCase {
    /// `default` for single-case models; `prefill`, `decode_p7_n1`, ... for decoders.
    pub name: String,
    /// Inputs, keys = graph input names (a file in `models/`).
    pub inputs_npz: String,
    /// PyTorch's outputs, keys = graph output names (a file in `models/`).
    pub outputs_npz: String,
    /// Max |ONNX Runtime − PyTorch| on this case at export time (absent when ORT refused it).
    #[serde(default)]
    pub ort_vs_torch_max_abs: Option<f64>,
    /// Why ONNX Runtime refused this case at export time, if it did.
    #[serde(default)]
    pub ort_error: Option<String>,
}

/// One shipped model file, as `models/manifest.json` describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct ManifestModel {
    /// File name inside `models/`.
    pub file: String,
    /// Model name (`mha_seed`, `bert_eager`, `gpt2_cache_sdpa`, ...).
    pub model: String,
    /// `torchscript` or `dynamo`.
    pub exporter: String,
    /// Default-domain opset of the export.
    pub opset: i64,
    /// The single-case inputs (for multi-case models: the exporter's example case).
    pub inputs_npz: String,
    /// The single-case PyTorch outputs.
    pub outputs_npz: String,
    /// Every saved case; empty in manifests written before cases existed (see [`Self::cases`]).
    #[serde(default)]
    cases: Vec<ManifestCase>,
    /// Attention blocks of the source module.
    pub attention_blocks: usize,
    /// Standard `Attention` nodes already in the export (dynamo at opset 23).
    #[serde(default)]
    pub attention_ops: usize,
    /// Variant tags (div-scale, additive-mask, gqa, kv-cache, ...).
    #[serde(default)]
    pub tags: Vec<String>,
    /// Max |ONNX Runtime − PyTorch| observed at export time on the single case.
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

    /// Every saved case of this file: the `cases` list, or, for an entry without one, the
    /// single case of `inputs_npz`/`outputs_npz` named `default`.
    pub fn cases(&self) -> Vec<ManifestCase> {
        if !self.cases.is_empty() {
            return self.cases.clone();
        }
        vec![ManifestCase {
            name: "default".into(),
            inputs_npz: self.inputs_npz.clone(),
            outputs_npz: self.outputs_npz.clone(),
            ort_vs_torch_max_abs: Some(self.ort_vs_torch_max_abs),
            ort_error: None,
        }]
    }

    /// Blocks attnrt must fuse in this file: the entry of `expected` for this file, else every
    /// attention block that is not already an `Attention` op.
    pub fn expected_fused(&self, expected: &ExpectedFused) -> usize {
        expected
            .files
            .get(&self.file)
            .map(|e| e.fused)
            .unwrap_or(self.attention_blocks.saturating_sub(self.attention_ops))
    }
}

/// A file that fuses fewer blocks than it has, and why (`models/expected_fused.json`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PartialFusion {
    /// Blocks fused today.
    pub fused: usize,
    /// Why the others are not, as `attnrt fuse --explain` says it.
    pub reason: String,
}

/// `models/expected_fused.json`: the known fusion limits of shipped files. A file not listed
/// must fuse every block.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExpectedFused {
    /// File name → what fuses.
    pub files: BTreeMap<String, PartialFusion>,
}

#[derive(Deserialize)]
struct Manifest {
    models: Vec<ManifestModel>,
}

/// Every model of `dir/manifest.json`, in file-name order.
pub fn read_manifest(dir: &Path) -> Result<Vec<ManifestModel>> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    parse_manifest(&text).with_context(|| format!("{}", path.display()))
}

fn parse_manifest(text: &str) -> Result<Vec<ManifestModel>> {
    let m: Manifest = serde_json::from_str(text)?;
    let mut models = m.models;
    models.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(models)
}

/// `dir/expected_fused.json`, checked against the manifest: every file it names must be a
/// shipped file, or a stale entry would hide nothing and mislead.
pub fn read_expected_fused(dir: &Path, models: &[ManifestModel]) -> Result<ExpectedFused> {
    let path = dir.join("expected_fused.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    parse_expected_fused(&text, models).with_context(|| format!("{}", path.display()))
}

fn parse_expected_fused(text: &str, models: &[ManifestModel]) -> Result<ExpectedFused> {
    let e: ExpectedFused = serde_json::from_str(text)?;
    if let Some(f) = e
        .files
        .keys()
        .find(|f| !models.iter().any(|m| &m.file == *f))
    {
        anyhow::bail!("'{f}' is not in the manifest");
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: &str = r#"{"file": "b.onnx", "model": "b", "exporter": "dynamo", "opset": 20,
        "inputs_npz": "b.in.npz", "outputs_npz": "b.out.npz", "attention_blocks": 2,
        "ort_vs_torch_max_abs": 1e-6"#;

    #[test]
    fn an_entry_without_cases_is_one_default_case() {
        let text = format!(r#"{{"models": [{ENTRY}}}]}}"#);
        let m = &parse_manifest(&text).unwrap()[0];
        let cases = m.cases();
        assert_eq!(cases.len(), 1);
        assert_eq!(
            (cases[0].name.as_str(), cases[0].inputs_npz.as_str()),
            ("default", "b.in.npz")
        );
        assert_eq!(cases[0].outputs_npz, "b.out.npz");
    }

    #[test]
    fn listed_cases_replace_the_single_case_fields() {
        let text = format!(
            r#"{{"models": [{ENTRY}, "cases": [
                {{"name": "prefill", "inputs_npz": "p.i", "outputs_npz": "p.o",
                  "ort_error": "empty"}},
                {{"name": "decode", "inputs_npz": "d.i", "outputs_npz": "d.o",
                  "ort_vs_torch_max_abs": 2e-6}}]}}]}}"#
        );
        let m = &parse_manifest(&text).unwrap()[0];
        let names: Vec<_> = m.cases().into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["prefill", "decode"]);
        assert_eq!(m.cases()[0].ort_error.as_deref(), Some("empty"));
        assert_eq!(m.cases()[1].ort_vs_torch_max_abs, Some(2e-6));
    }

    #[test]
    fn expected_fused_overrides_the_block_count_per_file() {
        let text = format!(r#"{{"models": [{ENTRY}, "attention_ops": 0}}]}}"#);
        let m = &parse_manifest(&text).unwrap()[0];
        let none = ExpectedFused::default();
        assert_eq!(m.expected_fused(&none), 2);
        let models = parse_manifest(&text).unwrap();
        let e = parse_expected_fused(
            r#"{"files": {"b.onnx": {"fused": 0, "reason": "r"}}}"#,
            &models,
        )
        .unwrap();
        assert_eq!(m.expected_fused(&e), 0);
        let stale = parse_expected_fused(
            r#"{"files": {"gone.onnx": {"fused": 0, "reason": "r"}}}"#,
            &models,
        );
        assert!(stale.unwrap_err().to_string().contains("gone.onnx"));
    }

    #[test]
    fn the_shipped_manifest_and_expected_fused_agree() {
        let models = read_manifest(&models_dir()).unwrap();
        assert!(models.iter().any(|m| m.cases().len() > 1));
        read_expected_fused(&models_dir(), &models).unwrap();
    }
}
