//! Blocks with skip-through nodes inside (`Identity`, `Dropout` in inference mode, `Cast` to
//! the same type): fused into one `Attention` node, they give the unfused graph's outputs on
//! tract, with the fused node on attnrt's kernel. (The structure of the fused graph is checked
//! in `crates/attnrt-fusion/tests/skip_through.rs`.)
//!
//! Tolerance: |fused − unfused| ≤ 2e-5 + 1e-4·|unfused|, as for the shipped models
//! (`tests/models.rs`): the kernel reassociates the softmax sums and the dot products.

use attnrt::harness::{diff_outputs, Tolerance};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_runtime::{run_once, NamedTensor, Tensor, Threads};
use attnrt_testkit::blocks::{skip_block, Skip, SkipAt, D_MODEL};
use attnrt_testkit::seeded_values;

const FUSED_VS_UNFUSED: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};

/// `x` of shape [2, 5, 32], seeded.
fn input() -> Vec<NamedTensor> {
    let shape = [2, 5, D_MODEL as usize];
    let n = shape.iter().product();
    vec![NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&shape, &seeded_values(n, 7)).unwrap(),
    }]
}

#[test]
fn blocks_with_skip_through_nodes_fuse_and_match_the_unfused_graph() {
    let cases: Vec<Vec<(SkipAt, Skip)>> = vec![
        vec![(SkipAt::Probs, Skip::Identity)],
        vec![
            (SkipAt::Scores, Skip::Identity),
            (SkipAt::Context, Skip::Identity),
        ],
        vec![(SkipAt::Probs, Skip::Dropout(None))],
        vec![(SkipAt::Probs, Skip::Dropout(Some(false)))],
        vec![
            (SkipAt::Scores, Skip::SameTypeCast),
            (SkipAt::Q, Skip::SameTypeCast),
        ],
        vec![
            (SkipAt::Probs, Skip::Identity),
            (SkipAt::Probs, Skip::Dropout(Some(false))),
            (SkipAt::Probs, Skip::SameTypeCast),
        ],
    ];
    let threads = Threads::new(None).unwrap();
    let inputs = input();
    for skips in cases {
        let what = format!("{skips:?}");
        let model = skip_block(&skips);
        let fused = fuse(&model, &FusionOptions::default()).unwrap();
        assert_eq!(fused.report.blocks.len(), 1, "{what}: not fused");
        let unfused = run_once(&model, &inputs, &threads, &what)
            .unwrap_or_else(|e| panic!("{what}: unfused run: {e:#}"));
        let out = run_once(&fused.model, &inputs, &threads, &what)
            .unwrap_or_else(|e| panic!("{what}: fused run: {e:#}"));
        assert_eq!(
            out.ops.attention, 1,
            "{what}: the fused node runs on the kernel"
        );
        for d in diff_outputs(&out.outputs, &unfused.outputs, FUSED_VS_UNFUSED) {
            println!("{what}: '{}' max_abs {:.2e}", d.name, d.max_abs);
            assert!(
                d.ok,
                "{what}: output '{}' differs: max_abs {:.3e} max_rel {:.3e}",
                d.name, d.max_abs, d.max_rel
            );
        }
    }
}
