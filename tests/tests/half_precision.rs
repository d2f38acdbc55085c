//! The float16 models of `models/half/` (ONNX Runtime's float16 converter on shipped BERT and
//! LLaMA-with-cache exports, `models/half.py`), fused and unfused, with the rewrite
//! `half-as-float` on (the default: the arithmetic runs in float32 on attnrt's kernels) and off
//! (float16 as declared; the fused `Attention` takes and gives float16), against each other and
//! against ONNX Runtime's outputs on the same float16 file.
//!
//! Tolerances, |a − b| ≤ atol + rtol·|b|:
//! - on, fused vs unfused: both compute in float32, so float32 reassociation only; a float16
//!   output may differ by its final rounding (one float16 step, 2⁻¹⁰ relative);
//! - on, vs ONNX Runtime (which rounds every intermediate to float16): the graph's own float16
//!   error, 1e-2 + 1e-2·|b| (ORT's float16 run is 3e-3 (BERT) to 1.3e-2 (LLaMA prefill) from its
//!   float32 run of the source file, `models/half/manifest.json`);
//! - off: float16 arithmetic on both sides, the fused attention's inside in float32:
//!   3e-2 + 3e-2·|b| between any two of fused, unfused and ONNX Runtime.

use std::path::Path;

use attnrt::harness::{diff_outputs, read_npz_tensors, Tolerance};
use attnrt_onnx::{load_model, Limits, ModelProto};
use attnrt_runtime::{DatumType, NamedTensor, OpCounts, Session, SessionOptions, Threads};
use attnrt_tests::models_dir;

const ON_FUSED_VS_UNFUSED_F32: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};
const ON_FUSED_VS_UNFUSED_F16: Tolerance = Tolerance {
    atol: 1e-4,
    rtol: 2e-3,
};
const ON_VS_ORT: Tolerance = Tolerance {
    atol: 1e-2,
    rtol: 1e-2,
};
const OFF: Tolerance = Tolerance {
    atol: 3e-2,
    rtol: 3e-2,
};

#[derive(serde::Deserialize)]
struct HalfManifest {
    models: Vec<HalfModel>,
}

#[derive(serde::Deserialize)]
struct HalfModel {
    file: String,
    source: String,
    cases: Vec<HalfCase>,
}

#[derive(serde::Deserialize)]
struct HalfCase {
    name: String,
    inputs_npz: String,
    outputs_npz: String,
}

fn half_dir() -> std::path::PathBuf {
    models_dir().join("half")
}

fn load(path: &Path) -> ModelProto {
    load_model(path, &Limits::default()).unwrap().model
}

fn npz(path: &Path) -> Vec<NamedTensor> {
    read_npz_tensors(path, 1 << 28).unwrap()
}

/// One run of `model` and what its plan ran.
fn run(
    model: &ModelProto,
    inputs: &[NamedTensor],
    half_as_float: bool,
) -> (Vec<NamedTensor>, OpCounts) {
    let options = SessionOptions {
        half_as_float,
        ..SessionOptions::per_shape()
    };
    let threads = Threads::new(Some(2)).unwrap();
    let s = Session::build_with_options(model, inputs, &threads, "half", &options).unwrap();
    (s.run(inputs).unwrap(), s.op_counts())
}

fn assert_close(
    what: &str,
    a: &[NamedTensor],
    b: &[NamedTensor],
    tol: impl Fn(DatumType) -> Tolerance,
) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        let t = tol(y.tensor.datum_type());
        for d in diff_outputs(std::slice::from_ref(x), std::slice::from_ref(y), t) {
            assert!(
                d.ok,
                "{what}: output '{}': max_abs {:.3e} max_rel {:.3e} ({} elements out of {t:?})",
                d.name, d.max_abs, d.max_rel, d.mismatches
            );
        }
    }
}

/// The outputs have the element types ONNX Runtime gave (the declared ones).
fn assert_types(what: &str, out: &[NamedTensor], ort: &[NamedTensor]) {
    for o in ort {
        let ours = out.iter().find(|x| x.name == o.name).unwrap();
        assert_eq!(
            ours.tensor.datum_type(),
            o.tensor.datum_type(),
            "{what}: '{}'",
            o.name
        );
    }
}

