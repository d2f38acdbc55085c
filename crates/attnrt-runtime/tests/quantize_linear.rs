//! `QuantizeLinear` saturates as ONNX defines it for every input, infinities and values far past
//! the 8-bit range included (tract's integer add overflowed there: a panic in a debug build, a
//! wrapped value in a release one), and keeps tract's values everywhere else.

use attnrt_onnx::proto::TensorProto;
use attnrt_onnx::DataType;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{node, tensor_f32, value_info, GraphBuilder};

/// A graph with input `x: [len]`, the scale `s` = 0.01 and the zero point `z` (int8 when
/// `signed`, else uint8) as initializers; and `z`'s type.
fn quantizing_graph(signed: bool, zero_point: i8, len: i64) -> (GraphBuilder, DataType) {
    let mut g = GraphBuilder::new("quantize");
    g.input(value_info("x", DataType::Float, &[len]));
    g.initializer(tensor_f32("s", &[], &[0.01]));
    let data_type = if signed {
        DataType::Int8
    } else {
        DataType::Uint8
    };
    g.initializer(TensorProto {
        name: "z".into(),
        data_type: data_type as i32,
        raw_data: vec![zero_point as u8].into(),
        ..Default::default()
    });
    (g, data_type)
}

/// `y = QuantizeLinear(x, 0.01, zero_point)` on a vector of `len`, to int8 when `signed`.
fn session(signed: bool, zero_point: i8, len: i64) -> Session {
    let (mut g, data_type) = quantizing_graph(signed, zero_point, len);
    g.node(node(
        "/q/QuantizeLinear",
        "QuantizeLinear",
        &["x", "s", "z"],
        &["y"],
    ));
    g.output(value_info("y", data_type, &[len]));
    built(g, 1)
}

/// The session of `g` on `threads` threads, with the default options.
fn built(g: GraphBuilder, threads: usize) -> Session {
    let threads = Threads::new(Some(threads)).unwrap();
    Session::new(
        &g.into_model(17),
        &threads,
        "q.onnx",
        &SessionOptions::default(),
    )
    .unwrap()
}

fn quantize<T: attnrt_runtime::Datum + Copy + Into<i32>>(s: &Session, x: &[f32]) -> Vec<i32> {
    let feeds = [NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&[x.len()], x).unwrap(),
    }];
    let out = s.run(&feeds).unwrap();
    let y = out[0].tensor.to_plain_array_view::<T>().unwrap();
    y.iter().map(|&v| v.into()).collect()
}

const X: [f32; 9] = [
    f32::INFINITY,
    f32::NEG_INFINITY,
    1e30,
    -1e30,
    3e7,
    -3e7,
    0.254,
    -0.256,
    0.005,
];

#[test]
fn huge_and_infinite_inputs_saturate_to_the_type_s_bounds() {
    let s = session(false, 3, X.len() as i64);
    // round(0.254 / 0.01) = 25, round(-25.6) = -26, round(0.5) = 0 (half to even), plus 3.
    assert_eq!(quantize::<u8>(&s, &X), [255, 0, 255, 0, 255, 0, 28, 0, 3]);
    let s = session(true, -5, X.len() as i64);
    assert_eq!(
        quantize::<i8>(&s, &X),
        [127, -128, 127, -128, 127, -128, 20, -31, -5]
    );
}

/// `y = DequantizeLinear(QuantizeLinear(x, 0.01, z), 0.01, z)` (a QDQ model's round trip of an
/// activation) on a vector of `len`, to int8 when `signed`; with `cast`, the quantized values are
/// also cast to float32, a second output (so the pair cannot fold).
fn round_trip(signed: bool, zero_point: i8, len: i64, cast: bool) -> Session {
    let (mut g, _) = quantizing_graph(signed, zero_point, len);
    g.node(node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"]));
    g.node(node("dq", "DequantizeLinear", &["xq", "s", "z"], &["y"]));
    g.output(value_info("y", DataType::Float, &[len]));
    if cast {
        let to = attnrt_onnx::attr::make_int("to", DataType::Float as i64);
        g.node(attnrt_testkit::node_with_attrs(
            "cast",
            "Cast",
            &["xq"],
            &["c"],
            vec![to],
        ));
        g.output(value_info("c", DataType::Float, &[len]));
    }
    built(g, 2)
}

/// A `QuantizeLinear` read only by a `DequantizeLinear` of the same scale and zero point runs
/// as one op (the round trip in one pass), bit for bit the pair's values, saturation and NaN
/// included, on both 8-bit types; a second reader of the quantized values keeps the pair.
#[test]
fn a_quantize_dequantize_pair_folds_into_one_pass_bit_for_bit() {
    let mut x: Vec<f32> = X.to_vec();
    x.push(f32::NAN);
    x.extend((0..70_000).map(|i| ((i as f32) * 0.37).sin() * 1.5));
    let len = x.len() as i64;
    let feeds = [NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&[x.len()], &x).unwrap(),
    }];
    // The output's bits, and the op names of the plan the run made.
    let run = |s: &Session| -> (Vec<u32>, Vec<String>) {
        let out = s.run(&feeds).unwrap();
        let y = out[0].tensor.to_plain_array_view::<f32>().unwrap();
        (y.iter().map(|v| v.to_bits()).collect(), s.op_names())
    };
    for (signed, zero_point) in [(false, 3), (true, -5)] {
        let (y, ops) = run(&round_trip(signed, zero_point, len, false));
        assert_eq!(
            ops.iter().filter(|o| *o == "AttnrtQuantizeLinear").count(),
            1,
            "{ops:?}"
        );
        assert!(!ops.iter().any(|o| o.contains("Dequantize")), "{ops:?}");
        let (want, ops) = run(&round_trip(signed, zero_point, len, true));
        assert!(ops.iter().any(|o| o.contains("Dequantize")), "{ops:?}");
        assert_eq!(y, want, "signed {signed}");
        // Both bounds were reached (by the saturating inputs), and many steps between them.
        let (lo, hi) = if signed { (-128, 127) } else { (0, 255) };
        let values: std::collections::BTreeSet<u32> = y.iter().copied().collect();
        let bound = |q: i32| ((q - i32::from(zero_point)) as f32 * 0.01).to_bits();
        assert!(
            values.contains(&bound(lo)) && values.contains(&bound(hi)),
            "signed {signed}"
        );
        assert!(values.len() > 100, "{} distinct values", values.len());
    }
}
