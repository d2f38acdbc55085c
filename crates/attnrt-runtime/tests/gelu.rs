//! `Gelu` (both forms) runs on attnrt's op split over threads (`SessionOptions::attnrt_ops`) and
//! gives tract's values bit for bit, whatever the split (on tract-linalg's kernels, unless
//! `ATTNRT_KERNEL_ISA` lowers the ISA: then within rounding); after a projection whose kernels
//! have an activation epilogue (AVX-512) it runs in the projection's epilogue: the erf form with
//! the op's bits, the tanh form within 1e-6.

use attnrt_kernels::StandaloneAct;
use attnrt_onnx::attr::make_string;
use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{
    model, node, node_with_attrs, seeded_values, tensor_f32, tensor_i64_1d, value_info,
    GraphBuilder,
};

fn gelu_model(dims: &[i64], approximate: &str) -> ModelProto {
    let mut g = GraphBuilder::new("gelu");
    g.input(value_info("x", DataType::Float, dims));
    g.node(node_with_attrs(
        "/mlp/act/Gelu",
        "Gelu",
        &["x"],
        &["y"],
        vec![make_string("approximate", approximate)],
    ));
    g.output(value_info("y", DataType::Float, dims));
    model(g.finish(), 20)
}

fn session(
    m: &ModelProto,
    x: &NamedTensor,
    attnrt_ops: bool,
    threads: usize,
) -> anyhow::Result<Session> {
    let threads = Threads::new(Some(threads))?;
    Session::build_with_options(
        m,
        std::slice::from_ref(x),
        &threads,
        "gelu.onnx",
        &SessionOptions {
            attnrt_ops,
            ..SessionOptions::per_shape()
        },
    )
}

