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

/// The GPT-2 decoder with 7-bit int8 weights (`models/quantize.py`), the prompt `ids` at
/// positions `0..` and an empty cache.
fn prompt(ids: &[i64]) -> Vec<NamedTensor> {
    let t = |name: &str, tensor: Tensor| NamedTensor {
        name: name.into(),
        tensor,
    };
    let len = ids.len();
    let positions: Vec<i64> = (0..len as i64).collect();
    let mut inputs = vec![
        t("input_ids", Tensor::from_shape(&[1, len], ids).unwrap()),
        t(
            "attention_mask",
            Tensor::from_shape(&[1, len], &vec![1i64; len]).unwrap(),
        ),
        t(
            "position_ids",
            Tensor::from_shape(&[1, len], &positions).unwrap(),
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

fn run(ids: &[i64], tolerance: ToleranceChoice) -> attnrt::harness::Comparison {
    let path = models_dir().join("gpt2_cache_eager.ts.qint8rr.onnx");
    let model = load_model(&path, &Limits::default()).unwrap().model;
    let options = CompareOptions {
        tolerance,
        ..CompareOptions::default()
    };
    let threads = Threads::new(Some(1)).unwrap();
    compare(
        &model,
        "gpt2 qint8rr",
        &prompt(ids),
        None,
        &threads,
        &options,
    )
    .unwrap()
}

/// How many prompts [`flipping_prompt`] tries.
const CANDIDATES: usize = 48;

/// Tokens of each seeded prompt [`flipping_prompt`] tries (longer prompts widen the ranges the
/// quantizations take, so a range moved by an ulp is likelier).
const CANDIDATE_LEN: usize = 64;

/// A prompt whose fused and unfused raw outputs differ beyond float32 tolerance, with its
/// comparison. Which prompts flip a step depends on the CPU's rounding (the fused `Gelu` and
/// attention round a few ulps off tract's chains, on whichever SIMD path each takes: a prompt of
/// five tokens moves the logits by 3e-2 on an AVX2 machine and not at all on an AVX-512 one,
/// where about one seeded prompt of 64 tokens in eight flips a step), so that prompt is tried
/// first, then seeded ones, and the first that flips is taken.
fn flipping_prompt() -> (Vec<i64>, attnrt::harness::Comparison) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut ids = vec![3i64, 14, 15, 92, 65];
    for _ in 0..CANDIDATES {
        let cmp = run(&ids, ToleranceChoice::ByDtype);
        if cmp.diffs.as_ref().unwrap().iter().any(|d| !d.ok) {
            return (ids, cmp);
        }
        ids = (0..CANDIDATE_LEN)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % 100) as i64
            })
            .collect();
    }
    panic!("none of {CANDIDATES} prompts flips an int8 step: the pinning path is not exercised");
}

#[test]
fn a_flipped_int8_step_is_pinned_and_the_paths_agree() {
    let (_, cmp) = flipping_prompt();
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
    let (ids, _) = flipping_prompt();
    let cmp = run(&ids, ToleranceChoice::Fixed(exact));
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
