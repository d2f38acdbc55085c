//! `MatMul` by a constant weight runs on attnrt's projection op (`Backend::Attnrt`), every other
//! `MatMul` on tract's, and both backends give the same numbers.

use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{Backend, NamedTensor, Session, Tensor, Threads};
use attnrt_testkit::{model, node, tensor_f32, value_info, GraphBuilder};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8;
            (h % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn input(name: &str, shape: &[usize], seed: u32) -> NamedTensor {
    let n = shape.iter().product();
    NamedTensor {
        name: name.into(),
        tensor: Tensor::from_shape(shape, &values(n, seed)).unwrap(),
    }
}

/// y = x · w (+ the other forms below) for x: `x_dims`.
fn matmul_model(x_dims: &[i64], w: Option<&[i64]>, transpose_w: bool) -> ModelProto {
    let mut g = GraphBuilder::new("mm");
    g.input(value_info("x", DataType::Float, x_dims));
    let b = match w {
        Some(dims) => {
            let n = dims.iter().product::<i64>() as usize;
            g.initializer(tensor_f32("w", dims, &values(n, 7)));
            if transpose_w {
                g.node(attnrt_testkit::node_with_attrs(
                    "t",
                    "Transpose",
                    &["w"],
                    &["wt"],
                    vec![attnrt_onnx::attr::make_ints("perm", &[1, 0])],
                ));
                "wt"
            } else {
                "w"
            }
        }
        None => {
            g.input(value_info(
                "b",
                DataType::Float,
                &[x_dims[x_dims.len() - 1], 3],
            ));
            "b"
        }
    };
    g.node(node("mm", "MatMul", &["x", b], &["y"]));
    g.output(value_info("y", DataType::Float, &["?"; 0]));
    model(g.finish(), 17)
}

fn run(
    m: &ModelProto,
    inputs: &[NamedTensor],
    backend: Backend,
) -> (Vec<f32>, Vec<usize>, Vec<String>) {
    let threads = Threads::new(Some(2)).unwrap();
    let s = Session::build_with(m, inputs, &threads, "mm.onnx", backend).unwrap();
    let out = s.run(inputs).unwrap();
    let t = &out[0].tensor;
    let v = t
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .copied()
        .collect();
    (v, t.shape().to_vec(), s.op_names())
}

fn check(m: &ModelProto, inputs: &[NamedTensor], expect_projection: bool) {
    let (a, a_shape, a_ops) = run(m, inputs, Backend::Attnrt);
    let (t, t_shape, t_ops) = run(m, inputs, Backend::Tract);
    assert_eq!(a_shape, t_shape);
    let uses = a_ops.iter().any(|o| o == "AttnrtProjection");
    assert_eq!(uses, expect_projection, "attnrt backend ops: {a_ops:?}");
    assert!(
        !t_ops.iter().any(|o| o == "AttnrtProjection"),
        "tract backend ops: {t_ops:?}"
    );
    for (i, (x, y)) in a.iter().zip(&t).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 + 1e-5 * y.abs(),
            "y[{i}]: attnrt {x}, tract {y}"
        );
    }
}

#[test]
fn constant_weights_run_on_the_projection_op_and_agree_with_tract() {
    // 3-D activations (what the exporters write for nn.Linear), odd sizes, and a 2-D one.
    for (dims, w) in [
        (vec![2i64, 37, 48], vec![48i64, 80]),
        (vec![1, 300, 64], vec![64, 192]),
        (vec![5, 3], vec![3, 1]),
        (vec![2, 3, 4, 16], vec![16, 8]),
    ] {
        let m = matmul_model(&dims, Some(&w), false);
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        check(&m, &[input("x", &shape, 1)], true);
    }
}

#[test]
fn other_matmuls_stay_on_tract() {
    // B is a graph input, not a constant.
    let m = matmul_model(&[2, 4, 6], None, false);
    check(
        &m,
        &[input("x", &[2, 4, 6], 1), input("b", &[6, 3], 2)],
        false,
    );
    // A rank-1 activation: tract's vector-matrix form.
    let m = matmul_model(&[6], Some(&[6, 4]), false);
    check(&m, &[input("x", &[6], 1)], false);
    // A batched (3-D) constant weight.
    let m = matmul_model(&[2, 4, 6], Some(&[2, 6, 3]), false);
    check(&m, &[input("x", &[2, 4, 6], 1)], false);
}

#[test]
fn a_transposed_constant_weight_gives_the_same_numbers() {
    // The weight is computed (Transpose of an initializer): whichever op runs it, the answer
    // must be tract's.
    let m = matmul_model(&[1, 9, 12], Some(&[5, 12]), true);
    let (a, _, _) = run(&m, &[input("x", &[1, 9, 12], 3)], Backend::Attnrt);
    let (t, _, _) = run(&m, &[input("x", &[1, 9, 12], 3)], Backend::Tract);
    assert_eq!(a.len(), 45);
    for (x, y) in a.iter().zip(&t) {
        assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs());
    }
}
