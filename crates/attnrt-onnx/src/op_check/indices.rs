//! Constant indices against the extents they index: Gather, GatherElements and
//! ScatterElements along an axis, GatherND and ScatterND by tuples. ONNX Runtime fails every
//! run of such a node ("indices element out of data bounds"); tract may read out of bounds.

use super::axes::{check_axis, int_or_default};
use super::error::Problem;
use super::NodeCx;
use crate::OpError;

/// Gather, GatherElements, ScatterElements: `axis` (default 0) inside the data's rank (a
/// rank-0 data has none) and constant indices inside [-n, n) of its extent there.
pub(super) fn along_axis(cx: &NodeCx) -> Result<(), OpError> {
    let Some(data) = cx.shape(0) else {
        return Ok(());
    };
    let (axis, operand) = int_or_default(cx, "axis", 0)?;
    let at = check_axis(cx, &operand, axis, data.len(), &cx.input_phrase(0))?;
    let (Some(extent), Some(indices)) = (data[at], cx.ints(1)) else {
        return Ok(());
    };
    match indices.iter().find(|&&i| i < -extent || i >= extent) {
        Some(&index) => Err(cx.fail(Problem::IndexOutOfRange {
            operand: cx.input_operand(1, Some(indices.clone())),
            index,
            extent,
            of: format!("axis {axis} of {}", cx.input_phrase(0)),
        })),
        None => Ok(()),
    }
}

/// GatherND, ScatterND: the last extent k of the indices is at most the data's rank (less
/// GatherND's `batch_dims`), and each constant tuple's entries lie inside the extents they
/// index (ONNX's inference refuses the first; every run the second).
pub(super) fn nd(cx: &NodeCx) -> Result<(), OpError> {
    let (Some(data), Some(index_shape)) = (cx.shape(0), cx.shape(1)) else {
        return Ok(());
    };
    let batch = match cx.node.op_type.as_str() {
        "GatherND" => cx.int_attribute("batch_dims")?.unwrap_or(0).max(0) as usize,
        _ => 0,
    };
    let Some(Some(k)) = index_shape.last().copied() else {
        return Ok(()); // rank-0 indices or a symbolic k: ONNX's inference covers the first
    };
    let room = data.len().saturating_sub(batch);
    if k < 1 || k as usize > room {
        return Err(cx.fail(Problem::Value {
            operand: cx.input_operand(1, None),
            reason: format!(
                "has tuples of {k} index(es), but {} has {room} axes to index (1 to {room} per tuple)",
                cx.input_phrase(0)
            ),
        }));
    }
    let Some(indices) = cx.ints(1) else {
        return Ok(());
    };
    for (n, &index) in indices.iter().enumerate() {
        let axis = batch + n % k as usize;
        let Some(extent) = data[axis] else { continue };
        if index < -extent || index >= extent {
            return Err(cx.fail(Problem::IndexOutOfRange {
                operand: cx.input_operand(1, Some(indices.clone())),
                index,
                extent,
                of: format!("axis {axis} of {}", cx.input_phrase(0)),
            }));
        }
    }
    Ok(())
}
