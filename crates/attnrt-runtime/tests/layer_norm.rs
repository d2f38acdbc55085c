//! `LayerNormalization` runs on attnrt's row op (`SessionOptions::attnrt_ops`) where that is
//! exact, on tract's expansion otherwise, and both give the same numbers.

use attnrt_onnx::attr::{make_float, make_int};
use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{model, node_with_attrs, seeded_values, tensor_f32, value_info, GraphBuilder};

/// What the test model's `LayerNormalization` node gets.
struct Case {
    x: &'static [usize],
    axis: i64,
    /// dims of the scale initializer
    scale: &'static [i64],
    /// dims of the bias initializer, or no bias input
    bias: Option<&'static [i64]>,
    /// whether the node also asks for its `Mean` output
    mean_output: bool,
}

fn layer_norm_model(c: &Case) -> ModelProto {
    let mut g = GraphBuilder::new("ln");
    let dims: Vec<i64> = c.x.iter().map(|&d| d as i64).collect();
    g.input(value_info("x", DataType::Float, &dims));
    let count = |d: &[i64]| d.iter().product::<i64>() as usize;
    g.initializer(tensor_f32(
        "scale",
        c.scale,
        &seeded_values(count(c.scale), 5),
    ));
    let mut inputs = vec!["x", "scale"];
    if let Some(b) = c.bias {
        g.initializer(tensor_f32("bias", b, &seeded_values(count(b), 6)));
        inputs.push("bias");
    }
    let mut outputs = vec!["y"];
    if c.mean_output {
        outputs.push("mean");
    }
    g.node(node_with_attrs(
        "/encoder/LayerNorm",
        "LayerNormalization",
        &inputs,
        &outputs,
        vec![make_int("axis", c.axis), make_float("epsilon", 1e-5)],
    ));
    g.output(value_info("y", DataType::Float, &dims));
    if c.mean_output {
        g.output(value_info("mean", DataType::Float, &["?"; 0]));
    }
    model(g.finish(), 17)
}

/// `y` and the planned op names, on attnrt's ops or (`attnrt_ops` false) tract's.
fn run(
    m: &ModelProto,
    x: &NamedTensor,
    attnrt_ops: bool,
    threads: usize,
) -> (Vec<f32>, Vec<String>) {
    let threads = Threads::new(Some(threads)).unwrap();
    let inputs = std::slice::from_ref(x);
    let s = Session::build_with_options(
        m,
        inputs,
        &threads,
        "ln.onnx",
        &SessionOptions {
            attnrt_ops,
            ..SessionOptions::per_shape()
        },
    )
    .unwrap();
    let out = s.run(inputs).unwrap();
    let y = out[0].tensor.to_plain_array_view::<f32>().unwrap();
    assert_eq!(y.shape(), x.tensor.shape());
    (y.iter().copied().collect(), s.op_names())
}

fn check(c: &Case, native: bool) {
    let m = layer_norm_model(c);
    let n = c.x.iter().product();
    // an offset mean, as activations after a residual add have
    let values: Vec<f32> = seeded_values(n, 1).iter().map(|v| 4.0 * v + 3.0).collect();
    let x = NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(c.x, &values).unwrap(),
    };
    let (want, tract_ops) = run(&m, &x, false, 2);
    assert!(!tract_ops.iter().any(|o| o == "AttnrtLayerNorm"));
    for threads in [1, 2] {
        let (got, ops) = run(&m, &x, true, threads);
        let uses = ops.iter().any(|o| o == "AttnrtLayerNorm");
        assert_eq!(uses, native, "x {:?} axis {}: ops {ops:?}", c.x, c.axis);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                "x {:?} axis {} threads {threads}: y[{i}] = {g}, tract {w}",
                c.x,
                c.axis
            );
        }
    }
}

#[test]
fn last_axis_normalizations_run_as_one_op_and_agree_with_tract() {
    for (x, scale) in [
        (&[2usize, 5, 48][..], &[48i64][..]),
        (&[1, 7, 33], &[1, 33]),
    ] {
        for bias in [None, Some(scale)] {
            let case = Case {
                x,
                axis: -1,
                scale,
                bias,
                mean_output: false,
            };
            check(&case, true);
        }
    }
}

#[test]
fn large_inputs_split_over_threads_give_the_same_numbers() {
    let case = Case {
        x: &[3, 100, 384],
        axis: 2,
        scale: &[384],
        bias: Some(&[384]),
        mean_output: false,
    };
    check(&case, true);
}

#[test]
fn normalizing_several_trailing_axes_is_one_row_per_leading_index() {
    let case = Case {
        x: &[2, 3, 8],
        axis: 1,
        scale: &[3, 8],
        bias: Some(&[3, 8]),
        mean_output: false,
    };
    check(&case, true);
}

#[test]
fn broadcast_scales_and_extra_outputs_stay_on_tract() {
    // A scale of one value broadcast over the row: not the op's layout.
    let case = Case {
        x: &[2, 4, 16],
        axis: -1,
        scale: &[1],
        bias: None,
        mean_output: false,
    };
    check(&case, false);
    // The normalized axes are [4, 16] but the scale covers the last one only.
    let case = Case {
        x: &[2, 4, 16],
        axis: 1,
        scale: &[16],
        bias: None,
        mean_output: false,
    };
    check(&case, false);
    // The Mean output is used.
    let case = Case {
        x: &[2, 4, 16],
        axis: -1,
        scale: &[16],
        bias: Some(&[16]),
        mean_output: true,
    };
    check(&case, false);
}

/// [`layer_norm_model`] with X's and Y's shapes left out of the file, so that only the planned
/// graph knows X's rank (the load-time checks cannot judge the axis).
fn model_without_shapes(c: &Case) -> ModelProto {
    use attnrt_onnx::proto::type_proto;
    let mut m = layer_norm_model(c);
    let g = m.graph.as_mut().unwrap();
    for v in g.input.iter_mut().chain(g.output.iter_mut()) {
        if let Some(type_proto::Value::TensorType(t)) =
            v.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            t.shape = None;
        }
    }
    m
}

#[test]
fn an_axis_outside_the_rank_is_an_error_naming_the_node() {
    // 2^40 and i64::MIN once sent tract's shape rules into a loop that did not end; 3 (past a
    // rank of 3) ran, normalizing over nothing.
    for axis in [3, -4, 1 << 40, i64::MIN] {
        let case = Case {
            x: &[2, 3, 4],
            axis,
            scale: &[4],
            bias: None,
            mean_output: false,
        };
        let m = model_without_shapes(&case);
        let x = NamedTensor {
            name: "x".into(),
            tensor: Tensor::from_shape(&[2, 3, 4], &seeded_values(24, 1)).unwrap(),
        };
        let threads = Threads::new(Some(1)).unwrap();
        // attnrt's ops on and off (`--matmul tract`: tract's expansion, the same check first)
        for attnrt_ops in [true, false] {
            let options = SessionOptions {
                attnrt_ops,
                ..SessionOptions::per_shape()
            };
            let built = Session::build_with_options(
                &m,
                std::slice::from_ref(&x),
                &threads,
                "ln.onnx",
                &options,
            );
            let Err(err) = built else {
                panic!("axis {axis}: an axis outside the rank plans");
            };
            let err = format!("{err:#}");
            assert!(err.contains("/encoder/LayerNorm"), "axis {axis}: {err}");
            assert!(
                err.contains(&format!("axis {axis} is outside [-3, 3)")),
                "axis {axis} (attnrt ops {attnrt_ops}): {err}"
            );
            assert!(!err.contains("panic"), "axis {axis}: {err}");
        }
    }
}
