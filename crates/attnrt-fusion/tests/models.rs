//! The shipped models in `models/`: every attention block the manifest lists must fuse (or as
//! many as models/expected_fused.json states, with its reason), the fused model must validate,
//! fusion must be deterministic, and the fused structure is snapshotted (tests/snapshots/).

use std::path::Path;

use attnrt_fusion::{fuse, structure_text, FusionOptions};
use attnrt_onnx::{load_model, Limits};
use attnrt_testkit::manifest::models_dir;
use prost::Message;

/// (file, attention blocks, Attention ops already present, blocks expected to fuse) from the
/// manifest and models/expected_fused.json.
fn manifest() -> Vec<(String, usize, usize, usize)> {
    use attnrt_testkit::manifest::{read_expected_fused, read_manifest};
    // Files listed in expected_fused.json fuse fewer blocks (decoders with a cache today).
    let models = read_manifest(&models_dir()).unwrap_or_else(|e| panic!("{e:#}"));
    let expected = read_expected_fused(&models_dir(), &models).unwrap_or_else(|e| panic!("{e:#}"));
    models
        .iter()
        .map(|m| {
            let want = m.expected_fused(&expected);
            (m.file.clone(), m.attention_blocks, m.attention_ops, want)
        })
        .collect()
}

#[test]
fn shipped_models_fuse_every_block() {
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for (file, blocks, ops, expected) in manifest() {
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
        if n != expected {
            failures.push(format!(
                "{file}: expected {expected} fused blocks (models/expected_fused.json), got {n}"
            ));
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
