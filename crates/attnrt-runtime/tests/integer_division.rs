//! Integer `Div` and `Mod` whose quotient is undefined (a zero divisor, or a signed type's minimum
//! divided by -1) are errors naming the node, not panics inside tract; defined quotients keep
//! ONNX's values (truncation toward zero for `Div`, the divisor's sign for `Mod`), and
//! floating-point division keeps IEEE's infinities.

use attnrt_onnx::DataType;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{node, tensor_i64, value_info, GraphBuilder};

/// `y = op(a, b)` on int64 vectors of 3, `b` an input or (when given) a constant.
fn session(op: &str, constant_b: Option<&[i64]>) -> Session {
    let mut g = GraphBuilder::new("division");
    g.input(value_info("a", DataType::Int64, &[3i64]));
    match constant_b {
        Some(b) => g.initializer(tensor_i64("b", &[b.len() as i64], b)),
        None => g.input(value_info("b", DataType::Int64, &[3i64])),
    };
    g.node(node("/calc/Divide", op, &["a", "b"], &["y"]));
    g.output(value_info("y", DataType::Int64, &[3i64]));
    let model = g.into_model(17);
    let threads = Threads::new(Some(1)).unwrap();
    Session::new(
        &model,
        &threads,
        "division.onnx",
        &SessionOptions::default(),
    )
    .unwrap()
}

fn vector(name: &str, values: &[i64]) -> NamedTensor {
    NamedTensor {
        name: name.into(),
        tensor: Tensor::from_shape(&[values.len()], values).unwrap(),
    }
}

fn run(s: &Session, a: &[i64], b: Option<&[i64]>) -> anyhow::Result<Vec<i64>> {
    let mut feeds = vec![vector("a", a)];
    feeds.extend(b.map(|b| vector("b", b)));
    let y = s.run(&feeds)?;
    let plain = y[0].tensor.try_as_plain_ram().unwrap();
    Ok(plain.as_slice::<i64>().unwrap().to_vec())
}

fn assert_refused(result: anyhow::Result<Vec<i64>>, op: &str, why: &str) {
    let err = format!("{:#}", result.unwrap_err());
    assert!(err.contains(&format!("{op} node '/calc/Divide'")), "{err}");
    assert!(err.contains(why) && !err.contains("panic"), "{err}");
}

#[test]
fn a_zero_divisor_is_an_error_naming_the_node() {
    for op in ["Div", "Mod"] {
        let s = session(op, None);
        assert_refused(
            run(&s, &[7, 8, 9], Some(&[1, 0, 2])),
            op,
            "division by zero",
        );
    }
    // the same session goes on with a good divisor
    let s = session("Div", None);
    assert_eq!(
        run(&s, &[7, -7, 9], Some(&[2, 2, -1])).unwrap(),
        [3, -3, -9]
    );
}

#[test]
fn the_minimum_divided_by_minus_one_is_an_error_other_pairs_are_not() {
    let s = session("Div", None);
    assert_refused(
        run(&s, &[1, i64::MIN, 3], Some(&[2, -1, 1])),
        "Div",
        "overflows",
    );
    // -1 with other dividends and the minimum with other divisors are defined
    assert_eq!(
        run(&s, &[i64::MIN, 5, 3], Some(&[2, -1, 1])).unwrap(),
        [i64::MIN / 2, -5, 3]
    );
    let m = session("Mod", None);
    assert_refused(
        run(&m, &[i64::MIN, 1, 1], Some(&[-1, 1, 1])),
        "Mod",
        "overflows",
    );
    // ONNX's integer Mod takes the divisor's sign
    assert_eq!(run(&m, &[7, -7, 7], Some(&[3, 3, -3])).unwrap(), [1, 2, -2]);
}

#[test]
fn a_constant_divisor_is_checked_at_run_time_when_it_can_fail() {
    // no 0 and no -1: checked once while planning, nothing left to check
    let s = session("Div", Some(&[2, 3, 4]));
    assert_eq!(run(&s, &[8, 9, -8], None).unwrap(), [4, 3, -2]);
    assert!(!s
        .op_names()
        .iter()
        .any(|n| n == attnrt_runtime::divide::OP_NAME));
    // a constant 0: every run is refused
    let s = session("Div", Some(&[2, 0, 4]));
    assert_refused(run(&s, &[8, 9, 8], None), "Div", "division by zero");
    // a constant -1: only the minimum is refused
    let s = session("Div", Some(&[-1, 1, 1]));
    assert_eq!(run(&s, &[8, 9, 8], None).unwrap(), [-8, 9, 8]);
    assert_refused(run(&s, &[i64::MIN, 9, 8], None), "Div", "overflows");
}

#[test]
fn a_float_division_by_zero_is_ieee() {
    use attnrt_testkit::float_value;
    let mut g = GraphBuilder::new("division");
    g.input(float_value("a", &[2]));
    g.input(float_value("b", &[2]));
    g.node(node("/calc/Divide", "Div", &["a", "b"], &["y"]));
    g.output(float_value("y", &[2]));
    let threads = Threads::new(Some(1)).unwrap();
    let s = Session::new(
        &g.into_model(17),
        &threads,
        "f.onnx",
        &SessionOptions::default(),
    )
    .unwrap();
    let feed = |name: &str, v: [f32; 2]| NamedTensor {
        name: name.into(),
        tensor: Tensor::from_shape(&[2], &v).unwrap(),
    };
    let y = s
        .run(&[feed("a", [1.0, -1.0]), feed("b", [0.0, 0.0])])
        .unwrap();
    let plain = y[0].tensor.try_as_plain_ram().unwrap();
    assert_eq!(
        plain.as_slice::<f32>().unwrap(),
        [f32::INFINITY, f32::NEG_INFINITY]
    );
}
