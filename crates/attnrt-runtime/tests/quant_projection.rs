//! The projections of dynamically quantized graphs (`DynamicQuantizeLinear → MatMulInteger →
//! Cast → Mul`, bias `Add`, as ONNX Runtime's `quantize_dynamic` writes them) run as one
//! `AttnrtQuantProjection` each (`SessionOptions::attnrt_ops`), and give tract's numbers for the
//! unfused graph bit for bit.

use attnrt_onnx::proto::TensorProto;
use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{
    node, node_with_attrs, seeded_values as values, tensor_f32, value_info, GraphBuilder,
};

/// How one quantized projection of [`quantized_model`] is written.
#[derive(Clone, Copy, Debug)]
struct Form {
    /// uint8 weight (else int8).
    unsigned: bool,
    /// A scale per column (else one for the tensor).
    scale_per_column: bool,
    /// The weight's zero point: `None` absent, `Some(false)` per tensor, `Some(true)` per column.
    zero_point: Option<bool>,
    bias: bool,
    /// A `Gelu` after it.
    gelu: bool,
    /// The weight is a graph input with a default (not a constant).
    weight_input: bool,
}

const FORM: Form = Form {
    unsigned: false,
    scale_per_column: true,
    zero_point: Some(true),
    bias: true,
    gelu: false,
    weight_input: false,
};

/// An int8 or uint8 initializer of `dims` with values from `seed` spread over the type's range.
fn tensor_q(name: &str, dims: &[i64], unsigned: bool, seed: u32) -> TensorProto {
    let n = dims.iter().product::<i64>() as usize;
    let raw = values(n, seed)
        .iter()
        .map(|v| {
            if unsigned {
                (v * 127.5 + 127.5) as u8
            } else {
                (v * 127.9) as i8 as u8
            }
        })
        .collect();
    let data_type = if unsigned {
        DataType::Uint8
    } else {
        DataType::Int8
    };
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type as i32,
        raw_data: raw,
        ..Default::default()
    }
}

/// `y_i = projection_i(x)` for each form, all reading one `DynamicQuantizeLinear` of
/// `x: [2, 7, k]`, each `[k, n]`.
fn quantized_model(forms: &[Form], k: i64, n: i64) -> ModelProto {
    let mut g = GraphBuilder::new("q");
    g.input(value_info("x", DataType::Float, &[2, 7, k]));
    g.node(node(
        "dql",
        "DynamicQuantizeLinear",
        &["x"],
        &["xq", "xs", "xz"],
    ));
    for (i, f) in forms.iter().enumerate() {
        let name = |s: &str| format!("{s}{i}");
        let w = g.initializer(tensor_q(&name("w"), &[k, n], f.unsigned, 10 + i as u32));
        if f.weight_input {
            g.input(value_info(
                &w,
                if f.unsigned {
                    DataType::Uint8
                } else {
                    DataType::Int8
                },
                &[k, n],
            ));
        }
        let scale_dims: &[i64] = if f.scale_per_column { &[n] } else { &[] };
        let scales: Vec<f32> = values(n as usize, 20 + i as u32)
            .iter()
            .map(|v| 0.01 + 0.002 * v)
            .collect();
        g.initializer(tensor_f32(
            &name("ws"),
            scale_dims,
            &scales[..if f.scale_per_column { n as usize } else { 1 }],
        ));
        let mut mmi_inputs = vec!["xq".to_string(), w, "xz".to_string()];
        if let Some(per_column) = f.zero_point {
            let dims: &[i64] = if per_column { &[n] } else { &[] };
            mmi_inputs.push(g.initializer(tensor_q(&name("wz"), dims, f.unsigned, 30 + i as u32)));
        }
        let mmi_inputs: Vec<&str> = mmi_inputs.iter().map(String::as_str).collect();
        g.node(node(
            &name("scales"),
            "Mul",
            &["xs", &name("ws")],
            &[&name("s")],
        ));
        g.node(node(
            &name("mmi"),
            "MatMulInteger",
            &mmi_inputs,
            &[&name("acc")],
        ));
        let to = attnrt_onnx::attr::make_int("to", DataType::Float as i64);
        g.node(node_with_attrs(
            &name("cast"),
            "Cast",
            &[&name("acc")],
            &[&name("accf")],
            vec![to],
        ));
        g.node(node(
            &name("mul"),
            "Mul",
            &[&name("accf"), &name("s")],
            &[&name("p")],
        ));
        let mut y = name("p");
        if f.bias {
            g.initializer(tensor_f32(
                &name("b"),
                &[n],
                &values(n as usize, 40 + i as u32),
            ));
            y = g.node(node(&name("add"), "Add", &[&name("b"), &y], &[&name("pb")]));
        }
        if f.gelu {
            y = g.node(node(&name("gelu"), "Gelu", &[&y], &[&name("pg")]));
        }
        g.node(node(&name("id"), "Identity", &[&y], &[&name("y")]));
        g.output(value_info(&name("y"), DataType::Float, &[2, 7, n]));
    }
    g.into_model(20)
}

