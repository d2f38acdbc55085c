//! Issue 28, the memory budget through the `attnrt` binary: inputs and runs that would need
//! more memory than `--max-memory` (default: a share of the memory available) are refused
//! before anything is allocated for them, with one `error:` line naming the tensor and the
//! size, instead of the process being killed. The models with huge dims are built here and
//! never allocated: the refusal comes from shapes alone.

mod common;

use common::{attnrt, model};

use std::path::PathBuf;
use std::process::Output;

use ::attnrt::onnx::DataType;
use ::attnrt::{Message, ModelProto};
use attnrt_testkit::{model as onnx_model, node, node_with_attrs, value_info, GraphBuilder};

/// Exit code 1 and exactly one stderr line, `error: ...`, holding every needle.
fn refused(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one stderr line: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for n in needles {
        assert!(lines[0].contains(n), "stderr should mention {n:?}: {err}");
    }
}

fn write(dir: &tempfile::TempDir, name: &str, m: &ModelProto) -> String {
    let path: PathBuf = dir.path().join(name);
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    path.display().to_string()
}

/// `y = xᵀ · x` with x `[1, 1048576]` float32 fixed: 4 MiB in, a 4 TiB outer product out (the
/// output's shape is left to inference, so that loading does not refuse it first).
fn outer_product() -> ModelProto {
    let mut g = GraphBuilder::new("outer");
    g.input(value_info("x", DataType::Float, &[1i64, 1 << 20]));
    g.node(node_with_attrs(
        "transpose",
        "Transpose",
        &["x"],
        &["xt"],
        vec![::attnrt::onnx::attr::make_ints("perm", &[1, 0])],
    ));
    g.node(node("outer", "MatMul", &["xt", "x"], &["y"]));
    g.output(value_info("y", DataType::Float, &["rows", "cols"]));
    onnx_model(g.finish(), 17)
}

/// `y = Cast(x)` with x `[1048576, 1048576]` int64 fixed (8 TiB).
fn huge_input() -> ModelProto {
    let mut g = GraphBuilder::new("huge");
    g.input(value_info(
        "input_ids",
        DataType::Int64,
        &[1i64 << 20, 1 << 20],
    ));
    g.node(node_with_attrs(
        "cast",
        "Cast",
        &["input_ids"],
        &["y"],
        vec![::attnrt::onnx::attr::make_int("to", DataType::Float as i64)],
    ));
    g.output(value_info("y", DataType::Float, &["rows", "cols"]));
    onnx_model(g.finish(), 17)
}

#[test]
fn an_intermediate_over_the_default_budget_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(&dir, "outer.onnx", &outer_product());
    refused(
        &attnrt(&["run", &m, "--threads", "1"]),
        &[
            "outer.onnx: planning for input shapes",
            "node 'outer' output 'y' [1048576, 1048576] float32 needs 4.0 TiB, over the memory budget of",
            "available; raise it with --max-memory",
        ],
    );
    refused(
        &attnrt(&["bench", &m, "--threads", "1", "--max-memory", "64G"]),
        &[
            "[1048576, 1048576] float32 needs 4.0 TiB",
            "64.0 GiB (--max-memory)",
        ],
    );
}

/// `y = Conv(x, w)` with x `[1, 1, 4, 4]`, a 2×2 kernel and `2^28` columns of padding on the
/// left: a 3 GiB output, and tract's optimization of such a convolution allocates in proportion
/// to it (a mutated ViT with a pad of 2^31 was killed at 4 GiB of address space while planning).
fn padded_conv() -> ModelProto {
    let mut g = GraphBuilder::new("conv");
    g.input(value_info("x", DataType::Float, &[1i64, 1, 4, 4]));
    g.initializer(attnrt_testkit::tensor_f32("w", &[1, 1, 2, 2], &[1.0; 4]));
    g.node(node_with_attrs(
        "conv",
        "Conv",
        &["x", "w"],
        &["y"],
        vec![::attnrt::onnx::attr::make_ints("pads", &[0, 1 << 28, 0, 0])],
    ));
    g.output(value_info("y", DataType::Float, &["n", "c", "h", "w"]));
    onnx_model(g.finish(), 17)
}

#[test]
fn a_value_over_the_budget_is_refused_before_tract_optimizes() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(&dir, "conv.onnx", &padded_conv());
    refused(
        &attnrt(&["run", &m, "--threads", "1", "--max-memory", "64M"]),
        &[
            "conv.onnx: planning for input shapes F32[1,1,4,4]",
            "node 'conv' output 'y' [1, 1, 3, 268435459] float32 needs 3.0 GiB",
            "64.0 MiB (--max-memory)",
        ],
    );
}

#[test]
fn a_huge_fixed_input_is_refused_from_its_shape_alone() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(&dir, "huge.onnx", &huge_input());
    // Within the default element limit it would be 2^40 elements: refused at load.
    refused(
        &attnrt(&["run", &m]),
        &["'input_ids'", "[1048576, 1048576]", "over the limit"],
    );
    // Past that limit, the budget refuses it before the random values are made.
    let raised = ["--max-tensor-elements", "1099511627776"];
    let args = [&["run", m.as_str()][..], &raised[..]].concat();
    refused(
        &attnrt(&args),
        &["input 'input_ids' [1048576, 1048576] int64 needs 8.0 TiB, over the memory budget of"],
    );
}

#[test]
fn max_memory_on_a_shipped_model_names_the_input_or_the_node() {
    let m = model("mha_seed.ts.onnx");
    refused(
        &attnrt(&["run", &m, "--max-memory", "1K"]),
        &["input 'x' [1, 16, 64] float32 needs 4.0 KiB, over the memory budget of 1.0 KiB (--max-memory)"],
    );
    // The input fits; the tensors the run keeps alive at once do not.
    refused(
        &attnrt(&["run", &m, "--max-memory", "8K", "--threads", "1"]),
        &[
            "mha_seed.ts.onnx: the run at node '",
            "inputs and intermediates alive at once",
            "over the memory budget of 8.0 KiB (--max-memory)",
        ],
    );
    // Each input fits, both together do not (two int64 [1, 16]).
    refused(
        &attnrt(&["run", &model("bert_eager.ts.onnx"), "--max-memory", "200"]),
        &[
            "the sum of the inputs ('input_ids', 'attention_mask') needs 256 B, over the memory \
           budget of 200 B (--max-memory)",
        ],
    );
    let o = attnrt(&["run", &m, "--max-memory", "1M", "--threads", "1"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = attnrt(&["run", &m, "--max-memory", "lots"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a size that is no size is a usage error"
    );
}

#[test]
fn generate_honours_the_budget_too() {
    let m = model("gpt2_cache_eager.ts.onnx");
    let o = attnrt(&["generate", &m, "--max-memory", "4K", "--threads", "1"]);
    refused(
        &o,
        &[
            "step 0 failed after 0 generated token(s)",
            "over the memory budget of 4.0 KiB",
        ],
    );
}
