//! `MatMul` and `Gemm` by a constant weight run on attnrt's projection op
//! (`SessionOptions::attnrt_ops`), every other `MatMul`/`Gemm` on tract's, and both give the same
//! numbers.

use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{
    model, node, node_with_attrs, seeded_values as values, tensor_f32, value_info, GraphBuilder,
};

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
    attnrt_ops: bool,
) -> (Vec<f32>, Vec<usize>, Vec<String>) {
    let threads = Threads::new(Some(2)).unwrap();
    let s = Session::build_with_options(
        m,
        inputs,
        &threads,
        "mm.onnx",
        &SessionOptions {
            attnrt_ops,
            ..SessionOptions::per_shape()
        },
    )
    .unwrap();
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
    let (a, a_shape, a_ops) = run(m, inputs, true);
    let (t, t_shape, t_ops) = run(m, inputs, false);
    assert_eq!(a_shape, t_shape);
    let uses = a_ops.iter().any(|o| o == "AttnrtProjection");
    assert_eq!(uses, expect_projection, "ops with attnrt_ops: {a_ops:?}");
    assert!(
        !t_ops.iter().any(|o| o == "AttnrtProjection"),
        "ops without attnrt_ops: {t_ops:?}"
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
    let (a, _, _) = run(&m, &[input("x", &[1, 9, 12], 3)], true);
    let (t, _, _) = run(&m, &[input("x", &[1, 9, 12], 3)], false);
    assert_eq!(a.len(), 45);
    for (x, y) in a.iter().zip(&t) {
        assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs());
    }
}

