//! `QuantizeLinear` saturates as ONNX defines it for every input, infinities and values far past
//! the 8-bit range included (tract's integer add overflowed there: a panic in a debug build, a
//! wrapped value in a release one), and keeps tract's values everywhere else.

use attnrt_onnx::proto::TensorProto;
use attnrt_onnx::DataType;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{node, tensor_f32, value_info, GraphBuilder};

/// `y = QuantizeLinear(x, 0.01, zero_point)` on a vector of `len`, to int8 when `signed`.
fn session(signed: bool, zero_point: i8, len: i64) -> Session {
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
    g.node(node(
        "/q/QuantizeLinear",
        "QuantizeLinear",
        &["x", "s", "z"],
        &["y"],
    ));
    g.output(value_info("y", data_type, &[len]));
    let threads = Threads::new(Some(1)).unwrap();
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