/// Every output of `m` as `T` values, and the op names of the plan (attnrt's ops on or off).
fn run<T: attnrt_runtime::Datum + Copy>(
    m: &ModelProto,
    inputs: &[NamedTensor],
    attnrt_ops: bool,
) -> (Vec<Vec<T>>, Vec<String>) {
    let threads = Threads::new(Some(2)).unwrap();
    let options = SessionOptions {
        attnrt_ops,
        ..SessionOptions::per_shape()
    };
    let s = Session::build_with_options(m, inputs, &threads, "q.onnx", &options).unwrap();
    let out = s.run(inputs).unwrap();
    let values = out
        .iter()
        .map(|o| {
            o.tensor
                .to_plain_array_view::<T>()
                .unwrap()
                .iter()
                .copied()
                .collect()
        })
        .collect();
    (values, s.op_names())
}

fn x(k: usize, scale: f32) -> Vec<NamedTensor> {
    let v: Vec<f32> = values(2 * 7 * k, 1).iter().map(|v| v * scale).collect();
    vec![NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&[2, 7, k], &v).unwrap(),
    }]
}

/// Runs `forms` both ways; returns the attnrt run's op names and the largest difference.
fn compare(forms: &[Form], k: i64, n: i64, scale: f32) -> (Vec<String>, f32) {
    let m = quantized_model(forms, k, n);
    let inputs = x(k as usize, scale);
    let (a, a_ops) = run::<f32>(&m, &inputs, true);
    let (t, t_ops) = run::<f32>(&m, &inputs, false);
    assert!(
        !t_ops.iter().any(|o| o == "AttnrtQuantProjection"),
        "{t_ops:?}"
    );
    let mut worst = 0f32;
    for (a, t) in a.iter().zip(&t) {
        assert_eq!(a.len(), t.len());
        for (x, y) in a.iter().zip(t) {
            worst = worst.max((x - y).abs() / (1.0 + y.abs()));
        }
    }
    (a_ops, worst)
}

fn count(ops: &[String], name: &str) -> usize {
    ops.iter().filter(|o| *o == name).count()
}

#[test]
fn every_form_of_the_chain_runs_as_one_op_with_tract_s_numbers_bit_for_bit() {
    let variants = [
        FORM,
        Form {
            unsigned: true,
            ..FORM
        },
        Form {
            scale_per_column: false,
            zero_point: Some(false),
            ..FORM
        },
        Form {
            zero_point: None,
            bias: false,
            ..FORM
        },
        Form {
            unsigned: true,
            zero_point: Some(false),
            scale_per_column: false,
            ..FORM
        },
    ];
    // Odd sizes (k odd: the last pair is padded), and the whole set sharing one quantization.
    for (k, n) in [(33, 19), (64, 48)] {
        for v in variants {
            let (ops, worst) = compare(&[v], k, n, 3.0);
            assert_eq!(count(&ops, "AttnrtQuantProjection"), 1, "{v:?}: {ops:?}");
            assert_eq!(worst, 0.0, "{v:?} k{k} n{n}");
        }
        let (ops, worst) = compare(&variants, k, n, 0.5);
        assert_eq!(
            count(&ops, "AttnrtQuantProjection"),
            variants.len(),
            "{ops:?}"
        );
        assert_eq!(worst, 0.0, "all forms k{k} n{n}");
        // Nothing of the chains is left, the quantization included: beside the projections
        // only the input's `Source`.
        assert_eq!(
            ops.len() - count(&ops, "Source"),
            count(&ops, "AttnrtQuantProjection"),
            "{ops:?}"
        );
    }
}

