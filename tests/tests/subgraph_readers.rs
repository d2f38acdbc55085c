//! A tensor of the main graph read by name inside an `If` branch (not among the `If`'s inputs)
//! is read outside any block the fusion matches: fusion refuses a candidate whose internal value
//! such a branch reads, with the reader named in `--explain`, as it does for an internal value
//! another node of the graph reads; or it keeps the value alive (the fused node's
//! `qk_matmul_output`, a 4-D fused node producing the context, or a node or initializer that
//! dead-code removal leaves in place). Either way the emitted model is valid, passes the ONNX
//! checker and gives the unfused model's outputs, in attnrt (`harness::compare`, both values of
//! the condition) and in ONNX Runtime.
//!
//! A fused graph that lost the value a branch reads is not valid ("node Neg_then_branch reads
//! tensor 'softmax_out', which no node, input or initializer produces"): the whole model would
//! fail to fuse.
//!
//! Tolerance: |fused − unfused| ≤ 2e-5 + 1e-4·|unfused|, as for the shipped models.

use attnrt::harness::{compare, write_npz, CompareOptions, Tolerance, ToleranceChoice};
use attnrt_fusion::{fuse, Fused, FusionOptions};
use attnrt_onnx::proto::attribute_proto::AttributeType;
use attnrt_onnx::{attr, save_model, AttributeProto, DataType, ModelProto, SaveOptions};
use attnrt_runtime::{NamedTensor, Tensor, Threads};
use attnrt_testkit::blocks::{skip_block, Skip, SkipAt, D_MODEL, HEAD_SIZE};
use attnrt_testkit::gelu::{gelu_model, GeluForm, Product};
use attnrt_testkit::{node, node_with_attrs, seeded_values, tensor_f32, value_info, GraphBuilder};
use attnrt_tests::ort_check;

const FUSED_VS_UNFUSED: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};

/// The shape of the block's scores and probabilities.
const SCORES: [&str; 4] = ["B", "4", "L", "L"];
/// The shape of the block's heads (Q, the context).
const HEADS: [&str; 4] = ["B", "4", "L", "8"];

/// How `If_branch` names its reader in messages.
const READER: &str = "Neg_then_branch (in then_branch of If_branch)";

/// `model` with a graph input `cond: bool[1]` and `branch_out = If(cond)`, whose then branch is
/// `Neg(read)` and else branch `Identity(read)`: both read `read` (a float tensor of shape
/// `dims`) by name alone.
fn with_branch_reader(model: ModelProto, read: &str, dims: &[&str]) -> ModelProto {
    with_typed_branch_reader(model, read, DataType::Float, dims)
}

/// [`with_branch_reader`] of a tensor of type `ty`.
fn with_typed_branch_reader(
    mut model: ModelProto,
    read: &str,
    ty: DataType,
    dims: &[&str],
) -> ModelProto {
    let branch = |name: &str, op: &str| {
        let mut b = GraphBuilder::new(name);
        let out = format!("{name}_out");
        b.node(node(&format!("{op}_{name}"), op, &[read], &[&out]));
        b.output(value_info(&out, ty, dims));
        AttributeProto {
            name: name.into(),
            r#type: AttributeType::Graph as i32,
            g: Some(b.finish()),
            ..Default::default()
        }
    };
    let g = model.graph.as_mut().unwrap();
    g.input.push(value_info("cond", DataType::Bool, &[1]));
    g.node.push(node_with_attrs(
        "If_branch",
        "If",
        &["cond"],
        &["branch_out"],
        vec![
            branch("then_branch", "Neg"),
            branch("else_branch", "Identity"),
        ],
    ));
    g.output.push(value_info("branch_out", ty, dims));
    model
}

/// The testkit's attention block (with `skips`), its scale `sqrt_d` made by a `Constant`
/// node rather than an initializer (so that dead-code removal after the splice has a node to
/// remove).
fn block(skips: &[(SkipAt, Skip)]) -> ModelProto {
    let mut m = skip_block(skips);
    let g = m.graph.as_mut().unwrap();
    g.initializer.retain(|t| t.name != "sqrt_d");
    let sqrt_d = (HEAD_SIZE as f32).sqrt();
    g.node.insert(
        0,
        node_with_attrs(
            "Constant_sqrt_d",
            "Constant",
            &[],
            &["sqrt_d"],
            vec![attr::make_tensor("value", tensor_f32("", &[], &[sqrt_d]))],
        ),
    );
    m
}

/// `model` (valid) fused.
fn fused(model: &ModelProto) -> Fused {
    attnrt_onnx::validate_model(model).expect("test model valid");
    fuse(model, &FusionOptions::default()).expect("fuse")
}

/// The explain lines of `f`, one string.
fn explain(f: &Fused) -> String {
    f.report.explain_lines().join("\n")
}

/// Whether the model's graph has a node producing `t`, or an initializer `t`.
fn defines(model: &ModelProto, t: &str) -> bool {
    let g = model.graph.as_ref().unwrap();
    g.node.iter().any(|n| n.output.iter().any(|o| o == t))
        || g.initializer.iter().any(|i| i.name == t)
}

