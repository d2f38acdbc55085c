//! Elementwise ops: unary ops keep their input's shape; binary (and ternary `Where`) ops
//! broadcast; both compute small known values where the matcher needs them (scale factors,
//! shape arithmetic, the ONNX expansions' GQA repeat counts).

use attnrt_onnx::proto::tensor_proto::DataType;
use attnrt_onnx::NodeProto;

use super::facts::Facts;
use crate::graph::dim::{broadcast_all, Dim};
use crate::graph::value::Value;

/// A unary op: the input's shape and (except for predicates) type.
pub(super) fn unary(f: &mut Facts, n: &NodeProto) {
    let v = match (n.op_type.as_str(), f.in_value(n, 0)) {
        ("Sqrt", Some(Value::Floats(d, v))) => Some(Value::Floats(
            d.clone(),
            v.iter().map(|x| x.sqrt()).collect(),
        )),
        ("Reciprocal", Some(Value::Floats(d, v))) => Some(Value::Floats(
            d.clone(),
            v.iter().map(|x| 1.0 / x).collect(),
        )),
        ("Neg", Some(Value::Floats(d, v))) => {
            Some(Value::Floats(d.clone(), v.iter().map(|x| -x).collect()))
        }
        // T5 slices its position bias from `-sequence_length` (a dim from `Shape`).
        ("Neg", Some(Value::Ints(d, v))) => v
            .iter()
            .map(|x| Dim::known(0).sub(x))
            .collect::<Option<Vec<Dim>>>()
            .map(|v| Value::Ints(d.clone(), v)),
        // The ONNX expansions compute their GQA repeat count through Not/And.
        ("Not", Some(Value::Bools(d, v))) => {
            Some(Value::Bools(d.clone(), v.iter().map(|x| !x).collect()))
        }
        _ => None,
    };
    if matches!(n.op_type.as_str(), "Not" | "IsNaN" | "IsInf") {
        f.set_type(n, 0, DataType::Bool as i32);
    } else {
        f.copy_type(n);
    }
    let s = f.in_shape(n, 0);
    f.set(n, 0, s, v);
}

/// A broadcasting op with two inputs, or `Where`.
pub(super) fn binary(f: &mut Facts, n: &NodeProto) {
    let shapes: Option<Vec<Vec<Dim>>> = (0..n.input.len()).map(|i| f.in_shape(n, i)).collect();
    let shape = shapes.and_then(|s| broadcast_all(&s));
    let vals: Option<Vec<&Value>> = (0..n.input.len()).map(|i| f.in_value(n, i)).collect();
    let v = vals.and_then(|v| eval_elementwise(&n.op_type, &v));
    let is_predicate = matches!(
        n.op_type.as_str(),
        "Equal" | "Less" | "Greater" | "And" | "Or" | "GreaterOrEqual" | "LessOrEqual" | "Xor"
    );
    let ty = if is_predicate {
        Some(DataType::Bool as i32)
    } else {
        // `Where`'s type is its branches'.
        let first = if n.op_type == "Where" { 1 } else { 0 };
        n.input
            .get(first)
            .and_then(|i| f.elem_types.get(i))
            .copied()
    };
    if let Some(t) = ty {
        f.set_type(n, 0, t);
    }
    f.set(n, 0, shape, v);
}

/// Elementwise arithmetic on known values; integer operands may be symbolic for Mul and exact
/// Div. Broadcasting is limited to equal lengths or one single-element operand.
fn eval_elementwise(op: &str, vals: &[&Value]) -> Option<Value> {
    let len = vals.iter().map(|v| v.len()).max()?;
    if vals.iter().any(|v| v.len() != len && v.len() != 1) {
        return None;
    }
    let dims = vals.iter().find(|v| v.len() == len)?.dims().to_vec();
    if vals.iter().any(|v| v.dims().len() > dims.len()) {
        return None;
    }
    let at = Broadcast { vals, len };
    match (op, vals) {
        (_, [Value::Bools(_, a), Value::Bools(_, b)]) => {
            let out: Option<Vec<bool>> = (0..len)
                .map(|i| bool_op(op, a[at.pick(i, 0)], b[at.pick(i, 1)]))
                .collect();
            Some(Value::Bools(dims, out?))
        }
        ("Where", [Value::Bools(_, c), a, b]) => select(&at, dims, c, a, b),
        (_, [Value::Ints(_, a), Value::Ints(_, b)]) => int_op(op, &at, dims, a, b),
        (_, [Value::Floats(_, a), Value::Floats(_, b)]) => {
            let out: Option<Vec<f64>> = (0..len)
                .map(|i| float_op(op, a[at.pick(i, 0)], b[at.pick(i, 1)]))
                .collect();
            Some(Value::Floats(dims, out?))
        }
        _ => None,
    }
}