#[test]
fn a_gelu_folds_in_within_float_rounding() {
    let (ops, worst) = compare(&[Form { gelu: true, ..FORM }], 40, 24, 2.0);
    assert_eq!(count(&ops, "AttnrtQuantProjection"), 1, "{ops:?}");
    assert_eq!(
        count(&ops, "AttnrtGelu"),
        0,
        "the Gelu was not folded: {ops:?}"
    );
    assert!(worst <= 1e-6, "{worst}");
}

#[test]
fn a_weight_that_is_a_graph_input_stays_on_tract() {
    let (ops, worst) = compare(
        &[
            Form {
                weight_input: true,
                ..FORM
            },
            FORM,
        ],
        16,
        8,
        1.0,
    );
    assert_eq!(count(&ops, "AttnrtQuantProjection"), 1, "{ops:?}");
    assert_eq!(worst, 0.0);
}

/// `y = MatMulInteger(a, W, a_zp, w_zp)` alone: `a: [3, 5, k]` and its zero point graph inputs
/// of type `a_type` (the zero point `[]`, or `[5]` per row when `per_row`), the weight int8.
fn matmul_integer_model(a_type: DataType, per_row: bool, k: i64, n: i64) -> ModelProto {
    let mut g = GraphBuilder::new("mmi");
    g.input(value_info("a", a_type, &[3, 5, k]));
    let zp_dims: &[i64] = if per_row { &[5] } else { &[] };
    g.input(value_info("az", a_type, zp_dims));
    g.initializer(tensor_q("w", &[k, n], false, 3));
    g.initializer(tensor_q("wz", &[n], false, 4));
    g.node(node(
        "mmi",
        "MatMulInteger",
        &["a", "w", "az", "wz"],
        &["y"],
    ));
    g.output(value_info("y", DataType::Int32, &[3, 5, n]));
    g.into_model(17)
}

#[test]
fn a_matmul_integer_by_a_constant_weight_runs_on_the_integer_kernel_exactly() {
    let (k, n) = (37usize, 21usize);
    for (unsigned, per_row) in [(true, false), (false, false), (true, true)] {
        let a_type = if unsigned {
            DataType::Uint8
        } else {
            DataType::Int8
        };
        let m = matmul_integer_model(a_type, per_row, k as i64, n as i64);
        let raw = values(3 * 5 * k, 9);
        let (a, az) = if unsigned {
            let a: Vec<u8> = raw.iter().map(|v| (v * 127.5 + 127.5) as u8).collect();
            let az: Vec<u8> = (0..if per_row { 5 } else { 1 })
                .map(|i| 100 + 7 * i as u8)
                .collect();
            (
                Tensor::from_shape(&[3, 5, k], &a).unwrap(),
                Tensor::from_shape(if per_row { &[5][..] } else { &[] }, &az).unwrap(),
            )
        } else {
            let a: Vec<i8> = raw.iter().map(|v| (v * 127.9) as i8).collect();
            (
                Tensor::from_shape(&[3, 5, k], &a).unwrap(),
                Tensor::from_shape(&[], &[-3i8]).unwrap(),
            )
        };
        let inputs = vec![
            NamedTensor {
                name: "a".into(),
                tensor: a,
            },
            NamedTensor {
                name: "az".into(),
                tensor: az,
            },
        ];
        let (ours, ops) = run::<i32>(&m, &inputs, true);
        let (tract, tract_ops) = run::<i32>(&m, &inputs, false);
        assert_eq!(ours, tract, "unsigned {unsigned} per_row {per_row}");
        assert!(ours[0].iter().any(|&v| v != 0));
        // A zero point per row of `a` is tract's.
        assert_eq!(
            count(&ops, "AttnrtMatMulInteger"),
            usize::from(!per_row),
            "{ops:?}"
        );
        assert_eq!(count(&tract_ops, "AttnrtMatMulInteger"), 0, "{tract_ops:?}");
    }
}

