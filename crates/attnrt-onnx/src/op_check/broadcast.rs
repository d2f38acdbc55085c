//! Multidirectional (numpy) broadcasting: extents aligned from the right must be equal or 1.
//! ONNX's shape inference refuses two fixed extents that are neither (onnx/defs/shape_inference.h,
//! `bidirectionalBroadcastShapeInference`); a symbolic extent is never a conflict.

use super::error::Problem;
use super::facts::{show_shape, Shape};
use super::NodeCx;
use crate::OpError;

/// Whether `op` broadcasts its inputs multidirectionally at `opset` (the arithmetic and
/// comparison ops from opset 7, Max/Min/Sum/Mean from 8; before, `broadcast`/`axis`
/// attributes or equal shapes ruled).
pub(super) fn is_multidirectional(op: &str, opset: i64) -> bool {
    match op {
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" | "And" | "Or"
        | "Xor" => opset >= 7,
        "Max" | "Min" | "Sum" | "Mean" => opset >= 8,
        "Where" | "Mod" | "LessOrEqual" | "GreaterOrEqual" | "BitShift" | "BitwiseAnd"
        | "BitwiseOr" | "BitwiseXor" => true,
        _ => false,
    }
}

/// Two fixed extents that cannot broadcast: of the `first`-th and `second`-th shapes given
/// to [`clash`], `from_end` dimensions from the right (1 = the last).
pub(super) struct Clash {
    pub first: usize,
    pub second: usize,
    pub from_end: usize,
    pub extents: (i64, i64),
}

/// The first clash among `shapes`, if any.
pub(super) fn clash(shapes: &[&[Option<i64>]]) -> Option<Clash> {
    let longest = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    for from_end in 1..=longest {
        // The first fixed extent other than 1 at this position, and who has it.
        let mut seen: Option<(usize, i64)> = None;
        for (k, s) in shapes.iter().enumerate() {
            let Some(Some(d)) = s.len().checked_sub(from_end).map(|i| s[i]) else {
                continue;
            };
            match seen {
                _ if d == 1 => {}
                None => seen = Some((k, d)),
                Some((first, e)) if e != d => {
                    return Some(Clash {
                        first,
                        second: k,
                        from_end,
                        extents: (e, d),
                    })
                }
                Some(_) => {}
            }
        }
    }
    None
}

/// Checks that the stated shapes of all the node's inputs broadcast together.
pub(super) fn check(cx: &NodeCx) -> Result<(), OpError> {
    let stated: Vec<(usize, Shape)> = (0..cx.node.input.len())
        .filter_map(|i| cx.shape(i).map(|s| (i, s)))
        .collect();
    let views: Vec<&[Option<i64>]> = stated.iter().map(|(_, s)| s.as_slice()).collect();
    let Some(c) = clash(&views) else {
        return Ok(());
    };
    let (a, b) = (&stated[c.first], &stated[c.second]);
    Err(cx.fail(Problem::Value {
        operand: cx.input_operand(b.0, None),
        reason: format!(
            "of shape {} does not broadcast with {} of shape {} (extents {} and {} at dimension -{})",
            show_shape(&b.1),
            cx.input_phrase(a.0),
            show_shape(&a.1),
            c.extents.1,
            c.extents.0,
            c.from_end
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::clash;

    #[test]
    fn clashes_are_fixed_extents_neither_equal_nor_one() {
        let (a, b) = ([Some(3), Some(4)], [Some(5)]);
        let c = clash(&[&a, &b]).expect("4 against 5");
        assert_eq!(
            (c.first, c.second, c.from_end, c.extents),
            (0, 1, 1, (4, 5))
        );
        assert!(clash(&[&[Some(3), Some(4)], &[Some(1), Some(4)]]).is_none());
        assert!(clash(&[&[Some(3), None], &[Some(5)]]).is_none());
        assert!(clash(&[&[Some(2), Some(1), Some(4)], &[Some(7), Some(1)]]).is_none());
        assert!(clash(&[&[], &[Some(7)]]).is_none());
    }
}
