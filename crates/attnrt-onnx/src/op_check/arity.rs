//! Input and output counts per operator and opset, as ONNX's checker verifies them
//! (onnx/checker.cc `check_node` against the operator schema): a MatMul with one input is
//! refused here, not left to hang later.

use super::arity_bounds::Arity;
use super::arity_table::ARITY;
use super::error::Problem;
use super::NodeCx;
use crate::OpError;

/// The arity of `op_type` at `opset`, for the operators in the table.
fn arity(op_type: &str, opset: i64) -> Option<Arity> {
    let first = ARITY.partition_point(|(op, _, _)| *op < op_type);
    ARITY[first..]
        .iter()
        .take_while(|(op, since, _)| *op == op_type && *since <= opset)
        .map(|(_, _, a)| *a)
        .last()
}

/// Checks the node's input and output counts, and that no required input is left empty
/// (ONNX schemas list the required inputs first, so they are the first `min_in`).
pub(super) fn check(cx: &NodeCx) -> Result<(), OpError> {
    let n = cx.node;
    let Some(a) = arity(&n.op_type, cx.opset) else {
        return Ok(()); // not an operator of the table: the structural checks cover it
    };
    let count = n.input.len();
    if count < a.min_in || count > a.max_in {
        return Err(cx.fail(Problem::InputCount {
            op_type: n.op_type.clone(),
            count,
            min: a.min_in,
            max: a.max_in,
            opset: cx.opset,
        }));
    }
    let count = n.output.len();
    if count < a.min_out || count > a.max_out {
        return Err(cx.fail(Problem::OutputCount {
            op_type: n.op_type.clone(),
            count,
            min: a.min_out,
            max: a.max_out,
            opset: cx.opset,
        }));
    }
    match n.input.iter().take(a.min_in).position(String::is_empty) {
        Some(index) => Err(cx.fail(Problem::EmptyInput { index })),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::arity_bounds::N;
    use super::*;

    #[test]
    fn the_table_is_sorted_and_picks_the_version_in_force() {
        let sorted = ARITY
            .windows(2)
            .all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1));
        assert!(sorted, "arity_table.rs must be sorted by op then version");
        // Gemm's C became optional at opset 11; Squeeze's axes became an input at 13.
        assert_eq!(arity("Gemm", 9), Some(Arity::new(3, 3, 1, 1)));
        assert_eq!(arity("Gemm", 17), Some(Arity::new(2, 3, 1, 1)));
        assert_eq!(arity("Squeeze", 11), Some(Arity::new(1, 1, 1, 1)));
        assert_eq!(arity("Squeeze", 13), Some(Arity::new(1, 2, 1, 1)));
        assert_eq!(arity("Concat", 17), Some(Arity::new(1, N, 1, 1)));
        assert_eq!(arity("Attention", 22), None);
        assert_eq!(arity("NotAnOp", 17), None);
    }
}