/// How one projection of [`qdq_model`] is written (QDQ form: `DequantizeLinear` on both sides
/// of a float `MatMul`).
#[derive(Clone, Copy, Debug)]
struct QdqForm {
    /// The weight's type and its scale/zero point layout, as in [`Form`].
    weight: Form,
    /// The `DequantizeLinear`'s axis for the weight (1: per column; 0: per row).
    axis: i64,
    /// The product quantized and dequantized again before the bias (`QuantizeLinear` to int8
    /// when `Some(true)`, uint8 when `Some(false)`), as `quantize_static` writes every `MatMul`.
    requantize: Option<bool>,
    /// That `QuantizeLinear`'s output is read elsewhere too (so the round trip cannot fold).
    quantized_output: bool,
}

const QDQ: QdqForm = QdqForm {
    weight: FORM,
    axis: 1,
    requantize: None,
    quantized_output: false,
};

/// `x: [2, 7, k]` quantized once (`QuantizeLinear` to int8 when `signed`, else uint8, and back
/// with `DequantizeLinear`), then `y_i = DequantizeLinear(x_q) · DequantizeLinear(W_i) [+ b_i]`
/// for each form; with `also_read`, the dequantized `x` also feeds an `Add` output (`z`), as an
/// attention's `MatMul` would read it.
fn qdq_model(forms: &[QdqForm], signed: bool, also_read: bool, k: i64, n: i64) -> ModelProto {
    let mut g = GraphBuilder::new("qdq");
    g.input(value_info("x", DataType::Float, &[2, 7, k]));
    g.initializer(tensor_f32("xs", &[], &[0.021]));
    g.initializer(tensor_q("xz", &[], !signed, 5));
    g.node(node("q", "QuantizeLinear", &["x", "xs", "xz"], &["xq"]));
    g.node(node("dq", "DequantizeLinear", &["xq", "xs", "xz"], &["xd"]));
    if also_read {
        g.node(node("other", "Add", &["xd", "x"], &["z"]));
        g.output(value_info("z", DataType::Float, &[2, 7, k]));
    }
    for (i, f) in forms.iter().enumerate() {
        let name = |s: &str| format!("{s}{i}");
        let w = g.initializer(tensor_q(
            &name("w"),
            &[k, n],
            f.weight.unsigned,
            10 + i as u32,
        ));
        let per_column = f.weight.scale_per_column;
        let scales: Vec<f32> = values(n as usize, 20 + i as u32)
            .iter()
            .map(|v| 0.01 + 0.002 * v)
            .collect();
        let (dims, count): (&[i64], usize) = if per_column {
            (&[n], n as usize)
        } else {
            (&[], 1)
        };
        g.initializer(tensor_f32(&name("ws"), dims, &scales[..count]));
        let mut dq_inputs = vec![w, name("ws")];
        if let Some(per_column) = f.weight.zero_point {
            let dims: &[i64] = if per_column { &[n] } else { &[] };
            let z = tensor_q(&name("wz"), dims, f.weight.unsigned, 30 + i as u32);
            dq_inputs.push(g.initializer(z));
        }
        let dq_inputs: Vec<&str> = dq_inputs.iter().map(String::as_str).collect();
        let axis = attnrt_onnx::attr::make_int("axis", f.axis);
        g.node(node_with_attrs(
            &name("wdq"),
            "DequantizeLinear",
            &dq_inputs,
            &[&name("wd")],
            vec![axis],
        ));
        let mut y = g.node(node(
            &name("mm"),
            "MatMul",
            &["xd", &name("wd")],
            &[&name("p")],
        ));
        if let Some(signed) = f.requantize {
            y = requantize(&mut g, &y, &name("y"), signed, f.quantized_output, n);
        }
        if f.weight.bias {
            g.initializer(tensor_f32(
                &name("b"),
                &[n],
                &values(n as usize, 40 + i as u32),
            ));
            y = g.node(node(&name("add"), "Add", &[&y, &name("b")], &[&name("pb")]));
        }
        g.node(node(&name("id"), "Identity", &[&y], &[&name("y")]));
        g.output(value_info(&name("y"), DataType::Float, &[2, 7, n]));
    }
    g.into_model(20)
}

