//! A decoder layer with a key/value cache, fused with its cache joins taken over by the fused
//! node (`past_*` in, `present_*` out): on tract with the fused node on attnrt's kernel it
//! gives the unfused graph's outputs (the context and both presents), for a prefill (empty
//! past) and decode steps; ONNX Runtime gives the same outputs for the emitted model as for
//! the original. (The structure is checked in `crates/attnrt-fusion/tests/kv_cache.rs`.)
//!
//! Tolerance: |fused − unfused| ≤ 2e-5 + 1e-4·|unfused|, as for the shipped models
//! (`tests/models.rs`): the kernel reassociates the softmax sums and the dot products.

use attnrt::harness::{diff_outputs, write_npz, Tolerance};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_onnx::{save_model, ModelProto, SaveOptions};
use attnrt_runtime::{run_once, NamedTensor, Tensor, Threads};
use attnrt_testkit::cache_block::{cache_block, CacheMask, D_MODEL, HEADS, HEAD_SIZE};
use attnrt_testkit::seeded_values;
use attnrt_tests::ort_check;

const FUSED_VS_UNFUSED: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};

/// (past, new) lengths: a prefill, then decode steps of 3 and 1 tokens.
const STEPS: [(usize, usize); 3] = [(0, 4), (5, 3), (7, 1)];
const BATCH: usize = 2;

const MASKS: [CacheMask; 7] = [
    CacheMask::None,
    CacheMask::CausalFromPresentShape,
    CacheMask::WindowFromRepeatShape,
    CacheMask::WindowFromPresentShape,
    CacheMask::TopLeftFromPresentShape,
    CacheMask::PaddingBias,
    CacheMask::FromPresentValues,
];

fn tensor(name: &str, shape: &[usize], seed: u32) -> NamedTensor {
    let n = shape.iter().product();
    NamedTensor {
        name: name.into(),
        tensor: Tensor::from_shape(shape, &seeded_values(n, seed)).unwrap(),
    }
}

/// The inputs of one step; the padding bias hides the first past key of the second batch.
fn inputs(mask: CacheMask, past: usize, new: usize) -> Vec<NamedTensor> {
    let cache = [BATCH, HEADS as usize, past, HEAD_SIZE as usize];
    let mut v = vec![
        tensor("x", &[BATCH, new, D_MODEL as usize], 11),
        tensor("past_key", &cache, 12),
        tensor("past_value", &cache, 13),
    ];
    if mask == CacheMask::PaddingBias {
        let mut bias = vec![0f32; BATCH * past];
        if past > 0 {
            bias[past] = f32::MIN;
        }
        v.push(NamedTensor {
            name: "past_bias".into(),
            tensor: Tensor::from_shape(&[BATCH, 1, 1, past], &bias).unwrap(),
        });
        v.push(NamedTensor {
            name: "new_bias".into(),
            tensor: Tensor::from_shape(&[BATCH, 1, 1, new], &vec![0f32; BATCH * new]).unwrap(),
        });
    }
    v
}

fn fused_model(mask: CacheMask) -> (ModelProto, ModelProto) {
    let model = cache_block(mask);
    let fused = fuse(&model, &FusionOptions::default()).unwrap();
    assert_eq!(fused.report.blocks.len(), 1, "{mask:?}: not fused");
    (model, fused.model)
}

#[test]
fn cache_layers_fuse_and_match_the_unfused_graph_at_every_step() {
    let threads = Threads::new(None).unwrap();
    for mask in MASKS {
        let (model, fused) = fused_model(mask);
        for (past, new) in STEPS {
            let what = format!("{mask:?} past {past} new {new}");
            let inputs = inputs(mask, past, new);
            let unfused = run_once(&model, &inputs, &threads, &what)
                .unwrap_or_else(|e| panic!("{what}: unfused run: {e:#}"));
            let out = run_once(&fused, &inputs, &threads, &what)
                .unwrap_or_else(|e| panic!("{what}: fused run: {e:#}"));
            assert_eq!(
                out.ops.attention, 1,
                "{what}: the fused node runs on the kernel"
            );
            let diffs = diff_outputs(&out.outputs, &unfused.outputs, FUSED_VS_UNFUSED);
            assert_eq!(diffs.len(), 3, "{what}: y and both presents compared");
            for d in diffs {
                assert!(
                    d.ok,
                    "{what}: output '{}' differs: max_abs {:.3e} max_rel {:.3e}",
                    d.name, d.max_abs, d.max_rel
                );
            }
        }
    }
}

#[test]
fn emitted_cache_layers_run_in_onnx_runtime_with_the_original_outputs() {
    let dir = tempfile::tempdir().unwrap();
    for mask in MASKS {
        let (model, fused) = fused_model(mask);
        let original = dir.path().join(format!("{mask:?}.onnx"));
        let emitted = dir.path().join(format!("{mask:?}.fused.onnx"));
        save_model(&model, &original, &SaveOptions::default()).unwrap();
        save_model(&fused, &emitted, &SaveOptions::default()).unwrap();
        for (past, new) in STEPS {
            let npz = dir.path().join(format!("{mask:?}_{past}_{new}.npz"));
            write_npz(&npz, &inputs(mask, past, new)).unwrap();
            if let Err(e) = ort_check(&original, &emitted, &npz, 1e-4, 1e-3) {
                panic!("{mask:?} past {past} new {new}: {e}");
            }
        }
    }
}
