//! Constant masks checked element by element.

use attnrt_onnx::node_label;

use super::domain::{refuse, Tri};
use crate::graph::{Dim, GraphView, Value};
use crate::mismatch::Mismatch;

/// How a constant is named in a report: its producer's label, else the tensor name quoted.
fn label(view: &GraphView, t: &str) -> String {
    view.producer(t)
        .map(|p| node_label(view.node(p)))
        .unwrap_or_else(|| format!("'{t}'"))
}

/// The elements of a known value as numbers (booleans 0/1), `None` for symbolic integers.
fn numbers(v: &Value) -> Option<Vec<f64>> {
    Some(match v {
        Value::Floats(_, x) => x.clone(),
        Value::Bools(_, x) => x.iter().map(|&b| b as u8 as f64).collect(),
        Value::Ints(_, x) => x
            .iter()
            .map(|d| d.as_known().map(|v| v as f64))
            .collect::<Option<_>>()?,
    })
}

/// A known value with every element equal.
pub(super) fn uniform_value(v: &Value) -> Option<f64> {
    let all = numbers(v)?;
    let first = *all.first()?;
    all.iter()
        .all(|&x| x == first || (x.is_nan() && first.is_nan()))
        .then_some(first)
}

/// Checks a constant element by element: is it a triangle over its last two axes?
pub(super) fn constant_tri(view: &GraphView, t: &str, v: &Value) -> Result<Tri, Mismatch> {
    let what = label(view, t);
    let vals = numbers(v).ok_or_else(|| refuse(&what, "symbolic integers"))?;
    let dims = v.dims();
    if dims.len() < 2 {
        return Err(refuse(
            &what,
            format!("a rank-{} constant, not a matrix", dims.len()),
        ));
    }
    let (rows, cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    if rows <= 0 || cols <= 0 {
        return Err(refuse(&what, "empty"));
    }
    off_by_one(&what, &vals, rows, cols)?;
    let (mut below, mut above) = (None::<f64>, None::<f64>);
    for (k, &x) in vals.iter().enumerate() {
        let k = k as i64;
        let (i, j) = ((k / cols) % rows, k % cols);
        let slot = if j <= i { &mut below } else { &mut above };
        match slot {
            None => *slot = Some(x),
            Some(y) if *y == x => {}
            Some(y) => {
                let part = if j <= i {
                    "part on/below"
                } else {
                    "part above"
                };
                return Err(refuse(
                    &what,
                    format!("element [{i}, {j}] is {x}, not {y} like the rest of the {part} the diagonal"),
                ));
            }
        }
    }
    let below = below.ok_or_else(|| refuse(&what, "no element on/below the diagonal"))?;
    // A single-column buffer has no element above the diagonal: not a triangle to trust.
    let above = above.ok_or_else(|| refuse(&what, "no element above the diagonal"))?;
    if below == above {
        return Err(refuse(&what, format!("uniform ({below}), not a triangle")));
    }
    Ok(Tri {
        below,
        above,
        rows: Dim::known(rows),
        cols: Dim::known(cols),
        diagonal: Dim::known(0),
        how: format!("constant {what} {rows}×{cols}"),
    })
}

/// A constant uniform strictly below, on and above the diagonal whose diagonal goes with the
/// part above masks `j ≥ i`: say so rather than which element breaks the triangle.
fn off_by_one(what: &str, vals: &[f64], rows: i64, cols: i64) -> Result<(), Mismatch> {
    // Region of (i, j): 0 strictly below the diagonal, 1 on it, 2 above.
    let region = |k: usize| {
        let k = k as i64;
        let (i, j) = ((k / cols) % rows, k % cols);
        (j - i).signum() + 1
    };
    let uniform_in = |r: i64| {
        let mut it = vals.iter().enumerate().filter(|(k, _)| region(*k) == r);
        let first = it.next().map(|(_, v)| *v)?;
        it.all(|(_, v)| *v == first).then_some(first)
    };
    if let (Some(b), Some(d), Some(a)) = (uniform_in(0), uniform_in(1), uniform_in(2)) {
        if d == a && d != b {
            return Err(refuse(
                what,
                format!(
                    "the diagonal holds {d} like the part above it, not {b} like the part below: \
                     it masks j ≥ i, off the causal diagonal by one"
                ),
            ));
        }
    }
    Ok(())
}