/// `y` quantized (scale 0.05, zero point 128 as uint8 or −3 as int8) and dequantized again;
/// with `read`, the quantized values are also cast to float32, a graph output. Returns the dequantized tensor.
fn requantize(
    g: &mut GraphBuilder,
    y: &str,
    name: &str,
    signed: bool,
    read: bool,
    n: i64,
) -> String {
    let (scale, zero_point) = (format!("{name}s"), format!("{name}z"));
    g.initializer(tensor_f32(&scale, &[], &[0.05]));
    let mut z = tensor_q(&zero_point, &[], !signed, 0);
    z.raw_data = vec![if signed { -3i8 as u8 } else { 128 }].into();
    g.initializer(z);
    let q = g.node(node(
        &format!("{name}q"),
        "QuantizeLinear",
        &[y, &scale, &zero_point],
        &[&format!("{name}_q")],
    ));
    if read {
        let other = format!("{name}_other");
        let to = attnrt_onnx::attr::make_int("to", DataType::Float as i64);
        g.node(node_with_attrs(
            &format!("{name}other"),
            "Cast",
            &[&q],
            &[&other],
            vec![to],
        ));
        g.output(value_info(&other, DataType::Float, &[2, 7, n]));
    }
    g.node(node(
        &format!("{name}dq"),
        "DequantizeLinear",
        &[&q, &scale, &zero_point],
        &[&format!("{name}_d")],
    ))
}

/// Runs `m` with attnrt's ops and with tract's; the attnrt run's op names and the largest
/// difference relative to `1 + |tract's value|`.
fn compare_model(m: &ModelProto, k: usize, scale: f32) -> (Vec<String>, f32) {
    let inputs = x(k, scale);
    let (a, ops) = run::<f32>(m, &inputs, true);
    let (t, _) = run::<f32>(m, &inputs, false);
    let mut worst = 0f32;
    for (a, t) in a.iter().zip(&t) {
        assert_eq!(a.len(), t.len());
        assert!(t.iter().any(|&v| v != 0.0));
        for (x, y) in a.iter().zip(t) {
            worst = worst.max((x - y).abs() / (1.0 + y.abs()));
        }
    }
    (ops, worst)
}

/// The graph dequantizes both sides and sums `k` rounded float32 products; attnrt sums the
/// integers exactly and scales once. With |x·w| products up to ~3 and k = 64, a float32 sum is
/// off by at most k·2⁻²⁴ relative per term: 1e-5 of (1 + |y|) bounds it with room.
const QDQ_TOLERANCE: f32 = 1e-5;

#[test]
fn every_qdq_projection_form_runs_as_one_integer_op_within_float_rounding() {
    let variants = [
        QDQ,
        QdqForm {
            weight: Form {
                unsigned: true,
                ..FORM
            },
            ..QDQ
        },
        QdqForm {
            weight: Form {
                scale_per_column: false,
                zero_point: Some(false),
                ..FORM
            },
            ..QDQ
        },
        QdqForm {
            weight: Form {
                zero_point: None,
                bias: false,
                ..FORM
            },
            ..QDQ
        },
        QdqForm { axis: -1, ..QDQ },
    ];
    for (k, n) in [(33, 19), (64, 48)] {
        for signed in [false, true] {
            for v in variants {
                let m = qdq_model(&[v], signed, false, k, n);
                let (ops, worst) = compare_model(&m, k as usize, 3.0);
                assert_eq!(count(&ops, "AttnrtQuantProjection"), 1, "{v:?}: {ops:?}");
                assert!(
                    worst <= QDQ_TOLERANCE,
                    "{v:?} signed {signed} k{k} n{n}: {worst}"
                );
            }
            let m = qdq_model(&variants, signed, false, k, n);
            let (ops, worst) = compare_model(&m, k as usize, 0.5);
            assert_eq!(
                count(&ops, "AttnrtQuantProjection"),
                variants.len(),
                "{ops:?}"
            );
            assert!(worst <= QDQ_TOLERANCE, "all forms: {worst}");
            // The activations' dequantization went with the chains; their quantization stays.
            assert!(!ops.iter().any(|o| o.contains("Dequantize")), "{ops:?}");
        }
    }
}

