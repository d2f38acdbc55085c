//! Fused vs unfused on a dynamically quantized model, where a rounding difference of a few ulps
//! before a `DynamicQuantizeLinear` flips an int8 step (`attnrt_runtime::quant_pins`): the raw
//! outputs differ beyond float32 tolerance; with the unfused run's activation quantizations
//! pinned, the fused path gives the unfused outputs within it, every projection's input within
//! it of the unfused one. Pinning does not hide a real difference: with a zero tolerance the
//! inputs of the projections after the fused ops are not within it, and the comparison fails.

use attnrt::harness::{compare, CompareOptions, Tolerance, ToleranceChoice};
use attnrt_onnx::{load_model, Limits};
use attnrt_runtime::{NamedTensor, Tensor, Threads};
use attnrt_tests::models_dir;

/// The GPT-2 decoder with 7-bit int8 weights (`models/quantize.py`), a prompt of five tokens
/// and an empty cache: the fused `Gelu` rounds the first layer's feed-forward activations a few
/// ulps off tract's chain, which moves the range of the next quantization by an ulp and flips
/// steps downstream (the logits move by 3e-2 on an AVX2 machine).
fn prompt() -> Vec<NamedTensor> {
    let t = |name: &str, tensor: Tensor| NamedTensor {
        name: name.into(),
        tensor,
    };
    let ids = [3i64, 14, 15, 92, 65];
    let mut inputs = vec![
        t("input_ids", Tensor::from_shape(&[1, 5], &ids).unwrap()),
        t(
            "attention_mask",
            Tensor::from_shape(&[1, 5], &[1i64; 5]).unwrap(),
        ),
        t(
            "position_ids",
            Tensor::from_shape(&[1, 5], &[0i64, 1, 2, 3, 4]).unwrap(),
        ),
    ];
    for layer in 0..2 {
        for kv in ["key", "value"] {
            let empty = Tensor::from_shape::<f32>(&[1, 4, 0, 16], &[]).unwrap();
            inputs.push(t(&format!("past_key_values.{layer}.{kv}"), empty));
        }
    }
    inputs
}

fn run(tolerance: ToleranceChoice) -> attnrt::harness::Comparison {
    let path = models_dir().join("gpt2_cache_eager.ts.qint8rr.onnx");
    let model = load_model(&path, &Limits::default()).unwrap().model;
    let options = CompareOptions {
        tolerance,
        ..CompareOptions::default()
    };
    let threads = Threads::new(Some(1)).unwrap();
    compare(&model, "gpt2 qint8rr", &prompt(), None, &threads, &options).unwrap()
}

#[test]
fn a_flipped_int8_step_is_pinned_and_the_paths_agree() {
    let cmp = run(ToleranceChoice::ByDtype);
    let raw = cmp.diffs.as_ref().unwrap();
    assert!(
        raw.iter().any(|d| !d.ok),
        "the raw outputs differ beyond float32 tolerance (if not, pick a prompt that flips a step): {raw:?}"
    );
    let pinned = cmp
        .pinned
        .as_ref()
        .expect("the fused path ran again, pinned");
    assert_eq!(pinned.pins.projections, 9, "{:?}", pinned.pins);
    assert_eq!(pinned.pins.pinned, 9, "{:?}", pinned.pins);
    assert!(pinned.pins.input_max_abs < 1e-5, "{:?}", pinned.pins);
    assert!(pinned.ok(), "{:?}", pinned.diffs);
    assert!(cmp.ok(), "{:?}", cmp.failures());
}

#[test]
fn pinning_takes_only_inputs_within_the_tolerance() {
    let exact = Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };
    let cmp = run(ToleranceChoice::Fixed(exact));
    let pinned = cmp
        .pinned
        .as_ref()
        .expect("the fused path ran again, pinned");
    assert!(!pinned.pins.diverged.is_empty(), "{:?}", pinned.pins);
    assert!(pinned.pins.pinned < pinned.pins.projections);
    assert!(!cmp.ok());
    assert!(
        cmp.failures()
            .iter()
            .any(|f| f.starts_with("quantized projection ")),
        "{:?}",
        cmp.failures()
    );
}
