//! Axis attributes and axes lists: inside the rank they index (ONNX's shape inference refuses
//! an axis outside [-r, r)), and not repeated where the operator's inference says so
//! (Unsqueeze, Slice, Transpose; ONNX Runtime accepts repeats in Squeeze and Reduce* axes).

use std::collections::HashSet;

use super::error::{Operand, Problem};
use super::NodeCx;
use crate::OpError;

/// `axis` counted from 0, when inside [-rank, rank) (or [-rank, rank] when `inclusive`).
pub(super) fn normalize(axis: i64, rank: usize, inclusive: bool) -> Option<usize> {
    let r = rank as i64;
    let last = if inclusive { r } else { r - 1 };
    (-r..=last)
        .contains(&axis)
        .then_some(if axis < 0 { axis + r } else { axis } as usize)
}

/// Checks one axis against `rank` (that of `of`, e.g. "input 0 'x'"); returns it from 0.
pub(super) fn check_axis(
    cx: &NodeCx,
    operand: &Operand,
    axis: i64,
    rank: usize,
    of: &str,
) -> Result<usize, OpError> {
    check_axis_in(cx, operand, axis, rank, of, false)
}

fn check_axis_in(
    cx: &NodeCx,
    operand: &Operand,
    axis: i64,
    rank: usize,
    of: &str,
    inclusive: bool,
) -> Result<usize, OpError> {
    normalize(axis, rank, inclusive).ok_or_else(|| {
        cx.fail(Problem::AxisOutOfRange {
            operand: operand.clone(),
            axis,
            rank,
            of: of.to_string(),
            inclusive,
        })
    })
}

/// Checks every axis of a list against `rank` when known and, with `unique`, that no axis
/// repeats (with the rank unknown only a literal repeat can be told).
pub(super) fn check_axes(
    cx: &NodeCx,
    operand: &Operand,
    axes: &[i64],
    rank: Option<usize>,
    of: &str,
    unique: bool,
) -> Result<(), OpError> {
    let mut seen = HashSet::new();
    for &axis in axes {
        let key = match rank {
            Some(r) => check_axis(cx, operand, axis, r, of)? as i64,
            None => axis,
        };
        if unique && !seen.insert(key) {
            return Err(cx.fail(Problem::RepeatedAxis {
                operand: operand.clone(),
                axis,
            }));
        }
    }
    Ok(())
}

/// The operand of attribute `name` holding `value`.
pub(super) fn attribute(name: &str, value: i64) -> Operand {
    Operand::IntAttribute {
        name: name.to_string(),
        value,
        default: false,
    }
}

/// `INT` attribute `name` of the node, or `default` when the node leaves it out, with its
/// operand.
pub(super) fn int_or_default(
    cx: &NodeCx,
    name: &str,
    default: i64,
) -> Result<(i64, Operand), OpError> {
    let given = cx.int_attribute(name)?;
    let value = given.unwrap_or(default);
    let operand = Operand::IntAttribute {
        name: name.to_string(),
        value,
        default: given.is_none(),
    };
    Ok((value, operand))
}

/// An `axis` attribute (default `default`) indexing input 0's rank: ArgMax, TopK,
/// LayerNormalization, ...
pub(super) fn axis_attribute(cx: &NodeCx, default: i64) -> Result<(), OpError> {
    let Some(rank) = cx.rank(0) else {
        return Ok(());
    };
    let (axis, operand) = int_or_default(cx, "axis", default)?;
    check_axis(cx, &operand, axis, rank, &cx.input_phrase(0)).map(drop)
}

/// Softmax, LogSoftmax and Hardmax: the default axis was 1 before opset 13 (the input
/// flattened to 2-D from there), -1 since; a rank-0 input has no axis at all.
pub(super) fn softmax(cx: &NodeCx) -> Result<(), OpError> {
    axis_attribute(cx, if cx.opset < 13 { 1 } else { -1 })
}

/// Flatten's axis may also equal the rank (everything in the first dimension).
pub(super) fn flatten(cx: &NodeCx) -> Result<(), OpError> {
    let Some(rank) = cx.rank(0) else {
        return Ok(());
    };
    let (axis, operand) = int_or_default(cx, "axis", 1)?;
    check_axis_in(cx, &operand, axis, rank, &cx.input_phrase(0), true).map(drop)
}

/// CumSum takes its axis as input 1, a scalar.
pub(super) fn cumsum(cx: &NodeCx) -> Result<(), OpError> {
    let (Some(rank), Some(axis)) = (cx.rank(0), cx.ints(1)) else {
        return Ok(());
    };
    let operand = cx.input_operand(1, Some(axis.clone()));
    match axis.as_slice() {
        [a] => check_axis(cx, &operand, *a, rank, &cx.input_phrase(0)).map(drop),
        _ => Err(cx.fail(Problem::Length {
            operand,
            len: axis.len(),
            expected: "expected one axis".into(),
        })),
    }
}

/// Reduce* axes: an attribute until ReduceSum 13 / the others 18, input 1 from then on.
pub(super) fn reduce(cx: &NodeCx) -> Result<(), OpError> {
    let input_from = if cx.node.op_type == "ReduceSum" {
        13
    } else {
        18
    };
    let Some((operand, axes)) = cx.list("axes", 1, input_from)? else {
        return Ok(());
    };
    check_axes(cx, &operand, &axes, cx.rank(0), &cx.input_phrase(0), false)
}

/// Squeeze: axes inside the input's rank, each of a dimension of extent 1.
pub(super) fn squeeze(cx: &NodeCx) -> Result<(), OpError> {
    let Some((operand, axes)) = cx.list("axes", 1, 13)? else {
        return Ok(());
    };
    let Some(shape) = cx.shape(0) else {
        return Ok(());
    };
    for &axis in &axes {
        let at = check_axis(cx, &operand, axis, shape.len(), &cx.input_phrase(0))?;
        if let Some(extent) = shape[at].filter(|&d| d != 1) {
            return Err(cx.fail(Problem::Value {
                operand,
                reason: format!(
                    "selects axis {axis} of {}, of extent {extent}: only an extent of 1 can be squeezed",
                    cx.input_phrase(0)
                ),
            }));
        }
    }
    Ok(())
}

/// Unsqueeze: axes index the output, whose rank is the input's plus one per axis, and may not
/// repeat; before opset 13 the attribute is required.
pub(super) fn unsqueeze(cx: &NodeCx) -> Result<(), OpError> {
    let Some((operand, axes)) = cx.list("axes", 1, 13)? else {
        return if cx.opset < 13 {
            cx.required_attribute("axes")
        } else {
            Ok(())
        };
    };
    let rank = cx.rank(0).map(|r| r + axes.len());
    check_axes(cx, &operand, &axes, rank, "the output", true)
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn normalize_counts_negative_axes_from_the_end() {
        assert_eq!(normalize(-1, 4, false), Some(3));
        assert_eq!(normalize(-4, 4, false), Some(0));
        assert_eq!(normalize(3, 4, false), Some(3));
        assert_eq!(normalize(4, 4, false), None);
        assert_eq!(normalize(-5, 4, false), None);
        assert_eq!(normalize(4, 4, true), Some(4));
        assert_eq!(normalize(0, 0, false), None);
    }
}