/// Element `i` of operand `k` under the limited broadcasting of [`eval_elementwise`].
struct Broadcast<'a> {
    vals: &'a [&'a Value],
    len: usize,
}

impl Broadcast<'_> {
    fn pick(&self, i: usize, k: usize) -> usize {
        if self.vals[k].len() == 1 {
            0
        } else {
            i
        }
    }
}

fn bool_op(op: &str, x: bool, y: bool) -> Option<bool> {
    Some(match op {
        "And" => x && y,
        "Or" => x || y,
        "Xor" | "BitwiseXor" => x != y,
        "Equal" => x == y,
        _ => return None,
    })
}

fn float_op(op: &str, x: f64, y: f64) -> Option<f64> {
    Some(match op {
        "Mul" => x * y,
        "Div" => x / y,
        "Add" => x + y,
        "Sub" => x - y,
        "Pow" => x.powf(y),
        _ => return None,
    })
}

/// `Where(c, a, b)` on known values: both branches integers, or both floats.
fn select(at: &Broadcast, dims: Vec<i64>, c: &[bool], a: &Value, b: &Value) -> Option<Value> {
    let cond = |i: usize| c[at.pick(i, 0)];
    match (a, b) {
        (Value::Ints(_, x), Value::Ints(_, y)) => {
            let out = (0..at.len).map(|i| {
                if cond(i) {
                    x[at.pick(i, 1)].clone()
                } else {
                    y[at.pick(i, 2)].clone()
                }
            });
            Some(Value::Ints(dims, out.collect()))
        }
        (Value::Floats(_, x), Value::Floats(_, y)) => {
            let out = (0..at.len).map(|i| {
                if cond(i) {
                    x[at.pick(i, 1)]
                } else {
                    y[at.pick(i, 2)]
                }
            });
            Some(Value::Floats(dims, out.collect()))
        }
        _ => None,
    }
}

/// Integer arithmetic (symbolic where it can be proven) and `Equal`.
fn int_op(op: &str, at: &Broadcast, dims: Vec<i64>, a: &[Dim], b: &[Dim]) -> Option<Value> {
    if op == "Equal" {
        let out: Option<Vec<bool>> = (0..at.len)
            .map(|i| dims_equal(&a[at.pick(i, 0)], &b[at.pick(i, 1)]))
            .collect();
        return Some(Value::Bools(dims, out?));
    }
    let out: Option<Vec<Dim>> = (0..at.len)
        .map(|i| int_arith(op, &a[at.pick(i, 0)], &b[at.pick(i, 1)]))
        .collect();
    Some(Value::Ints(dims, out?))
}

fn int_arith(op: &str, x: &Dim, y: &Dim) -> Option<Dim> {
    Some(match op {
        "Mul" => x.mul(y)?,
        "Div" => match (x.as_known(), y.as_known()) {
            // ONNX integer Div truncates.
            (Some(p), Some(q)) if q != 0 => Dim::known(p / q),
            _ => x.div_exact(y)?,
        },
        "Add" => x.add(y)?,
        "Sub" => x.sub(y)?,
        "Mod" => {
            let (p, q) = (x.as_known()?, y.as_known()?);
            if q == 0 {
                return None;
            }
            Dim::known(p.rem_euclid(q))
        }
        _ => return None,
    })
}

fn dims_equal(x: &Dim, y: &Dim) -> Option<bool> {
    Some(match (x.as_known(), y.as_known()) {
        (Some(p), Some(q)) => p == q,
        _ if x == y => true,
        // Symbols are sizes (never negative): a sum of them is at least its constant term.
        (None, Some(q)) if x.lower_bound().is_some_and(|b| b > q) => false,
        (Some(q), None) if y.lower_bound().is_some_and(|b| b > q) => false,
        _ => return None,
    })
}