/// How `Gemm`'s `C` is given in [`gemm_model`].
#[derive(Clone, Copy, Debug)]
enum GemmC {
    None,
    /// An initializer of these dims.
    Const(&'static [i64]),
    /// A graph input `c` of these dims.
    Input(&'static [i64]),
}

/// `y = Gemm(x, w, C)` with x: `[m, k]` (`[k, m]` when `trans_a`), w: `[k, n]` (`[n, k]` when
/// `trans_b`).
fn gemm_model(
    m: i64,
    k: i64,
    n: i64,
    flags: (bool, bool),
    alpha: f32,
    beta: f32,
    c: GemmC,
) -> ModelProto {
    let (trans_a, trans_b) = flags;
    let mut g = GraphBuilder::new("gemm");
    let x_dims = if trans_a { [k, m] } else { [m, k] };
    g.input(value_info("x", DataType::Float, &x_dims));
    let w_dims = if trans_b { [n, k] } else { [k, n] };
    g.initializer(tensor_f32("w", &w_dims, &values((k * n) as usize, 7)));
    let mut inputs = vec!["x", "w"];
    match c {
        GemmC::None => {}
        GemmC::Const(dims) => {
            let len = dims.iter().product::<i64>() as usize;
            g.initializer(tensor_f32("c", dims, &values(len, 11)));
            inputs.push("c");
        }
        GemmC::Input(dims) => {
            g.input(value_info("c", DataType::Float, dims));
            inputs.push("c");
        }
    }
    g.node(node_with_attrs(
        "gemm",
        "Gemm",
        &inputs,
        &["y"],
        vec![
            attnrt_onnx::attr::make_float("alpha", alpha),
            attnrt_onnx::attr::make_float("beta", beta),
            attnrt_onnx::attr::make_int("transA", trans_a as i64),
            attnrt_onnx::attr::make_int("transB", trans_b as i64),
        ],
    ));
    g.output(value_info("y", DataType::Float, &["?"; 0]));
    model(g.finish(), 13)
}

fn gemm_inputs(m: usize, k: usize, trans_a: bool, c: GemmC) -> Vec<NamedTensor> {
    let x_shape = if trans_a { [k, m] } else { [m, k] };
    let mut v = vec![input("x", &x_shape, 1)];
    if let GemmC::Input(dims) = c {
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        v.push(input("c", &shape, 5));
    }
    v
}

#[test]
fn gemm_with_a_constant_weight_runs_on_the_projection_op_and_agrees_with_tract() {
    let (m, k, n) = (37, 48, 20);
    // (transB, alpha, beta, C): nn.Linear / Conv1D forms, scales, and every row-broadcast C.
    for (trans_b, alpha, beta, c) in [
        (true, 1.0, 1.0, GemmC::Const(&[20])),
        (false, 1.0, 1.0, GemmC::Const(&[20])),
        (false, 0.5, 2.0, GemmC::Const(&[1, 20])),
        (true, 1.0, -1.5, GemmC::Const(&[1])),
        (false, 2.0, 1.0, GemmC::Const(&[])),
        (true, 1.0, 1.0, GemmC::Const(&[1, 1])),
        (false, 1.0, 1.0, GemmC::None),
        // beta = 0: C is ignored, whatever it is.
        (true, 1.0, 0.0, GemmC::Input(&[37, 20])),
    ] {
        let model = gemm_model(m, k, n, (false, trans_b), alpha, beta, c);
        let inputs = gemm_inputs(m as usize, k as usize, false, c);
        check(&model, &inputs, true);
    }
}

#[test]
fn other_gemms_stay_on_tract_and_agree() {
    let (m, k, n) = (9, 16, 12);
    for (trans_a, trans_b, c) in [
        // Aᵀ.
        (true, false, GemmC::Const(&[12])),
        (true, true, GemmC::None),
        // A C that varies along rows, constant or not.
        (false, true, GemmC::Const(&[9, 12])),
        (false, false, GemmC::Const(&[9, 1])),
        (false, false, GemmC::Input(&[12])),
    ] {
        let model = gemm_model(m, k, n, (trans_a, trans_b), 0.75, 1.25, c);
        let inputs = gemm_inputs(m as usize, k as usize, trans_a, c);
        check(&model, &inputs, false);
    }
}

/// `y = x · w + b` (`b` an initializer of `b_dims`, or a graph input), and optionally a second
/// consumer of `x · w` (`z = Relu(x · w)`, also an output).
fn matmul_add_model(
    x_dims: &[i64],
    n: i64,
    b_dims: Option<&[i64]>,
    bias_first: bool,
    shared: bool,
) -> ModelProto {
    let mut g = GraphBuilder::new("mm_add");
    g.input(value_info("x", DataType::Float, x_dims));
    let k = x_dims[x_dims.len() - 1];
    g.initializer(tensor_f32("w", &[k, n], &values((k * n) as usize, 7)));
    match b_dims {
        Some(dims) => {
            let len = dims.iter().product::<i64>() as usize;
            g.initializer(tensor_f32("b", dims, &values(len, 13)));
        }
        None => {
            g.input(value_info("b", DataType::Float, &[n]));
        }
    }
    g.node(node("mm", "MatMul", &["x", "w"], &["xw"]));
    let add_inputs = if bias_first { ["b", "xw"] } else { ["xw", "b"] };
    g.node(node("add", "Add", &add_inputs, &["y"]));
    g.output(value_info("y", DataType::Float, &["?"; 0]));
    if shared {
        g.node(node("relu", "Relu", &["xw"], &["z"]));
        g.output(value_info("z", DataType::Float, &["?"; 0]));
    }
    model(g.finish(), 17)
}

#[test]
fn a_constant_bias_add_folds_into_the_projection_only_when_exact() {
    let x = [2i64, 37, 48];
    let xs = [2usize, 37, 48];
    // (bias dims or graph input, bias first, second consumer, folded)
    let cases: [(Option<&[i64]>, bool, bool, bool); 11] = [
        (Some(&[20]), false, false, true),
        (Some(&[20]), true, false, true),
        (Some(&[1, 1, 20]), false, false, true),
        // One value for every element: also a row.
        (Some(&[]), false, false, true),
        (Some(&[1]), true, false, true),
        (Some(&[1, 1, 1]), false, false, true),
        // Varies along rows, or widens the output: kept as an Add.
        (Some(&[37, 20]), false, false, false),
        (Some(&[3, 1, 1, 20]), false, false, false),
        (Some(&[1, 1, 1, 1]), false, false, false),
        // Not a constant; or `x · w` is needed without the bias too.
        (None, false, false, false),
        (Some(&[20]), false, true, false),
    ];
    for (b_dims, bias_first, shared, folded) in cases {
        let m = matmul_add_model(&x, 20, b_dims, bias_first, shared);
        let mut inputs = vec![input("x", &xs, 1)];
        if b_dims.is_none() {
            inputs.push(input("b", &[20], 4));
        }
        let (a, a_shape, a_ops) = run(&m, &inputs, true);
        let (t, t_shape, _) = run(&m, &inputs, false);
        let what = format!("bias {b_dims:?} first={bias_first} shared={shared}");
        assert_eq!(a_shape, t_shape, "{what}");
        assert!(
            a_ops.iter().any(|o| o == "AttnrtProjection"),
            "{what}: {a_ops:?}"
        );
        // tract runs an unfolded bias as `Add` (or its optimized `Opt*Add*` forms), or attnrt's
        // broadcast op where tract's would broadcast generically (`[37, 20]` over 2 rows).
        let adds = a_ops
            .iter()
            .filter(|o| o.contains("Add") || *o == attnrt_runtime::broadcast_binary::OP_NAME)
            .count();
        assert_eq!(adds == 0, folded, "{what}: ops {a_ops:?}");
        for (i, (p, q)) in a.iter().zip(&t).enumerate() {
            assert!(
                (p - q).abs() <= 1e-5 + 1e-5 * q.abs(),
                "{what}: y[{i}] attnrt {p}, tract {q}"
            );
        }
    }
}
