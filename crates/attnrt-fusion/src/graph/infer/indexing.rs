//! Ops that select or join parts of tensors: `Concat`, `Gather`, `Slice`, `Pad`, `Split`. On
//! 1-D integer values (shape vectors) they compute the value, so the dynamic
//! `Shape→Gather→Unsqueeze→Concat` chains exporters build for `Reshape` targets evaluate to
//! symbolic vectors such as `[B, L, 4, 16]`.

use attnrt_onnx::{attr, NodeProto};

use super::facts::{axis, Facts};
use crate::graph::dim::Dim;
use crate::graph::value::Value;

/// `Concat(axis)`: shape vectors are joined as values; other tensors by shape (the sizes
/// along the axis add up, symbolically for a cache's `past + new`).
pub(super) fn concat(f: &mut Facts, n: &NodeProto) {
    let Ok(Some(ax)) = attr::int(n, "axis") else {
        return;
    };
    let vals: Option<Vec<&Value>> = (0..n.input.len()).map(|i| f.in_value(n, i)).collect();
    if let Some(vals) = vals {
        // Shape vectors: 1-D integer concatenation.
        let mut out = Vec::new();
        let mut ok = ax == 0 || ax == -1;
        for v in &vals {
            match v {
                Value::Ints(d, x) if d.len() == 1 => out.extend(x.iter().cloned()),
                _ => ok = false,
            }
        }
        if ok {
            f.copy_type(n);
            f.set(n, 0, None, Some(Value::Ints(vec![out.len() as i64], out)));
            return;
        }
    }
    let shapes: Option<Vec<Vec<Dim>>> = (0..n.input.len()).map(|i| f.in_shape(n, i)).collect();
    if let Some(s) = shapes.and_then(|s| concat_shape(&s, ax)) {
        f.copy_type(n);
        f.set(n, 0, Some(s), None);
    }
}

fn concat_shape(shapes: &[Vec<Dim>], ax: i64) -> Option<Vec<Dim>> {
    let first = shapes.first()?;
    let ax = axis(ax, first.len() as i64);
    if !(0..first.len() as i64).contains(&ax) {
        return None;
    }
    let mut total = Dim::known(0);
    for s in shapes {
        if s.len() != first.len() {
            return None;
        }
        for (i, d) in s.iter().enumerate() {
            if i as i64 != ax && d != &first[i] {
                return None;
            }
        }
        total = total.add(&s[ax as usize])?;
    }
    let mut out = first.clone();
    out[ax as usize] = total;
    Some(out)
}

/// `Gather(axis)`: picks from a shape vector by known indices, else gives the output shape.
pub(super) fn gather(f: &mut Facts, n: &NodeProto) {
    let ax = attr::int(n, "axis").ok().flatten().unwrap_or(0);
    let idx_value = f.in_value(n, 1);
    let idx_shape: Option<Vec<Dim>> = match idx_value {
        Some(v) => Some(v.dims().iter().map(|&d| Dim::known(d)).collect()),
        None => f.in_shape(n, 1),
    };
    let Some(idx_shape) = idx_shape else { return };
    let idx = idx_value.and_then(Value::known_ints);
    if let (Some(Value::Ints(d, x)), Some(idx)) = (f.in_value(n, 0), idx.as_ref()) {
        if d.len() == 1 && ax == 0 {
            let idx_dims: Vec<i64> = idx_value.map(|v| v.dims().to_vec()).unwrap_or_default();
            let len = x.len() as i64;
            let picked: Option<Vec<Dim>> = idx
                .iter()
                .map(|&i| {
                    let i = if i < 0 { i + len } else { i };
                    (0..len).contains(&i).then(|| x[i as usize].clone())
                })
                .collect();
            if let Some(p) = picked {
                f.set(n, 0, None, Some(Value::Ints(idx_dims, p)));
            }
            return;
        }
    }
    let Some(s) = f.in_shape(n, 0) else { return };
    let r = s.len() as i64;
    let ax = axis(ax, r);
    if !(0..r).contains(&ax) {
        return;
    }
    let mut out: Vec<Dim> = s[..ax as usize].to_vec();
    out.extend(idx_shape.iter().cloned());
    out.extend(s[ax as usize + 1..].iter().cloned());
    f.copy_type(n);
    f.set(n, 0, Some(out), None);
}

