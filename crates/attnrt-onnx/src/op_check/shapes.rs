//! Operators whose attributes or constant inputs must agree with their inputs' ranks and
//! extents: Transpose, Concat, Expand, Tile, MatMul and Gemm.

use super::axes::{attribute, check_axis};
use super::broadcast::clash;
use super::error::{Operand, Problem};
use super::facts::show_shape;
use super::NodeCx;
use crate::OpError;

/// Transpose's `perm` is a permutation of the input's axes: one entry per axis, each of
/// 0..rank once (ONNX Runtime refuses a repeat at load: "Attribute perm for Transpose has
/// repeated value"; tract would hang on it).
pub(super) fn transpose(cx: &NodeCx) -> Result<(), OpError> {
    let Some(perm) = cx.ints_attribute("perm")? else {
        return Ok(()); // the default reverses the axes
    };
    let operand = Operand::Attribute {
        name: "perm".into(),
        value: Some(perm.to_vec()),
    };
    if let Some(rank) = cx.rank(0).filter(|&r| r != perm.len()) {
        return Err(cx.fail(Problem::Length {
            operand,
            len: perm.len(),
            expected: format!("but {} has rank {rank}", cx.input_phrase(0)),
        }));
    }
    let mut seen = vec![false; perm.len()];
    for &p in perm {
        let Some(slot) = usize::try_from(p).ok().and_then(|i| seen.get_mut(i)) else {
            return Err(cx.fail(Problem::Value {
                operand,
                reason: format!("holds {p}, not an axis of 0..{}", perm.len()),
            }));
        };
        if std::mem::replace(slot, true) {
            return Err(cx.fail(Problem::RepeatedAxis { operand, axis: p }));
        }
    }
    Ok(())
}

/// Concat: `axis` is required and inside the rank; every input of stated rank has the same.
pub(super) fn concat(cx: &NodeCx) -> Result<(), OpError> {
    cx.required_attribute("axis")?;
    let axis = cx.int_attribute("axis")?.unwrap_or_default();
    let mut reference: Option<(usize, usize)> = None;
    for i in 0..cx.node.input.len() {
        let Some(rank) = cx.rank(i) else { continue };
        match reference {
            None => reference = Some((i, rank)),
            Some((j, r)) if r != rank => {
                return Err(cx.fail(Problem::Rank {
                    operand: cx.input_operand(i, None),
                    rank,
                    expected: format!(
                        "but {} has rank {r}: Concat's inputs share one rank",
                        cx.input_phrase(j)
                    ),
                }))
            }
            Some(_) => {}
        }
    }
    match reference {
        Some((j, r)) => {
            check_axis(cx, &attribute("axis", axis), axis, r, &cx.input_phrase(j)).map(drop)
        }
        None => Ok(()),
    }
}

/// Expand's constant shape: no negative extent, and it broadcasts with the input's stated
/// shape (ONNX's inference refuses both: "Incompatible dimensions").
pub(super) fn expand(cx: &NodeCx) -> Result<(), OpError> {
    let Some(target) = cx.ints(1) else {
        return Ok(());
    };
    let operand = cx.input_operand(1, Some(target.clone()));
    if let Some(&v) = target.iter().find(|&&v| v < 0) {
        return Err(cx.fail(Problem::Value {
            operand,
            reason: format!("holds {v}: an extent cannot be negative"),
        }));
    }
    let Some(input) = cx.shape(0) else {
        return Ok(());
    };
    let wanted: Vec<Option<i64>> = target.iter().map(|&v| Some(v)).collect();
    match clash(&[&input, &wanted]) {
        Some(c) => Err(cx.fail(Problem::Value {
            operand,
            reason: format!(
                "does not broadcast with {} of shape {} (extents {} and {} at dimension -{})",
                cx.input_phrase(0),
                show_shape(&input),
                c.extents.1,
                c.extents.0,
                c.from_end
            ),
        })),
        None => Ok(()),
    }
}

