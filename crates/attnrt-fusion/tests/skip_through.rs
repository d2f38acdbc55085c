//! Skip-through nodes inside an attention block: `Identity`, `Dropout` in inference mode and a
//! `Cast` to the same type are looked through wherever they stand, and the block fuses into
//! exactly what the plain chain fuses into; a `Dropout` that may run in training mode stops
//! the fusion, and the near miss names it and the check. (Fused = unfused numerically:
//! `tests/tests/skip_through.rs` in the workspace.)

use attnrt_fusion::{fuse, structure_text, Check, Fused, FusionOptions};
use attnrt_testkit::blocks::{skip_block, Skip, SkipAt};

fn fused(skips: &[(SkipAt, Skip)]) -> Fused {
    let m = skip_block(skips);
    attnrt_onnx::validate_model(&m).expect("test graph valid");
    let f = fuse(&m, &FusionOptions::default()).expect("fuse");
    attnrt_onnx::validate_model(&f.model).expect("fused graph valid");
    f
}

/// The block with `skips` fuses into the same graph as the block without them.
fn assert_fuses_like_the_plain_block(skips: &[(SkipAt, Skip)]) -> Fused {
    let plain = fused(&[]);
    let f = fused(skips);
    assert_eq!(
        f.report.blocks.len(),
        1,
        "{skips:?}: {:?}",
        f.report.explain_lines()
    );
    assert_eq!(f.report.blocks[0].layout, "3d", "{skips:?}");
    assert_eq!(
        structure_text(&f.model),
        structure_text(&plain.model),
        "{skips:?}"
    );
    f
}

const PLACES: [SkipAt; 4] = [SkipAt::Q, SkipAt::Scores, SkipAt::Probs, SkipAt::Context];

#[test]
fn identity_anywhere_in_the_block_fuses_exactly() {
    for at in PLACES {
        assert_fuses_like_the_plain_block(&[(at, Skip::Identity)]);
    }
}

#[test]
fn inference_dropout_between_softmax_and_context_fuses_exactly() {
    // training_mode absent (default false), then given as a constant false.
    for mode in [None, Some(false)] {
        let f = assert_fuses_like_the_plain_block(&[(SkipAt::Probs, Skip::Dropout(mode))]);
        let b = &f.report.blocks[0];
        assert!(b.rule.starts_with("attention[dropout,"), "{}", b.rule);
        assert!(b.replaced.contains(&"Dropout_probs_0".to_string()));
    }
}

#[test]
fn same_type_cast_anywhere_in_the_block_fuses_exactly() {
    for at in PLACES {
        assert_fuses_like_the_plain_block(&[(at, Skip::SameTypeCast)]);
    }
}

#[test]
fn a_chain_of_skip_through_nodes_fuses_exactly() {
    // Four nodes between the Softmax and the context MatMul, and some on the scores.
    let chain = [
        (SkipAt::Probs, Skip::Identity),
        (SkipAt::Probs, Skip::Dropout(Some(false))),
        (SkipAt::Probs, Skip::SameTypeCast),
        (SkipAt::Probs, Skip::Identity),
        (SkipAt::Scores, Skip::Dropout(None)),
        (SkipAt::Scores, Skip::Identity),
    ];
    let f = assert_fuses_like_the_plain_block(&chain);
    let rule = &f.report.blocks[0].rule;
    assert!(
        rule.contains("identity-dropout-cast-identity")
            && rule.contains("scores-dropout")
            && rule.contains("scores-identity"),
        "{rule}"
    );
}

/// The block is not fused; its near miss is at `node`, for the skip-through check, and says
/// `why`; so does the `--explain` text.
fn assert_refused_at(skips: &[(SkipAt, Skip)], node: &str, why: &str) {
    let f = fused(skips);
    assert!(f.report.blocks.is_empty(), "{skips:?} fused");
    let [m] = f.report.near_misses.as_slice() else {
        panic!("one near miss expected: {:?}", f.report.near_misses)
    };
    assert_eq!(m.node, node);
    assert_eq!(m.check, Check::SkipThrough);
    assert!(m.found.contains(why), "{}", m.found);
    assert!(
        m.expected.contains("identity at inference"),
        "{}",
        m.expected
    );
    let line = format!("at {node} [skip-through]: ");
    assert!(
        f.report
            .explain_lines()
            .iter()
            .any(|l| l.starts_with("not fused: Softmax_softmax")
                && l.contains(&line)
                && l.contains(why)),
        "{:?}",
        f.report.explain_lines()
    );
}

#[test]
fn training_mode_dropout_is_not_fused_and_explained() {
    let training = Skip::Dropout(Some(true));
    assert_refused_at(
        &[(SkipAt::Probs, training)],
        "Dropout_probs_0",
        "training_mode = true",
    );
    assert_refused_at(
        &[(SkipAt::Scores, training)],
        "Dropout_scores_0",
        "training_mode = true",
    );
    // Behind an inference Dropout, still found.
    assert_refused_at(
        &[(SkipAt::Probs, Skip::Identity), (SkipAt::Probs, training)],
        "Dropout_probs_1",
        "training_mode = true",
    );
}

#[test]
fn dropout_with_a_run_time_mode_is_not_fused_and_explained() {
    assert_refused_at(
        &[(SkipAt::Probs, Skip::DropoutRuntimeMode)],
        "Dropout_probs_0",
        "not a constant known before run time",
    );
}