/// `Slice(x, starts, ends, axes, steps)` with unit steps: a shape vector sliced on axis 0 as a
/// value; otherwise the output shape, where `x[:e]` with a run-time `e` is taken as `e` long.
pub(super) fn slice(f: &mut Facts, n: &NodeProto) {
    let Some(spec) = SliceSpec::of(f, n) else {
        return;
    };
    let ends_known: Option<Vec<i64>> = spec.ends.iter().map(Dim::as_known).collect();
    // A 1-D integer value (shape vector) sliced on axis 0.
    if let (Some(Value::Ints(d, x)), Some(ends)) = (f.in_value(n, 0), ends_known.as_ref()) {
        let start = spec.starts[0].as_known();
        let on_axis_0 = spec.axes.len() == 1 && (spec.axes[0] == 0 || spec.axes[0] == -1);
        if let (1, true, Some(start)) = (d.len(), on_axis_0, start) {
            let (b, e) = slice_range(start, ends[0], x.len() as i64);
            let v: Vec<Dim> = x[b as usize..e.max(b) as usize].to_vec();
            f.set(n, 0, None, Some(Value::Ints(vec![v.len() as i64], v)));
            return;
        }
    }
    let Some(mut s) = f.in_shape(n, 0) else {
        return;
    };
    let r = s.len() as i64;
    for (k, &ax) in spec.axes.iter().enumerate() {
        let ax = axis(ax, r);
        if !(0..r).contains(&ax) {
            return;
        }
        match sliced_dim(&s[ax as usize], &spec.starts[k], &spec.ends[k]) {
            Some(d) => s[ax as usize] = d,
            None => return,
        }
    }
    f.copy_type(n);
    f.set(n, 0, Some(s), None);
}

/// The (possibly symbolic) `starts` and `ends`, and the known `axes` of a unit-step `Slice`.
struct SliceSpec {
    starts: Vec<Dim>,
    ends: Vec<Dim>,
    axes: Vec<i64>,
}

impl SliceSpec {
    fn of(f: &Facts, n: &NodeProto) -> Option<SliceSpec> {
        let get = |i: usize| f.in_value(n, i).and_then(Value::known_ints);
        let present = |i: usize| n.input.len() > i && !n.input[i].is_empty();
        let (Some(Value::Ints(_, starts)), Some(Value::Ints(_, ends))) =
            (f.in_value(n, 1), f.in_value(n, 2))
        else {
            return None;
        };
        let axes = if present(3) {
            get(3)?
        } else {
            (0..starts.len() as i64).collect()
        };
        let steps = if present(4) {
            get(4)?
        } else {
            vec![1; starts.len()]
        };
        let ok = axes.len() == starts.len()
            && ends.len() == starts.len()
            && steps.len() == starts.len()
            && steps.iter().all(|&s| s == 1);
        ok.then(|| SliceSpec {
            starts: starts.clone(),
            ends: ends.clone(),
            axes,
        })
    }
}

/// The size of dim `d` sliced `[start:end]` (unit step), when it can be said.
fn sliced_dim(d: &Dim, start: &Dim, end: &Dim) -> Option<Dim> {
    let to_end = end.as_known().is_some_and(|e| e >= i64::MAX / 2);
    let Some(start) = start.as_known() else {
        // `x[-e:]` with a run-time `e` (T5 keeps the last `e` rows of its position bias): `e`
        // rows where `d ≥ e` is provable.
        let e = Dim::known(0).sub(start)?;
        let fits = d
            .sub(&e)
            .and_then(|r| r.lower_bound())
            .is_some_and(|b| b >= 0);
        return (to_end && fits).then_some(e);
    };
    if start == 0 && to_end {
        return Some(d.clone());
    }
    if start == 0 && end.as_known().is_none() {
        // `x[:e]` with a run-time `e` (a causal buffer sliced to the sequence length): the
        // result has min(d, e) rows. It is taken as `e`: where e > d the original graph fails
        // at the first broadcast against an e-sized tensor anyway.
        return (d == end || d.as_known().is_some()).then(|| end.clone());
    }
    let (len, e) = (d.as_known()?, end.as_known()?);
    if len < 0 {
        return None; // a hostile model's negative extent: nothing to infer
    }
    let (b, e) = slice_range(start, e, len);
    Some(Dim::known((e - b).max(0)))
}

