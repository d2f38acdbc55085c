//! Ops that rearrange a tensor without computing on it: `Reshape`, `Transpose`,
//! `Squeeze`/`Unsqueeze`, `Expand`, `Flatten`. A known value keeps its elements under a new
//! shape where the reshape is static.

use attnrt_onnx::{attr, NodeProto};

use super::facts::{axis, Facts};
use crate::graph::dim::{broadcast, product, Dim};
use crate::graph::value::Value;

/// `Reshape(x, target)`: `0` copies an input dim (unless `allowzero`), `-1` is proven by
/// dividing the input's size by the rest.
pub(super) fn reshape(f: &mut Facts, n: &NodeProto) {
    let Some(Value::Ints(_, target)) = f.in_value(n, 1).cloned() else {
        return;
    };
    let allowzero = attr::int(n, "allowzero").ok().flatten().unwrap_or(0) != 0;
    let out = f
        .in_shape(n, 0)
        .and_then(|s| reshape_dims(&s, &target, allowzero))
        .or_else(|| {
            // Without the input shape, a target free of 0 and -1 is still the shape.
            target
                .iter()
                .all(|d| d.as_known().is_none_or(|v| v > 0))
                .then(|| target.clone())
        });
    let v = reshaped_value(f, n, out.as_deref());
    f.copy_type(n);
    f.set(n, 0, out, v);
}

/// The value of input 0 of `n` under the static shape `out`.
fn reshaped_value(f: &Facts, n: &NodeProto, out: Option<&[Dim]>) -> Option<Value> {
    let v = f.in_value(n, 0)?;
    let dims: Option<Vec<i64>> = out?.iter().map(Dim::as_known).collect();
    Some(v.with_dims(dims?))
}

fn reshape_dims(input: &[Dim], target: &[Dim], allowzero: bool) -> Option<Vec<Dim>> {
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, t) in target.iter().enumerate() {
        match t.as_known() {
            Some(0) if !allowzero => out.push(Some(input.get(i)?.clone())),
            Some(-1) => {
                if infer_at.replace(i).is_some() {
                    return None;
                }
                out.push(None);
            }
            Some(v) if v < 0 => return None,
            _ => out.push(Some(t.clone())),
        }
    }
    if let Some(at) = infer_at {
        let known: Vec<Dim> = out.iter().flatten().cloned().collect();
        let d = product(input)?.div_exact(&product(&known)?)?;
        out[at] = Some(d);
    }
    out.into_iter().collect()
}

/// `Transpose(perm)` (default: reverse the axes).
pub(super) fn transpose(f: &mut Facts, n: &NodeProto) {
    let Some(s) = f.in_shape(n, 0) else { return };
    let perm: Vec<i64> = match attr::ints(n, "perm").ok().flatten() {
        Some(p) => p.to_vec(),
        None => (0..s.len() as i64).rev().collect(),
    };
    if !is_perm(&perm, s.len()) {
        return;
    }
    f.copy_type(n);
    let out = perm.iter().map(|&p| s[p as usize].clone()).collect();
    f.set(n, 0, Some(out), None);
}

fn is_perm(perm: &[i64], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm.iter().all(|&p| {
            (0..rank as i64).contains(&p) && !std::mem::replace(&mut seen[p as usize], true)
        })
}

/// `Squeeze`/`Unsqueeze`, axes as an attribute (before opset 13) or an input.
pub(super) fn squeeze_unsqueeze(f: &mut Facts, n: &NodeProto) {
    let axes: Option<Vec<i64>> = match attr::ints(n, "axes").ok().flatten() {
        Some(a) => Some(a.to_vec()),
        None => f.in_value(n, 1).and_then(Value::known_ints),
    };
    let Some(s) = f.in_shape(n, 0) else { return };
    let out = if n.op_type == "Unsqueeze" {
        axes.and_then(|a| unsqueeze_dims(&s, &a))
    } else {
        match axes {
            Some(a) => squeeze_dims(&s, &a),
            None => Some(s.iter().filter(|d| !d.is(1)).cloned().collect()),
        }
    };
    let v = reshaped_value(f, n, out.as_deref());
    f.copy_type(n);
    f.set(n, 0, out, v);
}

fn unsqueeze_dims(s: &[Dim], axes: &[i64]) -> Option<Vec<Dim>> {
    let r = (s.len() + axes.len()) as i64;
    let mut axes: Vec<i64> = axes.iter().map(|&a| axis(a, r)).collect();
    axes.sort_unstable();
    if axes.iter().any(|&a| !(0..r).contains(&a)) || axes.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    let mut it = s.iter();
    (0..r)
        .map(|i| {
            if axes.contains(&i) {
                Some(Dim::known(1))
            } else {
                it.next().cloned()
            }
        })
        .collect()
}

fn squeeze_dims(s: &[Dim], axes: &[i64]) -> Option<Vec<Dim>> {
    let r = s.len() as i64;
    let axes: Vec<i64> = axes.iter().map(|&a| axis(a, r)).collect();
    if axes
        .iter()
        .any(|&a| !(0..r).contains(&a) || !s[a as usize].is(1))
    {
        return None;
    }
    Some(
        s.iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(&(*i as i64)))
            .map(|(_, d)| d.clone())
            .collect(),
    )
}

/// `Expand(x, shape)`: the broadcast of the input's shape and the (symbolic) target.
pub(super) fn expand(f: &mut Facts, n: &NodeProto) {
    let (Some(s), Some(Value::Ints(_, target))) = (f.in_shape(n, 0), f.in_value(n, 1).cloned())
    else {
        return;
    };
    let out = broadcast(&s, &target);
    f.copy_type(n);
    f.set(n, 0, out, None);
}

/// `Tile(x, repeats)`: each dim times its repeat count (Whisper's decoder tiles its position
/// ids over the batch).
pub(super) fn tile(f: &mut Facts, n: &NodeProto) {
    let (Some(s), Some(Value::Ints(_, repeats))) = (f.in_shape(n, 0), f.in_value(n, 1).cloned())
    else {
        return;
    };
    if repeats.len() != s.len() {
        return;
    }
    let out: Option<Vec<Dim>> = s.iter().zip(&repeats).map(|(d, r)| d.mul(r)).collect();
    f.copy_type(n);
    f.set(n, 0, out, None);
}

/// `Flatten(axis)`: `[Π dims before axis, Π dims from axis]`.
pub(super) fn flatten(f: &mut Facts, n: &NodeProto) {
    let Some(s) = f.in_shape(n, 0) else { return };
    let r = s.len() as i64;
    let a = axis(attr::int(n, "axis").ok().flatten().unwrap_or(1), r);
    if !(0..=r).contains(&a) {
        return;
    }
    let (Some(x), Some(y)) = (product(&s[..a as usize]), product(&s[a as usize..])) else {
        return;
    };
    f.copy_type(n);
    f.set(n, 0, Some(vec![x, y]), None);
}
