//! `qk_matmul_output`: one scores-path tensor that is also read outside the block (the ONNX
//! expansions' `qk_matmul_output`) can be the fused node's 4th output, when it holds one of the
//! op's stages (ONNX 1.22 numbering, as attnrt's runtime implements it):
//!
//! ```text
//! 0  the scaled QK product        (MatMul, after every scale)
//! 1  after the softcap
//! 2  after the (single, additive) mask
//! 3  the Softmax output
//! ```

use std::collections::BTreeSet;

use attnrt_onnx::node_label;

use crate::graph::GraphView;
use crate::mismatch::{Check, Mismatch};

/// What produced a tensor on the scores path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stage {
    /// The QK MatMul.
    MatMul,
    /// A node that is the identity at inference.
    Skip,
    /// A scale layer.
    Scale,
    /// The softcap.
    Softcap,
    /// An additive mask layer.
    MaskAdd,
    /// A `Where` mask layer.
    MaskFill,
}

/// A scores-path tensor the fused node also outputs as `qk_matmul_output`.
#[derive(Clone, Debug, PartialEq)]
pub struct QkTap {
    /// The tensor (its name stays).
    pub tensor: String,
    /// Its `qk_matmul_output_mode`.
    pub mode: i64,
}

/// The `qk_matmul_output_mode` whose value the scores-path tensor `t` holds. `path` runs from
/// the Softmax input down to the QK product.
fn qk_stage(path: &[(String, Stage)], softmax_out: &str, t: &str) -> Option<i64> {
    if t == softmax_out {
        return Some(3);
    }
    let masks = path
        .iter()
        .filter(|(_, s)| matches!(s, Stage::MaskAdd | Stage::MaskFill))
        .count();
    let mut mode = None;
    let mut scales_left = path.iter().filter(|(_, s)| *s == Stage::Scale).count();
    // Walk up from the MatMul, carrying the stage through skip-through nodes.
    for (name, stage) in path.iter().rev() {
        mode = match stage {
            Stage::MatMul => (scales_left == 0).then_some(0),
            Stage::Skip => mode,
            Stage::Scale => {
                scales_left -= 1;
                (scales_left == 0).then_some(0)
            }
            Stage::Softcap => Some(1),
            // Where(cond, fill, x) is not `x + mask`, and two masks are summed in another order.
            Stage::MaskAdd if masks == 1 => Some(2),
            Stage::MaskAdd | Stage::MaskFill => None,
        };
        if name == t {
            return mode;
        }
    }
    None
}

/// The scores-path tensor read outside the block (`nodes`), with its mode; an error when one
/// is read outside and is no stage, or when two are.
pub fn tap(
    view: &GraphView,
    path: &[(String, Stage)],
    softmax_out: &str,
    nodes: &BTreeSet<usize>,
) -> Result<Option<QkTap>, Mismatch> {
    let mut tap: Option<QkTap> = None;
    for t in path
        .iter()
        .map(|(t, _)| t.as_str())
        .chain(std::iter::once(softmax_out))
    {
        let reader = view.consumers(t).iter().find(|c| !nodes.contains(c));
        if reader.is_none() && !view.is_graph_output(t) {
            continue;
        }
        match qk_stage(path, softmax_out, t) {
            Some(mode) if tap.is_none() => {
                tap = Some(QkTap {
                    tensor: t.to_string(),
                    mode,
                })
            }
            _ => {
                let p = view
                    .producer(t)
                    .map(|p| node_label(view.node(p)))
                    .unwrap_or_default();
                return Err(Mismatch::new(
                    p,
                    Check::QkOutput,
                    "intermediates used only inside the block, or one that is a qk_matmul_output \
                     stage",
                    format!(
                        "intermediate '{t}' is also used outside the block and is not one \
                         qk_matmul_output stage of the Attention op ({})",
                        match reader {
                            Some(&c) => format!("read by {}", view.label(c)),
                            None => "a graph output".to_string(),
                        }
                    ),
                ));
            }
        }
    }
    Ok(tap)
}
