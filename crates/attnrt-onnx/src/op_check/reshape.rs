//! Reshape with a target the file fixes (input 1 from opset 5, the `shape` attribute before):
//! the rules of ONNX's Reshape shape inference (onnx/defs/tensor/defs.cc) and of every run.
//!
//! - extents are -1 (inferred, at most once), 0 (a copy of the input's extent at the same
//!   position, unless `allowzero`) or positive;
//! - a copied 0 needs that position in the input; `allowzero` with both 0 and -1 is invalid;
//! - when the input's shape is fully fixed, the target holds the same number of elements.

use super::error::{Operand, Problem};
use super::facts::{show_shape, Shape};
use super::NodeCx;
use crate::OpError;

pub(super) fn check(cx: &NodeCx) -> Result<(), OpError> {
    let Some((operand, target)) = cx.list("shape", 1, 5)? else {
        return Ok(());
    };
    if let Some(rank) = cx.rank(1).filter(|&r| r != 1 && cx.opset >= 5) {
        return Err(cx.fail(Problem::Rank {
            operand,
            rank,
            expected: "expected 1 (a shape is a list of extents)".into(),
        }));
    }
    let allowzero = cx.int_attribute("allowzero")?.unwrap_or(0) != 0;
    let bad = |reason: String| {
        cx.fail(Problem::Value {
            operand: operand.clone(),
            reason,
        })
    };
    if let Some(&v) = target.iter().find(|&&v| v < -1) {
        return Err(bad(format!(
            "holds {v}: an extent is -1 (inferred), 0 (copied) or positive"
        )));
    }
    if target.iter().filter(|&&v| v == -1).count() > 1 {
        return Err(bad("has more than one -1".into()));
    }
    if allowzero && target.contains(&0) && target.contains(&-1) {
        return Err(bad(
            "holds both 0 and -1 with allowzero=1: the -1 cannot be inferred".into(),
        ));
    }
    let input = cx.shape(0);
    if let (Some(input), false) = (&input, allowzero) {
        if let Some(at) = target.iter().skip(input.len()).position(|&v| v == 0) {
            return Err(bad(format!(
                "holds 0 at position {}, a copy of a dimension {} of rank {} does not have",
                at + input.len(),
                cx.input_phrase(0),
                input.len()
            )));
        }
    }
    match input {
        Some(input) => check_count(cx, &operand, &target, &input, allowzero),
        None => Ok(()),
    }
}

/// The element count of the target against that of a fully fixed input shape.
fn check_count(
    cx: &NodeCx,
    operand: &Operand,
    target: &[i64],
    input: &Shape,
    allowzero: bool,
) -> Result<(), OpError> {
    let Some(have) = product(input.iter().copied()) else {
        return Ok(()); // a symbolic extent, or too large to count
    };
    // Extents with 0 resolved to the input's; -1 left out.
    let resolved = target
        .iter()
        .enumerate()
        .filter(|(_, &v)| v != -1)
        .map(|(i, &v)| {
            if v == 0 && !allowzero {
                input[i]
            } else {
                Some(v)
            }
        });
    let Some(asked) = product(resolved) else {
        return Ok(());
    };
    let infers = target.contains(&-1);
    let fits = if infers {
        asked == 0 || have % asked == 0
    } else {
        asked == have
    };
    if fits {
        return Ok(());
    }
    let asks = if infers {
        format!("a multiple of {asked} elements (with its -1)")
    } else {
        format!("{asked} elements")
    };
    Err(cx.fail(Problem::Value {
        operand: operand.clone(),
        reason: format!(
            "asks for {asks}, but {} of shape {} has {have}",
            cx.input_phrase(0),
            show_shape(input)
        ),
    }))
}

/// The product of fixed extents; `None` when one is symbolic or the product overflows.
fn product(dims: impl IntoIterator<Item = Option<i64>>) -> Option<i64> {
    dims.into_iter()
        .try_fold(1i64, |acc, d| d.and_then(|d| acc.checked_mul(d)))
}
