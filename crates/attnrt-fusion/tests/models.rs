//! The shipped models in `models/`: every attention block the manifest lists must fuse, the
//! fused model must validate, fusion must be deterministic, and the fused structure is
//! snapshotted (tests/snapshots/).

use std::path::{Path, PathBuf};

use attnrt_fusion::{fuse, structure_text, FusionOptions};
use attnrt_onnx::{load_model, Limits};
use prost::Message;

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// (file, attention blocks, Attention ops already present) from the manifest.
fn manifest() -> Vec<(String, usize, usize)> {
    let text =
        std::fs::read_to_string(models_dir().join("manifest.json")).expect("models/manifest.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("manifest is JSON");
    v["models"]
        .as_array()
        .expect("models array")
        .iter()
        .map(|m| {
            (
                m["file"].as_str().unwrap().to_string(),
                m["attention_blocks"].as_u64().unwrap_or(0) as usize,
                m["attention_ops"].as_u64().unwrap_or(0) as usize,
            )
        })
        .collect()
}

#[test]
fn shipped_models_fuse_every_block() {
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for (file, blocks, ops) in manifest() {
        let path = models_dir().join(&file);
        if !path.exists() {
            continue;
        }
        let loaded =
            load_model(&path, &Limits::default()).unwrap_or_else(|e| panic!("{file}: {e:#}"));
        let fused = fuse(&loaded.model, &FusionOptions::default())
            .unwrap_or_else(|e| panic!("{file}: {e:#}"));
        let n = fused.report.blocks.len();
        table.push(format!("{file}: {blocks} blocks, {ops} ops, fused {n}"));
        for l in fused
            .report
            .summary_lines()
            .iter()
            .chain(fused.report.explain_lines().iter())
        {
            table.push(format!("    {l}"));
        }
        let expected = if ops > 0 { 0 } else { blocks };
        if n != expected {
            failures.push(format!("{file}: expected {expected} fused blocks, got {n}"));
        }
        attnrt_onnx::validate_model(&fused.model)
            .unwrap_or_else(|e| panic!("{file}: fused model invalid: {e}"));
        let again = fuse(&loaded.model, &FusionOptions::default()).unwrap();
        assert_eq!(
            fused.model.encode_to_vec(),
            again.model.encode_to_vec(),
            "{file}: fusion is not deterministic"
        );
        let name = file.trim_end_matches(".onnx").replace('.', "_");
        insta::assert_snapshot!(name, structure_text(&fused.model));
        if let Ok(dir) = std::env::var("ATTNRT_FUSED_DIR") {
            let out = Path::new(&dir).join(&file);
            attnrt_onnx::save_model(&fused.model, &out, &Default::default()).unwrap();
        }
    }
    println!("{}", table.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
