//! Comparisons of key and query positions: `Range(0, L, 1)` laid out on the key axis against
//! the same on the query axis, as transformers builds its causal masks.

use attnrt_onnx::{attr, node_label};

use super::domain::{int_dim, known_int, refuse, Sym, Tri, MAX_DEPTH};
use crate::graph::{Dim, GraphView, Value};
use crate::mismatch::Mismatch;

/// `Range(start, L, 1)` (plus an integer, possibly a length read from a shape such as the
/// past length) laid out along one axis: element value = position along that axis + `offset`.
#[derive(Clone, Debug)]
struct Index {
    /// The axis, counted from the last (0) — broadcasting aligns axes from the end.
    from_end: usize,
    len: Dim,
    offset: Dim,
}

/// `t` as an arange laid out on one axis.
fn index(view: &GraphView, t: &str, depth: usize) -> Result<Index, Mismatch> {
    if depth > MAX_DEPTH {
        return Err(refuse(format!("'{t}'"), "index chain too deep"));
    }
    if view.value(t).is_some() {
        // `kv_idx >= 0` (transformers' bidirectional mask) and the like: no query axis.
        let what = view
            .producer(t)
            .map(|p| node_label(view.node(p)))
            .unwrap_or_else(|| format!("'{t}'"));
        return Err(refuse(
            what,
            "a constant, not a position on the query or key axis",
        ));
    }
    let p = view.producer(t).ok_or_else(|| {
        refuse(
            format!("'{t}'"),
            "a graph input, not an arange of positions",
        )
    })?;
    let n = view.node(p);
    let at = node_label(n);
    let input = |i: usize| n.input.get(i).map(String::as_str).unwrap_or("");
    if view.passthrough(p).is_ok() {
        return index(view, input(0), depth + 1);
    }
    match n.op_type.as_str() {
        "Range" => {
            let (start, delta) = (int_dim(view, input(0)), known_int(view, input(2)));
            if delta != Some(1) {
                return Err(refuse(&at, "delta is not the constant 1"));
            }
            let start =
                start.ok_or_else(|| refuse(&at, "start is not an integer known from shapes"))?;
            let len = view
                .shape(t)
                .and_then(|s| s.first().cloned())
                .ok_or_else(|| refuse(&at, "length unknown"))?;
            Ok(Index {
                from_end: 0,
                len,
                offset: start,
            })
        }
        "Identity" | "Cast" => index(view, input(0), depth + 1),
        "Add" | "Sub" => {
            let (a, b) = (input(0), input(1));
            let (idx, c, sub) = match (int_dim(view, a), int_dim(view, b)) {
                (None, Some(c)) => (a, c, n.op_type == "Sub"),
                (Some(c), None) if n.op_type == "Add" => (b, c, false),
                _ => {
                    return Err(refuse(
                        &at,
                        "not an index plus an integer known from shapes",
                    ))
                }
            };
            let mut i = index(view, idx, depth + 1)?;
            let moved = if sub {
                i.offset.sub(&c)
            } else {
                i.offset.add(&c)
            };
            i.offset = moved.ok_or_else(|| refuse(&at, "offset overflows"))?;
            Ok(i)
        }
        "Unsqueeze" => unsqueezed(view, n, &at, t, index(view, input(0), depth + 1)?),
        "Expand" => {
            let i = index(view, input(0), depth + 1)?;
            let (Some(ins), Some(outs)) = (view.shape(input(0)), view.shape(t)) else {
                return Err(refuse(&at, "shapes unknown"));
            };
            // Broadcasting must not stretch the index axis (a length-1 arange would repeat 0).
            let din = &ins[ins.len() - 1 - i.from_end];
            let dout = outs.get(outs.len().wrapping_sub(1 + i.from_end));
            if dout != Some(din) {
                return Err(refuse(&at, "may stretch the index axis"));
            }
            Ok(i)
        }
        op => Err(refuse(&at, format!("{op} is not an arange of positions"))),
    }
}

