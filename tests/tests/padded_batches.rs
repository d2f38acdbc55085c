//! Left-padded batches through every shipped decoder with a cache (both exporters, eager and
//! SDPA): the prompt step of a batch whose first row is padded on the left, then a decode step
//! on its cache. The padded query rows of the prompt see no key (every key is masked for them),
//! which is where a fused op most easily differs from the graph: transformers fills masked
//! scores with `finfo(float32).min`, so such a row averages V over all keys in the graph. The
//! fused model must give the unfused graph's outputs on every row, padding rows included, with
//! every block fused.
//!
//! Tolerance: |fused − unfused| ≤ 2e-5 + 1e-4·|unfused|, as for the shipped models
//! (`tests/models.rs`). PyTorch is not the reference here: on fully masked rows its eager and
//! SDPA paths and ONNX Runtime disagree by design (models/export.py, `decoder_feeds`).

use attnrt::harness::{compare, CompareOptions, Tolerance};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::{load_model, Limits};
use attnrt_runtime::{declared_inputs, DeclaredDim, DeclaredInput, NamedTensor, Tensor, Threads};
use attnrt_tests::{expected_fused, manifest, models_dir};

const FUSED_VS_UNFUSED: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};

/// Prompt lengths of the batch's rows (the first is padded on the left to the second's).
const PROMPTS: [usize; 2] = [3, 7];

/// `attention_mask` of a left-padded batch: `[B, total]`, zeros before each row's prompt
/// (whose tokens, and those generated after it, are ones).
fn padding_mask(total: usize) -> Vec<i64> {
    let longest = PROMPTS.iter().max().copied().unwrap_or(0);
    PROMPTS
        .iter()
        .flat_map(|&p| (0..total).map(move |j| i64::from(j + p >= longest)))
        .collect()
}

/// position_ids as transformers' generate() derives them: cumsum(mask) − 1, 1 where masked;
/// the last `new` columns.
fn positions(mask: &[i64], total: usize, new: usize) -> Vec<i64> {
    mask.chunks(total)
        .flat_map(|row| {
            let mut seen = 0;
            let all: Vec<i64> = row
                .iter()
                .map(|&m| {
                    seen += m;
                    if m == 0 {
                        1
                    } else {
                        seen - 1
                    }
                })
                .collect();
            all[total - new..].to_vec()
        })
        .collect()
}

fn fixed(d: &DeclaredDim) -> Option<usize> {
    match d {
        DeclaredDim::Fixed(n) => Some(*n),
        DeclaredDim::Symbol(_) => None,
    }
}

/// A seeded float tensor of `shape` (values in [-1, 1)).
fn floats(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    Tensor::from_shape(shape, &data).unwrap()
}

/// The feeds of one step: `new` tokens after `past` cached positions (`past` taken from
/// `cache` when given: the presents of the previous step).
fn feeds(
    inputs: &[DeclaredInput],
    past: usize,
    new: usize,
    cache: Option<&[NamedTensor]>,
) -> Vec<NamedTensor> {
    let batch = PROMPTS.len();
    let total = past + new;
    let mask = padding_mask(total);
    let mut out = Vec::new();
    for (i, d) in inputs.iter().enumerate() {
        let tensor = match d.name.as_str() {
            "input_ids" => {
                let ids: Vec<i64> = (0..batch * new).map(|t| (t * 7 % 50 + 3) as i64).collect();
                Tensor::from_shape(&[batch, new], &ids).unwrap()
            }
            "attention_mask" => Tensor::from_shape(&[batch, total], &mask).unwrap(),
            "position_ids" => {
                Tensor::from_shape(&[batch, new], &positions(&mask, total, new)).unwrap()
            }
            name => {
                let present = name.replace("past_key_values", "present");
                match cache.and_then(|c| c.iter().find(|t| t.name == present)) {
                    Some(t) => t.tensor.clone(),
                    None => {
                        let heads = fixed(&d.dims[1]).expect("fixed kv heads");
                        let head = fixed(&d.dims[3]).expect("fixed head size");
                        floats(&[batch, heads, past, head], 100 + i as u64)
                    }
                }
            }
        };
        out.push(NamedTensor {
            name: d.name.clone(),
            tensor,
        });
    }
    out
}

#[test]
fn left_padded_batches_match_the_unfused_graph_on_every_row() {
    let threads = Threads::new(None).unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    let models = manifest().unwrap();
    let expected = expected_fused(&models).unwrap();
    for m in &models {
        // Decoders with a cache whose attention is decomposed (the opset-23 exports already
        // have Attention ops: nothing to fuse).
        let want = m.expected_fused(&expected);
        if !m.file.contains("_cache_") || want == 0 {
            continue;
        }
        let model = load_model(&models_dir().join(&m.file), &Limits::default())
            .unwrap()
            .model;
        let fused = fuse(&model, &FusionOptions::default()).unwrap();
        if fused.report.blocks.len() != want {
            failures.push(format!(
                "{}: {} of {want} blocks fused",
                m.file,
                fused.report.blocks.len(),
            ));
        }
        let inputs = declared_inputs(&model).unwrap();
        let options = CompareOptions {
            tolerance: FUSED_VS_UNFUSED.into(),
            ..CompareOptions::default()
        };
        let longest = PROMPTS.iter().max().copied().unwrap_or(0);
        let prompt = feeds(&inputs, 0, longest, None);
        let what = format!("{} [left-padded prompt]", m.file);
        let cmp = compare(&model, &what, &prompt, None, &threads, &options).unwrap();
        let cache = cmp.unfused.as_ref().map(|u| u.outputs.clone());
        let step = feeds(&inputs, longest, 1, cache.as_deref());
        let what_step = format!("{} [decode after a left-padded prompt]", m.file);
        let cmp_step = compare(&model, &what_step, &step, None, &threads, &options).unwrap();
        for (what, c) in [(what, cmp), (what_step, cmp_step)] {
            checked += 1;
            if c.fused.is_none() {
                failures.push(format!("{what}: the fused path did not run"));
            }
            for d in c.diffs.unwrap_or_default().iter().filter(|d| !d.ok) {
                failures.push(format!(
                    "{what}: output '{}' max_abs {:.3e} max_rel {:.3e}",
                    d.name, d.max_abs, d.max_rel
                ));
            }
        }
    }
    assert!(checked >= 8, "only {checked} decoder steps checked");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