/// Tile's constant repeats: a 1-D list with one non-negative count per input axis.
pub(super) fn tile(cx: &NodeCx) -> Result<(), OpError> {
    let Some(repeats) = cx.ints(1) else {
        return Ok(());
    };
    let operand = cx.input_operand(1, Some(repeats.clone()));
    if let Some(r) = cx.rank(1).filter(|&r| r != 1) {
        return Err(cx.fail(Problem::Rank {
            operand,
            rank: r,
            expected: "expected 1 (a list of repeats)".into(),
        }));
    }
    if let Some(rank) = cx.rank(0).filter(|&r| r != repeats.len()) {
        return Err(cx.fail(Problem::Length {
            operand,
            len: repeats.len(),
            expected: format!("one per axis of {} of rank {rank}", cx.input_phrase(0)),
        }));
    }
    match repeats.iter().find(|&&v| v < 0) {
        Some(&v) => Err(cx.fail(Problem::Value {
            operand,
            reason: format!("holds {v}: a repeat count cannot be negative"),
        })),
        None => Ok(()),
    }
}

/// MatMul: no rank-0 operand; the contracted extents agree and the batch dimensions
/// broadcast, where stated (ONNX's inference: "Incompatible dimensions for matrix
/// multiplication").
pub(super) fn matmul(cx: &NodeCx) -> Result<(), OpError> {
    for i in 0..2 {
        if cx.rank(i) == Some(0) {
            return Err(cx.fail(Problem::Rank {
                operand: cx.input_operand(i, None),
                rank: 0,
                expected: "expected 1 or more".into(),
            }));
        }
    }
    let (Some(a), Some(b)) = (cx.shape(0), cx.shape(1)) else {
        return Ok(());
    };
    // A 1-D operand is a row (left) or a column (right) without batch dimensions.
    let k_a = a[a.len() - 1];
    let k_b = b[b.len().saturating_sub(2)];
    let batch = |s: &[Option<i64>]| s[..s.len().saturating_sub(2)].to_vec();
    let inner_clash = matches!((k_a, k_b), (Some(x), Some(y)) if x != y);
    if inner_clash || clash(&[&batch(&a), &batch(&b)]).is_some() {
        let what = if inner_clash { "contracted" } else { "batch" };
        return Err(cx.fail(Problem::Value {
            operand: cx.input_operand(1, None),
            reason: format!(
                "of shape {} does not multiply {} of shape {}: the {what} dimensions differ",
                show_shape(&b),
                cx.input_phrase(0),
                show_shape(&a)
            ),
        }));
    }
    Ok(())
}

/// Gemm: A and B are matrices and their contracted extents agree (after `transA`/`transB`).
pub(super) fn gemm(cx: &NodeCx) -> Result<(), OpError> {
    for i in 0..2 {
        if let Some(rank) = cx.rank(i).filter(|&r| r != 2) {
            return Err(cx.fail(Problem::Rank {
                operand: cx.input_operand(i, None),
                rank,
                expected: "expected 2".into(),
            }));
        }
    }
    let (Some(a), Some(b)) = (cx.shape(0), cx.shape(1)) else {
        return Ok(());
    };
    let trans_a = cx.int_attribute("transA")?.unwrap_or(0) != 0;
    let trans_b = cx.int_attribute("transB")?.unwrap_or(0) != 0;
    let k_a = a[if trans_a { 0 } else { 1 }];
    let k_b = b[if trans_b { 1 } else { 0 }];
    match (k_a, k_b) {
        (Some(x), Some(y)) if x != y => Err(cx.fail(Problem::Value {
            operand: cx.input_operand(1, None),
            reason: format!(
                "of shape {} does not multiply {} of shape {} (transA={}, transB={}): contracted extents {y} and {x}",
                show_shape(&b),
                cx.input_phrase(0),
                show_shape(&a),
                u8::from(trans_a),
                u8::from(trans_b)
            ),
        })),
        _ => Ok(()),
    }
}