/// The index `i` after `Unsqueeze` node `n` (labelled `at`) producing `t`.
fn unsqueezed(
    view: &GraphView,
    n: &attnrt_onnx::NodeProto,
    at: &str,
    t: &str,
    i: Index,
) -> Result<Index, Mismatch> {
    let input0 = n.input.first().map(String::as_str).unwrap_or("");
    let (Some(ins), Some(outs)) = (view.shape(input0), view.shape(t)) else {
        return Err(refuse(at, "shapes unknown"));
    };
    let axes: Vec<i64> = match attr::ints(n, "axes").ok().flatten() {
        Some(a) => a.to_vec(),
        None => n
            .input
            .get(1)
            .and_then(|a| view.value(a))
            .and_then(Value::known_ints)
            .ok_or_else(|| refuse(at, "axes unknown"))?,
    };
    let r = outs.len() as i64;
    let axes: Vec<i64> = axes
        .iter()
        .map(|&a| if a < 0 { a + r } else { a })
        .collect();
    // The input axis p (from the start) lands on the p-th output axis not inserted.
    let p = ins.len() - 1 - i.from_end;
    let mut seen = 0;
    for o in 0..r {
        if axes.contains(&o) {
            continue;
        }
        if seen == p {
            return Ok(Index {
                from_end: (r - 1 - o) as usize,
                ..i
            });
        }
        seen += 1;
    }
    Err(refuse(at, format!("axes {axes:?} do not fit rank {r}")))
}

/// A comparison of a key index `j` with a query index `i`: a triangle only when it is exactly
/// `j ≤ i` (or its negation `j > i`).
pub(super) fn compare(view: &GraphView, t: &str) -> Result<Sym, Mismatch> {
    let n = view.node(
        view.producer(t)
            .ok_or_else(|| refuse(format!("'{t}'"), "no producer"))?,
    );
    let at = node_label(n);
    let (Some(x), Some(y)) = (n.input.first(), n.input.get(1)) else {
        return Err(refuse(&at, "needs two inputs"));
    };
    let a = index(view, x, 0).map_err(|e| e.seen_from(&at, "left side"))?;
    let b = index(view, y, 0).map_err(|e| e.seen_from(&at, "right side"))?;
    let overflow = || refuse(&at, "offsets overflow");
    // Normalise to `j - i  OP  d` with j the key (last axis) and i the query (axis -2).
    let (op, d, j, i) = match (a.from_end, b.from_end) {
        // a = j + oa, b = i + ob:  j + oa OP i + ob  ⇔  j - i OP ob - oa.
        (0, 1) => (
            n.op_type.as_str(),
            b.offset.sub(&a.offset).ok_or_else(overflow)?,
            &a,
            &b,
        ),
        // a = i + oa, b = j + ob:  i + oa OP j + ob  ⇔  j - i OP' oa - ob (OP mirrored).
        (1, 0) => {
            let mirrored = match n.op_type.as_str() {
                "Less" => "Greater",
                "LessOrEqual" => "GreaterOrEqual",
                "Greater" => "Less",
                _ => "LessOrEqual",
            };
            (
                mirrored,
                a.offset.sub(&b.offset).ok_or_else(overflow)?,
                &b,
                &a,
            )
        }
        (x, y) => {
            return Err(refuse(
                &at,
                format!(
                    "compares positions along axes -{} and -{}, not the query and key axes",
                    x + 1,
                    y + 1
                ),
            ))
        }
    };
    let (below, above, diagonal) = triangle_of(&at, op, &d)?;
    Ok(Sym::Tri(Tri {
        below,
        above,
        rows: i.len.clone(),
        cols: j.len.clone(),
        diagonal,
        how: format!("{} of key and query positions", n.op_type),
    }))
}

/// `j - i OP d` as (value on/below the frontier, value above, the frontier `c` of
/// `j - i ≤ c`); which frontier the op can take is decided by the caller.
fn triangle_of(at: &str, op: &str, d: &Dim) -> Result<(f64, f64, Dim), Mismatch> {
    // Integer relations as `j - i ≤ c` (true on and below the frontier) or `j - i ≥ c + 1`
    // (true above it).
    let one = Dim::known(1);
    let (le, c) = match op {
        "LessOrEqual" => (true, Some(d.clone())),
        "Less" => (true, d.sub(&one)),
        "GreaterOrEqual" => (false, d.sub(&one)),
        _ => (false, Some(d.clone())),
    };
    let c = c.ok_or_else(|| refuse(at, "offsets overflow"))?;
    Ok(if le { (1.0, 0.0, c) } else { (0.0, 1.0, c) })
}