#[test]
fn float16_models_run_in_float32_on_attnrt_kernels_and_agree_with_ort() {
    let text = std::fs::read_to_string(half_dir().join("manifest.json")).unwrap();
    let manifest: HalfManifest = serde_json::from_str(&text).unwrap();
    assert!(manifest.models.len() >= 2);
    for m in &manifest.models {
        let model = load(&half_dir().join(&m.file));
        let fused = attnrt::fuse(&model).unwrap();
        let source = attnrt::fuse(&load(&models_dir().join(&m.source))).unwrap();
        // Every block of the float32 source fuses in its float16 conversion.
        assert_eq!(
            fused.report.blocks.len(),
            source.report.blocks.len(),
            "{}",
            m.file
        );
        assert!(!fused.report.blocks.is_empty(), "{}", m.file);
        for case in &m.cases {
            let what = format!("{} [{}]", m.file, case.name);
            let inputs = npz(&half_dir().join(&case.inputs_npz));
            let ort = npz(&half_dir().join(&case.outputs_npz));
            for half_as_float in [true, false] {
                check(&what, [&fused.model, &model], &inputs, &ort, half_as_float);
            }
            // The same projections as the float32 source file runs (its inputs in float32).
            let (_, f32_counts) = run(&source.model, &widened(&inputs), true);
            let (_, counts) = run(&fused.model, &inputs, true);
            assert_eq!(counts.projection, f32_counts.projection, "{what}");
            assert_eq!(counts.attention, f32_counts.attention, "{what}");
        }
    }
}

/// One mode of the rewrite. On (`half_as_float`): fused == unfused to float32 rounding, both
/// within float16 error of ONNX Runtime, the projections on attnrt's op. Off: float16 as
/// declared, the fused attention taking and giving float16, no projection on attnrt's op (it
/// takes float32 weights only). Both: the attention blocks on attnrt's kernel, the declared
/// output types.
fn check(
    what: &str,
    models: [&ModelProto; 2],
    inputs: &[NamedTensor],
    ort: &[NamedTensor],
    half_as_float: bool,
) {
    let what = format!("{what} half_as_float {half_as_float}");
    let (f, fc) = run(models[0], inputs, half_as_float);
    let (u, uc) = run(models[1], inputs, half_as_float);
    assert_types(&what, &f, ort);
    assert_types(&what, &u, ort);
    let (vs_each_other, vs_ort) = if half_as_float {
        let by_dtype = |dt| {
            if dt == DatumType::F16 {
                ON_FUSED_VS_UNFUSED_F16
            } else {
                ON_FUSED_VS_UNFUSED_F32
            }
        };
        (by_dtype as fn(DatumType) -> Tolerance, ON_VS_ORT)
    } else {
        ((|_| OFF) as fn(DatumType) -> Tolerance, OFF)
    };
    assert_close(&format!("{what}: fused vs unfused"), &f, &u, vs_each_other);
    assert_close(&format!("{what}: fused vs ORT"), &f, ort, |_| vs_ort);
    assert_close(&format!("{what}: unfused vs ORT"), &u, ort, |_| vs_ort);
    assert!(fc.attention > 0, "{what}: fused {fc}");
    assert_eq!(uc.attention, 0, "{what}: unfused {uc}");
    for c in [fc, uc] {
        assert_eq!(c.projection > 0, half_as_float, "{what}: {c}");
    }
}

/// `inputs` with float16 tensors as float32 (the float32 source file's input types).
fn widened(inputs: &[NamedTensor]) -> Vec<NamedTensor> {
    inputs
        .iter()
        .map(|t| {
            let tensor = if t.tensor.datum_type() == DatumType::F16 {
                t.tensor.cast_to_dt(DatumType::F32).unwrap().into_owned()
            } else {
                t.tensor.clone()
            };
            NamedTensor {
                name: t.name.clone(),
                tensor,
            }
        })
        .collect()
}
