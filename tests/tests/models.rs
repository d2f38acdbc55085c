//! Every shipped model on every saved case (decoders with a cache: a prefill with an empty
//! past and decode steps), end to end: the unfused graph on tract reproduces PyTorch, the fused
//! graph (attnrt's `Attention` node on attnrt's kernel) reproduces the unfused graph and
//! PyTorch, the expected number of attention blocks is fused (all of them, or what
//! models/expected_fused.json states with its reason), and the emitted model passes the ONNX
//! checker and gives the same outputs in ONNX Runtime.
//!
//! Tolerances (f32 throughout; the exports themselves agree with PyTorch to ≤ 6.2e-6 in ONNX
//! Runtime, see models/manifest.json):
//! - fused vs unfused: |a − b| ≤ 2e-5 + 1e-4·|b| — the kernel reassociates the softmax sums
//!   (online softmax over key blocks) and the dot products (SIMD lanes), a few ulps per step;
//! - either vs PyTorch: |a − b| ≤ 1e-4 + 1e-4·|b| — tract's own matmuls and layer norms differ
//!   from PyTorch's by more than the fused kernel differs from tract.

use std::collections::BTreeMap;

use attnrt::harness::{compare, read_npz_tensors, CompareOptions, Tolerance};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::{load_model, save_model, Limits, SaveOptions};
use attnrt_runtime::{NamedTensor, Threads};
use attnrt_tests::{expected_fused, manifest, models_dir, ort_check};

const FUSED_VS_UNFUSED: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};
const VS_PYTORCH: Tolerance = Tolerance {
    atol: 1e-4,
    rtol: 1e-4,
};

struct Row {
    file: String,
    case: String,
    blocks: usize,
    fused: usize,
    fused_vs_unfused: f64,
    fused_vs_torch: f64,
    unfused_vs_torch: f64,
}

fn max_abs(d: &[attnrt::harness::OutputDiff]) -> f64 {
    d.iter().map(|d| d.max_abs).fold(0.0, f64::max)
}

fn check_all(failures: &mut Vec<String>, what: &str, diffs: &[attnrt::harness::OutputDiff]) {
    for d in diffs.iter().filter(|d| !d.ok) {
        failures.push(format!(
            "{what}: output '{}': max_abs {:.3e} max_rel {:.3e} mismatches {} {}",
            d.name,
            d.max_abs,
            d.max_rel,
            d.mismatches,
            d.problem.clone().unwrap_or_default()
        ));
    }
}

fn load_npz(file: &str) -> Vec<NamedTensor> {
    read_npz_tensors(&models_dir().join(file), 1 << 28).unwrap_or_else(|e| panic!("{file}: {e:#}"))
}

#[test]
fn fused_matches_unfused_and_pytorch_on_every_shipped_model() {
    let threads = Threads::new(None).unwrap();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let models = manifest().unwrap();
    let expected = expected_fused(&models).unwrap();
    for m in &models {
        let path = models_dir().join(&m.file);
        let model = load_model(&path, &Limits::default())
            .unwrap_or_else(|e| panic!("{e:#}"))
            .model;
        let fused = fuse(&model, &FusionOptions::default())
            .unwrap_or_else(|e| panic!("{}: fuse: {e:#}", m.file));
        let want = m.expected_fused(&expected);
        if fused.report.blocks.len() != want {
            failures.push(format!(
                "{}: {} blocks fused, expected {want} (models/expected_fused.json); near misses: {:?}",
                m.file,
                fused.report.blocks.len(),
                fused.report.explain_lines()
            ));
        }
        // Every saved case: decoders have a prefill (empty past) and decode steps.
        for case in m.cases() {
            let what = format!("{} [{}]", m.file, case.name);
            let inputs = load_npz(&case.inputs_npz);
            let torch = load_npz(&case.outputs_npz);
            let options = CompareOptions {
                tolerance: FUSED_VS_UNFUSED.into(),
                expect_tolerance: Some(VS_PYTORCH.into()),
                ..CompareOptions::default()
            };
            let cmp = match compare(&model, &what, &inputs, Some(&torch), &threads, &options) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(format!("{what}: {e:#}"));
                    continue;
                }
            };
            if cmp.fused.is_none() && want > 0 {
                failures.push(format!("{what}: the fused path did not run"));
                continue;
            }
            let expect = cmp.expect.clone().unwrap_or_default();
            let d_fu = cmp.diffs.clone().unwrap_or_default();
            let d_ft = expect.get("fused").cloned().unwrap_or_default();
            let d_ut = expect.get("unfused").cloned().unwrap_or_default();
            check_all(&mut failures, &format!("{what} fused vs unfused"), &d_fu);
            check_all(&mut failures, &format!("{what} fused vs PyTorch"), &d_ft);
            check_all(&mut failures, &format!("{what} unfused vs PyTorch"), &d_ut);
            rows.push(Row {
                file: m.file.clone(),
                case: case.name.clone(),
                blocks: m.attention_blocks,
                fused: fused.report.blocks.len(),
                fused_vs_unfused: max_abs(&d_fu),
                fused_vs_torch: max_abs(&d_ft),
                unfused_vs_torch: max_abs(&d_ut),
            });
        }
    }
    println!(
        "| model | case | attention blocks | fused | max abs fused−unfused | max abs fused−PyTorch | max abs unfused−PyTorch |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.2e} | {:.2e} | {:.2e} |",
            r.file,
            r.case,
            r.blocks,
            r.fused,
            r.fused_vs_unfused,
            r.fused_vs_torch,
            r.unfused_vs_torch
        );
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The emitted models pass `onnx.checker.check_model(full_check=True)` and ONNX Runtime gives
/// the same outputs for them as for the originals, on every saved case.
#[test]
fn emitted_models_pass_the_onnx_checker_and_onnx_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for m in manifest().unwrap() {
        let path = models_dir().join(&m.file);
        let model = load_model(&path, &Limits::default()).unwrap().model;
        let fused = fuse(&model, &FusionOptions::default()).unwrap();
        if fused.report.blocks.is_empty() {
            continue;
        }
        let out = dir.path().join(&m.file);
        save_model(&fused.model, &out, &SaveOptions::default()).unwrap();
        for case in m.cases() {
            let npz = models_dir().join(&case.inputs_npz);
            checked += 1;
            if let Err(e) = ort_check(&path, &out, &npz, 1e-4, 1e-3) {
                failures.push(format!("{} [{}]: {e}", m.file, case.name));
            }
        }
    }
    assert!(checked > 0, "no fused model was checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Fusing is deterministic: the same model gives the same bytes twice, and fusing a fused
/// model finds nothing more to do.
#[test]
fn fusion_is_deterministic_and_idempotent() {
    use prost::Message;
    let mut by_family: BTreeMap<String, usize> = BTreeMap::new();
    for m in manifest().unwrap() {
        let model = load_model(&models_dir().join(&m.file), &Limits::default())
            .unwrap()
            .model;
        let a = fuse(&model, &FusionOptions::default()).unwrap();
        let b = fuse(&model, &FusionOptions::default()).unwrap();
        assert_eq!(
            a.model.encode_to_vec(),
            b.model.encode_to_vec(),
            "{}",
            m.file
        );
        let again = fuse(&a.model, &FusionOptions::default()).unwrap();
        assert!(again.report.blocks.is_empty(), "{}: fused twice", m.file);
        *by_family.entry(m.model.clone()).or_default() += a.report.blocks.len();
    }
    assert!(by_family.values().any(|&n| n > 0));
}
