//! GELU fused into one ONNX `Gelu` gives the unfused graph's outputs on tract (the tanh form
//! on tract's vectorised kernel, the erf form on its expansion), for inputs across the range
//! where the activation bends (|x| ≤ 6); ONNX Runtime gives the same outputs for the emitted
//! model as for the original. (The structure is checked in `crates/attnrt-fusion/tests/gelu.rs`.)
//!
//! Tolerance: |fused − unfused| ≤ 2e-5 + 1e-4·|unfused|, as for attention: the fused op
//! evaluates the same formula with its own rounding (x·x·x for `Pow(x, 3)`, a polynomial
//! tanh).

use attnrt::harness::{diff_outputs, write_npz, Tolerance};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::{save_model, SaveOptions};
use attnrt_runtime::{run_once, NamedTensor, Tensor, Threads};
use attnrt_testkit::gelu::{gelu_model, GeluForm, Product};
use attnrt_tests::ort_check;

const FUSED_VS_UNFUSED: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};

const CASES: [(GeluForm, Product); 4] = [
    (GeluForm::Tanh { cubic: 0.044715 }, Product::HalfFirst),
    (GeluForm::Tanh { cubic: 0.044715 }, Product::HalfLast),
    (GeluForm::ErfDiv, Product::HalfLast),
    (GeluForm::ErfMul, Product::HalfInside),
];

/// `x: [2, 96, 16]` evenly over [-6, 6].
fn input() -> Vec<NamedTensor> {
    let n = 2 * 96 * 16;
    let x: Vec<f32> = (0..n)
        .map(|i| -6.0 + 12.0 * i as f32 / (n - 1) as f32)
        .collect();
    vec![NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&[2, 96, 16], &x).unwrap(),
    }]
}

#[test]
fn fused_gelu_matches_the_unfused_graph() {
    let threads = Threads::new(None).unwrap();
    let inputs = input();
    for (form, product) in CASES {
        let what = format!("{form:?} {product:?}");
        let model = gelu_model(form, product, false, 16);
        let fused = fuse(&model, &FusionOptions::default()).unwrap();
        assert_eq!(fused.report.activations.len(), 1, "{what}: not fused");
        let unfused = run_once(&model, &inputs, &threads, &what).unwrap();
        let out = run_once(&fused.model, &inputs, &threads, &what).unwrap();
        for d in diff_outputs(&out.outputs, &unfused.outputs, FUSED_VS_UNFUSED) {
            println!(
                "{what}: max_abs {:.2e} max_rel {:.2e}",
                d.max_abs, d.max_rel
            );
            assert!(
                d.ok,
                "{what}: max_abs {:.3e} max_rel {:.3e}",
                d.max_abs, d.max_rel
            );
        }
    }
}

#[test]
fn emitted_gelu_runs_in_onnx_runtime_with_the_original_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let npz = dir.path().join("x.npz");
    write_npz(&npz, &input()).unwrap();
    for (i, (form, product)) in CASES.into_iter().enumerate() {
        let model = gelu_model(form, product, false, 16);
        let fused = fuse(&model, &FusionOptions::default()).unwrap();
        let (original, emitted) = (
            dir.path().join(format!("{i}.onnx")),
            dir.path().join(format!("{i}.fused.onnx")),
        );
        save_model(&model, &original, &SaveOptions::default()).unwrap();
        save_model(&fused.model, &emitted, &SaveOptions::default()).unwrap();
        if let Err(e) = ort_check(&original, &emitted, &npz, 2e-5, 1e-4) {
            panic!("{form:?} {product:?}: {e}");
        }
    }
}
