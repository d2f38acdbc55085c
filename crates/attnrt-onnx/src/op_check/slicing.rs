//! Slice and Split: the lists that say where to cut must agree with each other, with the
//! input's rank and, for Split, with the extent cut (ONNX's Slice and Split inference).

use super::axes::{attribute, check_axes, check_axis, int_or_default};
use super::error::{Operand, Problem};
use super::NodeCx;
use crate::OpError;

/// Slice: starts, ends, axes and steps (inputs 1-4 from opset 10, attributes before, without
/// steps) of one length; no step of 0; axes inside the rank, none twice; without axes, no
/// more starts than the input has axes.
pub(super) fn slice(cx: &NodeCx) -> Result<(), OpError> {
    let mut lists: Vec<(&str, Operand, Vec<i64>)> = Vec::new();
    for (index, name) in ["starts", "ends", "axes", "steps"].into_iter().enumerate() {
        if name == "steps" && cx.opset < 10 {
            continue;
        }
        if let Some((operand, values)) = cx.list(name, index + 1, 10)? {
            lists.push((name, operand, values));
        }
    }
    if let Some((first, rest)) = lists.split_first() {
        if let Some((_, operand, values)) = rest.iter().find(|l| l.2.len() != first.2.len()) {
            return Err(cx.fail(Problem::Length {
                operand: operand.clone(),
                len: values.len(),
                expected: format!("but {} has {}: they go together", first.1, first.2.len()),
            }));
        }
    }
    let find = |name: &str| lists.iter().find(|l| l.0 == name);
    if let Some((_, operand, steps)) = find("steps") {
        if steps.contains(&0) {
            return Err(cx.fail(Problem::Value {
                operand: operand.clone(),
                reason: "holds a step of 0".into(),
            }));
        }
    }
    let rank = cx.rank(0);
    match (find("axes"), lists.first()) {
        (Some((_, operand, axes)), _) => {
            check_axes(cx, operand, axes, rank, &cx.input_phrase(0), true)
        }
        // Without axes the lists cover axes 0, 1, ... in order.
        (None, Some((_, operand, values))) if cx.axes_omitted() => match rank {
            Some(r) if values.len() > r => Err(cx.fail(Problem::Length {
                operand: operand.clone(),
                len: values.len(),
                expected: format!(
                    "more than the {r} axes of {} (without axes, one value per leading axis)",
                    cx.input_phrase(0)
                ),
            })),
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

impl NodeCx<'_> {
    /// Whether Slice's axes are not given at all (rather than given but not known).
    fn axes_omitted(&self) -> bool {
        if self.opset < 10 {
            crate::attr::find(self.node, "axes").is_none()
        } else {
            self.input(3).is_none()
        }
    }
}

/// Split: the axis inside the rank; the sizes (attribute `split` before opset 13, input 1
/// from then on) non-negative, one per output, summing to the extent cut; without sizes the
/// extent splits evenly (before opset 18) or `num_outputs` says how (from 18).
pub(super) fn split(cx: &NodeCx) -> Result<(), OpError> {
    let (axis, axis_operand) = int_or_default(cx, "axis", 0)?;
    let shape = cx.shape(0);
    let extent = match &shape {
        Some(s) => s[check_axis(cx, &axis_operand, axis, s.len(), &cx.input_phrase(0))?],
        None => None,
    };
    let sizes = cx.list("split", 1, 13)?;
    let given = if cx.opset < 13 {
        crate::attr::find(cx.node, "split").is_some()
    } else {
        cx.input(1).is_some()
    };
    if cx.opset >= 18 {
        num_outputs(cx, given)?;
    }
    let outputs = cx.node.output.len();
    match sizes {
        Some((operand, sizes)) => check_sizes(cx, operand, &sizes, outputs, extent.map(|e| (axis, e))),
        None if !given && cx.opset < 18 => match extent {
            Some(e) if e % outputs as i64 != 0 => Err(cx.fail(Problem::Value {
                operand: axis_operand,
                reason: format!(
                    "cuts an extent of {e}, which {outputs} outputs of equal size cannot share (no split sizes given)"
                ),
            })),
            _ => Ok(()),
        },
        None => Ok(()),
    }
}

/// Split 18: exactly one of the `split` input and the `num_outputs` attribute.
fn num_outputs(cx: &NodeCx, sizes_given: bool) -> Result<(), OpError> {
    let count = cx.int_attribute("num_outputs")?;
    let reason = match (sizes_given, count) {
        (true, Some(_)) => "is given together with split sizes (input 1): only one may be",
        (false, None) => "is missing, and so are split sizes (input 1): one is required",
        (false, Some(n)) if n < 1 => "must be at least 1",
        _ => return Ok(()),
    };
    Err(cx.fail(Problem::Value {
        operand: match count {
            Some(n) => attribute("num_outputs", n),
            None => Operand::Attribute {
                name: "num_outputs".into(),
                value: None,
            },
        },
        reason: reason.into(),
    }))
}

fn check_sizes(
    cx: &NodeCx,
    operand: Operand,
    sizes: &[i64],
    outputs: usize,
    cut: Option<(i64, i64)>,
) -> Result<(), OpError> {
    if let Some(&v) = sizes.iter().find(|&&v| v < 0) {
        return Err(cx.fail(Problem::Value {
            operand,
            reason: format!("holds {v}: a size cannot be negative"),
        }));
    }
    if sizes.len() != outputs {
        return Err(cx.fail(Problem::Length {
            operand,
            len: sizes.len(),
            expected: format!("but the node has {outputs} output(s)"),
        }));
    }
    let total = sizes.iter().try_fold(0i64, |a, &v| a.checked_add(v));
    match (cut, total) {
        (Some((axis, e)), Some(t)) if e != t => Err(cx.fail(Problem::Value {
            operand,
            reason: format!(
                "sums to {t}, but {} has extent {e} on axis {axis}",
                cx.input_phrase(0)
            ),
        })),
        _ => Ok(()),
    }
}