#[test]
fn both_forms_give_tracts_values_on_one_and_two_threads() {
    for dims in [[1usize, 3, 5], [2, 200, 384]] {
        let n = dims.iter().product();
        // wide enough to reach both tails of erf and tanh
        let values: Vec<f32> = seeded_values(n, 3).iter().map(|v| 8.0 * v).collect();
        let x = NamedTensor {
            name: "x".into(),
            tensor: Tensor::from_shape(&dims, &values).unwrap(),
        };
        let dims_i64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        for approximate in ["none", "tanh"] {
            let m = gelu_model(&dims_i64, approximate);
            let tract = session(&m, &x, false, 2).unwrap();
            let want = tract.run(std::slice::from_ref(&x)).unwrap();
            let want = want[0].tensor.to_plain_array_view::<f32>().unwrap();
            for threads in [1, 2] {
                let s = session(&m, &x, true, threads).unwrap();
                assert!(
                    s.op_names().iter().any(|o| o == "AttnrtGelu"),
                    "{:?}",
                    s.op_names()
                );
                let got = s.run(std::slice::from_ref(&x)).unwrap();
                let got = got[0].tensor.to_plain_array_view::<f32>().unwrap();
                assert_eq!(got.shape(), want.shape());
                let tracts = s.kernels().standalone_act() == StandaloneAct::Caller;
                for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    let close = (g - w).abs() <= 1e-5 * (1.0 + w.abs());
                    assert!(
                        g.to_bits() == w.to_bits() || !tracts && close,
                        "{approximate} {dims:?} threads {threads}: y[{i}] = {g}, tract {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn an_unknown_approximation_names_the_node() {
    let m = gelu_model(&[4], "erf");
    let x = NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&[4], &[0.0f32, 1.0, 2.0, 3.0]).unwrap(),
    };
    let err = format!("{:#}", session(&m, &x, true, 1).expect_err("an error"));
    assert!(err.contains("/mlp/act/Gelu"), "{err}");
    assert!(err.contains("approximate"), "{err}");
}

/// `y = Gelu(x · W + b)` for `x: [1, 300, 96]`, `W: [96, 200]` (two token blocks, a last panel
/// 8 features wide); with `h_output` the Gelu's input `h` is a model output too. With `conv1d`,
/// as GPT-2's `Conv1D` exports: `x` reshaped to 2-D, a `Gemm`, `h` the `Gemm`'s result reshaped
/// back to 3-D.
fn projection_gelu_model(approximate: &str, h_output: bool, conv1d: bool) -> ModelProto {
    let (k, n) = (96usize, 200usize);
    let mut g = GraphBuilder::new("mlp");
    g.input(value_info("x", DataType::Float, &[1i64, 300, k as i64]));
    let w: Vec<f32> = seeded_values(k * n, 7).iter().map(|v| v * 0.3).collect();
    g.initializer(tensor_f32("w", &[k as i64, n as i64], &w));
    g.initializer(tensor_f32("b", &[n as i64], &seeded_values(n, 8)));
    if conv1d {
        g.initializer(tensor_i64_1d("rows", &[-1, k as i64]));
        g.initializer(tensor_i64_1d("back", &[1, 300, n as i64]));
        g.node(node(
            "/mlp/c_fc/Reshape",
            "Reshape",
            &["x", "rows"],
            &["x2"],
        ));
        g.node(node("/mlp/c_fc/Gemm", "Gemm", &["x2", "w", "b"], &["h2"]));
        g.node(node(
            "/mlp/c_fc/Reshape_1",
            "Reshape",
            &["h2", "back"],
            &["h"],
        ));
    } else {
        g.node(node("/mlp/fc/MatMul", "MatMul", &["x", "w"], &["xw"]));
        g.node(node("/mlp/fc/Add", "Add", &["xw", "b"], &["h"]));
    }
    g.node(node_with_attrs(
        "/mlp/act/Gelu",
        "Gelu",
        &["h"],
        &["y"],
        vec![make_string("approximate", approximate)],
    ));
    g.output(value_info("y", DataType::Float, &[1i64, 300, n as i64]));
    if h_output {
        g.output(value_info("h", DataType::Float, &[1i64, 300, n as i64]));
    }
    model(g.finish(), 20)
}

#[test]
fn a_gelu_after_a_projection_runs_in_its_epilogue() {
    let values: Vec<f32> = seeded_values(300 * 96, 9).iter().map(|v| 2.0 * v).collect();
    let x = NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&[1, 300, 96], &values).unwrap(),
    };
    let y_of = |s: &Session| {
        let out = s.run(std::slice::from_ref(&x)).unwrap();
        let y = out[0].tensor.to_plain_array_view::<f32>().unwrap();
        y.iter().copied().collect::<Vec<_>>()
    };
    for (approximate, conv1d) in [
        ("none", false),
        ("tanh", false),
        ("none", true),
        ("tanh", true),
    ] {
        let tract = session(
            &projection_gelu_model(approximate, false, conv1d),
            &x,
            false,
            2,
        );
        let want = y_of(&tract.unwrap());
        for threads in [1, 2] {
            let folded = projection_gelu_model(approximate, false, conv1d);
            let folded = session(&folded, &x, true, threads).unwrap();
            let names = folded.op_names();
            let epilogue = folded.kernels().projection().epilogue();
            assert_eq!(
                !names.iter().any(|o| o == "AttnrtGelu"),
                epilogue,
                "{approximate} conv1d {conv1d}: folded into the projection iff it has an \
                 epilogue: {names:?}"
            );
            // `h` is a model output: the Gelu stays an op of its own.
            let alone = projection_gelu_model(approximate, true, conv1d);
            let alone = session(&alone, &x, true, threads).unwrap();
            assert!(alone.op_names().iter().any(|o| o == "AttnrtGelu"));
            let (got, op) = (y_of(&folded), y_of(&alone));
            for (i, ((g, o), w)) in got.iter().zip(&op).zip(&want).enumerate() {
                // The tanh form is attnrt's own approximation: compared with tract's below.
                if approximate == "none" {
                    assert_eq!(g.to_bits(), o.to_bits(), "erf: y[{i}] {g} vs the op's {o}");
                }
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{approximate}: y[{i}] = {g}, tract {w}"
                );
            }
        }
    }
}