#[test]
fn a_dequantized_input_read_elsewhere_stays_and_per_row_weight_scales_stay_on_tract() {
    // x_d read by another node: the projection still becomes one op, the Add keeps its input.
    let m = qdq_model(&[QDQ], false, true, 24, 16);
    let (ops, worst) = compare_model(&m, 24, 2.0);
    assert_eq!(count(&ops, "AttnrtQuantProjection"), 1, "{ops:?}");
    assert!(worst <= QDQ_TOLERANCE, "{worst}");
    // Scales per row of W (axis 0, k = n so the shapes fit): not the op's per-column form.
    let m = qdq_model(&[QdqForm { axis: 0, ..QDQ }], false, false, 16, 16);
    let (ops, worst) = compare_model(&m, 16, 2.0);
    assert_eq!(count(&ops, "AttnrtQuantProjection"), 0, "{ops:?}");
    assert_eq!(worst, 0.0);
}

/// Runs `m` with attnrt's ops: the outputs' bits and the op names.
fn run_bits(m: &ModelProto, k: usize, scale: f32) -> (Vec<Vec<u32>>, Vec<String>) {
    let (y, ops) = run::<f32>(m, &x(k, scale), true);
    let bits = y.iter().map(|y| y.iter().map(|v| v.to_bits()).collect());
    (bits.collect(), ops)
}

/// A QDQ projection whose product is quantized and dequantized again before its bias (how
/// `quantize_static` writes every `MatMul`) runs as one op with the round trip and the bias in
/// its epilogue, bit for bit what the op, attnrt's `QuantizeLinear`, the `DequantizeLinear` and
/// the `Add` give one after another (as they run when the quantized values are read elsewhere).
#[test]
fn a_projection_s_output_round_trip_and_bias_fold_in_bit_for_bit() {
    let (k, n) = (40, 24);
    for signed in [false, true] {
        for bias in [true, false] {
            let form = QdqForm {
                weight: Form { bias, ..FORM },
                requantize: Some(signed),
                ..QDQ
            };
            let folded = qdq_model(&[form], false, false, k, n);
            let (y, ops) = run_bits(&folded, k as usize, 3.0);
            assert_eq!(count(&ops, "AttnrtQuantProjection"), 1, "{ops:?}");
            // Only the input's quantization is left, and no `Add`.
            assert_eq!(count(&ops, "AttnrtQuantizeLinear"), 1, "{ops:?}");
            assert!(
                !ops.iter()
                    .any(|o| o.contains("Dequantize") || o.contains("Add")),
                "{ops:?}"
            );
            let unfolded = QdqForm {
                quantized_output: true,
                ..form
            };
            let m = qdq_model(&[unfolded], false, false, k, n);
            let (want, ops) = run_bits(&m, k as usize, 3.0);
            assert_eq!(count(&ops, "AttnrtQuantizeLinear"), 2, "{ops:?}");
            assert!(ops.iter().any(|o| o.contains("Dequantize")), "{ops:?}");
            // `want` holds the cast of the quantized values first, then `y`.
            assert_eq!(want.len(), 2);
            assert_eq!(y[0], want[1], "signed {signed} bias {bias}");
            let distinct: std::collections::BTreeSet<u32> = y[0].iter().copied().collect();
            assert!(
                distinct.len() > 10,
                "a round trip over many steps: {}",
                distinct.len()
            );
        }
    }
}
