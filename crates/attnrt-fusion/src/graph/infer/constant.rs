//! Sources of known values: `Constant`, `ConstantOfShape`, `Shape`, `Range`, and the ops that
//! carry a value along (`Identity`, `Cast`).

use attnrt_onnx::proto::tensor_proto::DataType;
use attnrt_onnx::{attr, NodeProto};

use super::facts::Facts;
use crate::graph::dim::Dim;
use crate::graph::value::{cast_value, tensor_value, Value, MAX_VALUE_ELEMENTS};

/// `Constant`: the value of whichever `value*` attribute is set.
pub(super) fn constant(f: &mut Facts, n: &NodeProto) {
    let tensor = attr::tensor(n, "value").ok().flatten();
    let v = tensor.and_then(tensor_value).or_else(|| {
        if let Ok(Some(x)) = attr::float(n, "value_float") {
            Some(Value::Floats(vec![], vec![x as f64]))
        } else if let Ok(Some(i)) = attr::int(n, "value_int") {
            Some(Value::Ints(vec![], vec![Dim::known(i)]))
        } else if let Ok(Some(is)) = attr::ints(n, "value_ints") {
            Some(Value::Ints(
                vec![is.len() as i64],
                is.iter().map(|&i| Dim::known(i)).collect(),
            ))
        } else {
            None
        }
    });
    match tensor {
        Some(t) => {
            f.set_type(n, 0, t.data_type);
            f.set(
                n,
                0,
                Some(t.dims.iter().map(|&d| Dim::known(d)).collect()),
                v,
            );
        }
        None => f.set(n, 0, None, v),
    }
}

/// `Identity`: the input, value included.
pub(super) fn identity(f: &mut Facts, n: &NodeProto) {
    let v = f.in_value(n, 0).cloned();
    f.copy_type(n);
    let s = f.in_shape(n, 0);
    f.set(n, 0, s, v);
}

/// `Shape` (with `start`/`end`): the input's dims as a 1-D integer value.
pub(super) fn shape(f: &mut Facts, n: &NodeProto) {
    let Some(s) = f.in_shape(n, 0) else { return };
    let r = s.len() as i64;
    let norm = |x: i64| {
        if x < 0 {
            x.saturating_add(r).clamp(0, r)
        } else {
            x.min(r)
        }
    };
    let start = norm(attr::int(n, "start").ok().flatten().unwrap_or(0));
    let end = norm(attr::int(n, "end").ok().flatten().unwrap_or(r));
    let dims: Vec<Dim> = if start < end {
        s[start as usize..end as usize].to_vec()
    } else {
        vec![]
    };
    f.set(n, 0, None, Some(Value::Ints(vec![dims.len() as i64], dims)));
}

/// `Cast(to)`: the input's shape, the new type, the value converted.
pub(super) fn cast(f: &mut Facts, n: &NodeProto) {
    let to = attr::int(n, "to").ok().flatten().unwrap_or(0) as i32;
    if !n.output.is_empty() {
        f.set_type(n, 0, to);
    }
    let v = f.in_value(n, 0).and_then(|v| cast_value(v, to));
    let s = f.in_shape(n, 0);
    f.set(n, 0, s, v);
}

/// `Range(start, limit, delta)`: its length, symbolic for `Range(0, L, 1)`.
pub(super) fn range(f: &mut Facts, n: &NodeProto) {
    let get = |i: usize| {
        f.in_value(n, i).and_then(|v| match v {
            Value::Ints(_, x) if x.len() == 1 => Some(x[0].clone()),
            _ => None,
        })
    };
    let (Some(start), Some(limit), Some(delta)) = (get(0), get(1), get(2)) else {
        return;
    };
    let len = match (start.as_known(), limit.as_known(), delta.as_known()) {
        (Some(0), _, Some(1)) => limit,
        (Some(a), Some(b), Some(d)) if d != 0 => match range_len(a, b, d) {
            Some(len) => Dim::known(len),
            None => return,
        },
        // `Range(P, P + L, 1)` (a decoder's positions): the difference, when it cannot be
        // negative.
        (_, _, Some(1)) => match limit.sub(&start) {
            Some(len) if len.lower_bound().is_some() => len,
            _ => return,
        },
        _ => return,
    };
    f.copy_type(n);
    f.set(n, 0, Some(vec![len]), None);
}

/// `ConstantOfShape`: the filled value when small, else the (possibly symbolic) shape.
pub(super) fn constant_of_shape(f: &mut Facts, n: &NodeProto) {
    let fill = attr::tensor(n, "value").ok().flatten();
    f.set_type(n, 0, fill.map_or(DataType::Float as i32, |t| t.data_type));
    let Some(shape) = f.in_value(n, 0).and_then(Value::known_ints) else {
        // A run-time shape: the dims are still known symbolically.
        if let Some(Value::Ints(_, dims)) = f.in_value(n, 0).cloned() {
            f.set(n, 0, Some(dims), None);
        }
        return;
    };
    // A hostile shape can overflow the product: then it is not a small value.
    let Some(count) = shape.iter().try_fold(
        1i64,
        |acc, &d| if d < 0 { None } else { acc.checked_mul(d) },
    ) else {
        return;
    };
    if count as usize > MAX_VALUE_ELEMENTS {
        return;
    }
    let count = count as usize;
    let v = match fill.and_then(tensor_value) {
        None => Some(Value::Floats(shape.clone(), vec![0.0; count])),
        Some(Value::Floats(_, x)) if x.len() == 1 => {
            Some(Value::Floats(shape.clone(), vec![x[0]; count]))
        }
        Some(Value::Ints(_, i)) if i.len() == 1 => {
            Some(Value::Ints(shape.clone(), vec![i[0].clone(); count]))
        }
        Some(Value::Bools(_, b)) if b.len() == 1 => {
            Some(Value::Bools(shape.clone(), vec![b[0]; count]))
        }
        _ => None,
    };
    f.set(
        n,
        0,
        Some(shape.iter().map(|&d| Dim::known(d)).collect()),
        v,
    );
}

/// The number of elements of `Range(a, b, d)`, `max(ceil((b - a) / d), 0)`, when it fits an
/// i64 (a hostile model's bounds may not).
fn range_len(a: i64, b: i64, d: i64) -> Option<i64> {
    let span = i128::from(b) - i128::from(a);
    let d = i128::from(d);
    let len = (span + d - d.signum()) / d;
    i64::try_from(len.max(0)).ok()
}

#[cfg(test)]
mod tests {
    use super::range_len;

    #[test]
    fn range_lengths_round_up_and_never_overflow() {
        assert_eq!(range_len(0, 10, 3), Some(4));
        assert_eq!(range_len(10, 0, -3), Some(4));
        assert_eq!(range_len(5, 0, 1), Some(0));
        assert_eq!(range_len(i64::MIN, i64::MAX, 1), None);
        assert_eq!(range_len(i64::MIN, i64::MAX, i64::MAX), Some(3));
    }
}