/// `x: [2, 5, 32]` seeded, and `cond`.
fn inputs(cond: bool) -> Vec<NamedTensor> {
    let shape = [2, 5, D_MODEL as usize];
    let n = shape.iter().product();
    vec![
        NamedTensor {
            name: "x".into(),
            tensor: Tensor::from_shape(&shape, &seeded_values(n, 7)).unwrap(),
        },
        NamedTensor {
            name: "cond".into(),
            tensor: Tensor::from_shape(&[1], &[cond]).unwrap(),
        },
    ]
}

/// The fused model of `model` gives its outputs in attnrt, with either branch taken, and in
/// ONNX Runtime, after the ONNX checker (full check).
fn assert_same_outputs(model: &ModelProto, what: &str) {
    let threads = Threads::new(None).unwrap();
    let options = CompareOptions {
        tolerance: ToleranceChoice::Fixed(FUSED_VS_UNFUSED),
        ..CompareOptions::default()
    };
    for cond in [true, false] {
        let c = compare(model, what, &inputs(cond), None, &threads, &options)
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert_eq!(c.blocks(), 1, "{what}: not fused");
        assert_eq!(c.fused.as_ref().unwrap().ops.attention, 1, "{what}");
        let diffs = c.diffs.as_ref().expect("fused vs unfused");
        assert_eq!(diffs.len(), 2, "{what}: y and branch_out");
        assert!(c.ok(), "{what} (cond {cond}): {:?}", c.failures());
    }
    let dir = tempfile::tempdir().unwrap();
    let (original, emitted, npz) = (
        dir.path().join("block.onnx"),
        dir.path().join("block.fused.onnx"),
        dir.path().join("inputs.npz"),
    );
    save_model(model, &original, &SaveOptions::default()).unwrap();
    save_model(&fused(model).model, &emitted, &SaveOptions::default()).unwrap();
    write_npz(&npz, &inputs(true)).unwrap();
    if let Err(e) = ort_check(&original, &emitted, &npz, 2e-5, 1e-4) {
        panic!("{what}: {e}");
    }
}

#[test]
fn an_internal_value_a_branch_reads_is_refused_with_the_reader_named() {
    // The unscaled product (the Div follows it): no qk_matmul_output stage.
    let f = fused(&with_branch_reader(block(&[]), "qk_out", &SCORES));
    assert!(f.report.blocks.is_empty(), "{}", explain(&f));
    let why = explain(&f);
    assert!(
        why.contains("intermediate 'qk_out' is also used outside the block")
            && why.contains(&format!("(read by {READER})")),
        "{why}"
    );
    // An Identity between the Softmax and the context product: neither a stage nor the output.
    let probs = [(SkipAt::Probs, Skip::Identity)];
    let f = fused(&with_branch_reader(block(&probs), "probs_0_out", &SCORES));
    assert!(f.report.blocks.is_empty(), "{}", explain(&f));
    let why = explain(&f);
    assert!(
        why.contains(&format!(
            "[exclusive]: intermediate 'probs_0_out' is also used by {READER}"
        )),
        "{why}"
    );
}

#[test]
fn a_probability_a_branch_reads_becomes_the_qk_matmul_output() {
    let model = with_branch_reader(block(&[]), "softmax_out", &SCORES);
    let f = fused(&model);
    assert!(
        f.report.blocks[0].rule.contains("qk_matmul_output=3"),
        "{}",
        explain(&f)
    );
    assert_same_outputs(&model, "probabilities read by a branch");
}

#[test]
fn a_context_a_branch_reads_keeps_the_4d_fused_node() {
    let model = with_branch_reader(block(&[]), "context_out", &HEADS);
    let f = fused(&model);
    let rule = &f.report.blocks[0].rule;
    assert!(
        rule.contains("4d (context has several consumers)"),
        "{rule}"
    );
    assert_same_outputs(&model, "context read by a branch");
}

#[test]
fn what_dead_code_removal_would_drop_stays_when_a_branch_reads_it() {
    // The scale's Constant node, the head split's shape initializer and Q's head split: the
    // fused node reads the projections, so all three are left without a graph reader.
    let reads: [(&str, DataType, &[&str]); 3] = [
        ("sqrt_d", DataType::Float, &[]),
        ("split_q", DataType::Int64, &["4"]),
        ("heads_q_out", DataType::Float, &HEADS),
    ];
    for (read, ty, dims) in reads {
        let plain = fused(&block(&[]));
        assert!(
            !defines(&plain.model, read),
            "{read}: not removed without a reader"
        );
        let model = with_typed_branch_reader(block(&[]), read, ty, dims);
        let f = fused(&model);
        assert!(f.report.blocks[0].rule.contains("3d"), "{}", explain(&f));
        assert!(defines(&f.model, read), "{read}: removed");
        assert_same_outputs(&model, &format!("'{read}' read by a branch"));
    }
}

#[test]
fn a_gelu_intermediate_a_branch_reads_is_refused_with_the_reader_named() {
    let model = with_branch_reader(
        gelu_model(GeluForm::ErfDiv, Product::HalfLast, false, 16),
        "t",
        &["B", "L", "16"],
    );
    let f = fused(&model);
    assert!(f.report.activations.is_empty(), "{}", explain(&f));
    let why = explain(&f);
    assert!(
        why.contains("'t' is read by ") && why.contains(READER),
        "{why}"
    );
}