fn slice_range(start: i64, end: i64, len: i64) -> (i64, i64) {
    let norm = |x: i64| {
        if x < 0 {
            x.saturating_add(len).clamp(0, len.max(0))
        } else {
            x.min(len)
        }
    };
    let (b, e) = (norm(start), norm(end));
    (b, e.max(b))
}

/// `Pad`: pads as an attribute (before opset 11) or an input, optional `axes` (opset 18).
pub(super) fn pad(f: &mut Facts, n: &NodeProto) {
    let Some(s) = f.in_shape(n, 0) else { return };
    let r = s.len() as i64;
    let pads: Option<Vec<i64>> = match attr::ints(n, "pads").ok().flatten() {
        Some(p) => Some(p.to_vec()),
        None => f.in_value(n, 1).and_then(Value::known_ints),
    };
    let Some(pads) = pads else { return };
    let axes: Vec<i64> = if n.input.len() > 3 && !n.input[3].is_empty() {
        match f.in_value(n, 3).and_then(Value::known_ints) {
            Some(a) => a,
            None => return,
        }
    } else {
        (0..r).collect()
    };
    if pads.len() != 2 * axes.len() {
        return;
    }
    let mut out = s;
    for (k, &a) in axes.iter().enumerate() {
        let a = axis(a, r);
        if !(0..r).contains(&a) {
            return;
        }
        let Some(add) = pads[k].checked_add(pads[k + axes.len()]) else {
            return;
        };
        let d = &out[a as usize];
        out[a as usize] = match d.as_known() {
            Some(v) => match v.checked_add(add) {
                Some(x) if x >= 0 => Dim::known(x),
                _ => return,
            },
            None if add == 0 => d.clone(),
            None => return,
        };
    }
    f.copy_type(n);
    f.set(n, 0, Some(out), None);
}

/// `Split(axis)`: sizes from the attribute, the input, or equal parts of a known dim.
pub(super) fn split(f: &mut Facts, n: &NodeProto) {
    let Some(s) = f.in_shape(n, 0) else { return };
    let r = s.len() as i64;
    let ax = axis(attr::int(n, "axis").ok().flatten().unwrap_or(0), r);
    if !(0..r).contains(&ax) {
        return;
    }
    let parts = n.output.len() as i64;
    let sizes: Option<Vec<i64>> = match attr::ints(n, "split").ok().flatten() {
        Some(sp) => Some(sp.to_vec()),
        None => match f.in_value(n, 1).and_then(Value::known_ints) {
            Some(sp) => Some(sp),
            None => s[ax as usize]
                .as_known()
                .filter(|&d| parts > 0 && d % parts == 0)
                .map(|d| vec![d / parts; parts as usize]),
        },
    };
    let Some(sizes) = sizes else { return };
    if sizes.len() != n.output.len() {
        return;
    }
    let ty = f.first_input_type(n);
    for (i, sz) in sizes.iter().enumerate() {
        let mut out = s.clone();
        out[ax as usize] = Dim::known(*sz);
        if let Some(t) = ty {
            f.set_type(n, i, t);
        }
        f.set(n, i, Some(out), None);
    }
}

/// `ScatterND` / `ScatterElements`: the data's type and shape (the values written are not
/// followed); transformers builds BART's causal mask by assigning into a full tensor.
pub(super) fn scatter(f: &mut Facts, n: &NodeProto) {
    f.copy_type(n);
    let s = f.in_shape(n, 0);
    f.set(n, 0, s, None);
}
