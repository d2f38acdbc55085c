//! Masks on the attention scores: what a mask layer is ([`MaskLayer`]), whether its tensors
//! fit the scores ([`fits`], [`caveats`]), and the proofs that a layer is the causal triangle
//! or nothing at all ([`causal`]).
//!
//! This module depends only on the graph view and the failure type: the rules use it, never
//! the reverse.

pub mod causal;

use attnrt_onnx::node_label;

use crate::graph::{shape_str, Dim, GraphView};
use crate::mismatch::{Check, Mismatch};

/// One mask layer on the scores.
#[derive(Clone, Debug, PartialEq)]
pub enum MaskLayer {
    /// `scores + term`.
    Add {
        /// The `Add` node.
        node: usize,
        /// The mask value added to the scores.
        term: String,
    },
    /// `Where(cond, fill, scores)` (`masked_when_true`) or `Where(cond, scores, fill)`.
    Fill {
        /// The `Where` node.
        node: usize,
        /// Its condition value.
        cond: String,
        /// The value written where masked.
        fill: String,
        /// That value, as a number.
        fill_value: f64,
        /// Whether `true` in `cond` masks (the fill is the `Where`'s second input).
        masked_when_true: bool,
    },
}

impl MaskLayer {
    /// The node of the layer (`Add` or `Where`).
    pub fn node(&self) -> usize {
        match self {
            MaskLayer::Add { node, .. } | MaskLayer::Fill { node, .. } => *node,
        }
    }

    /// The tensors the layer reads besides the scores.
    pub fn tensors(&self) -> Vec<&String> {
        match self {
            MaskLayer::Add { term, .. } => vec![term],
            MaskLayer::Fill { cond, fill, .. } => vec![cond, fill],
        }
    }
}

/// A fill value as a reader wants it: `-3.4028234663852886e38`, not 39 digits.
pub fn fill_str(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e6 {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// Whether a mask of shape `mask` broadcasts into `scores` without enlarging them; the
/// failure is about the mask layer `node`.
pub fn fits(node: &str, mask: &[Dim], scores: &[Dim]) -> Result<(), Mismatch> {
    let refuse = |found: String| {
        Mismatch::new(
            node,
            Check::Mask,
            "a mask that broadcasts into the scores without enlarging them",
            found,
        )
    };
    if mask.len() > scores.len() {
        return Err(refuse(format!(
            "mask rank {} exceeds scores rank {}",
            mask.len(),
            scores.len()
        )));
    }
    let off = scores.len() - mask.len();
    for (i, m) in mask.iter().enumerate() {
        let s = &scores[off + i];
        let ok = m == s
            || m.is(1)
            || (s.as_known().is_some_and(|v| v > 1)
                && m.as_known().is_none_or(|mv| mv == s.as_known().unwrap()));
        if !ok {
            return Err(refuse(format!(
                "mask {} does not broadcast to scores {} (dim {} may enlarge them)",
                shape_str(mask),
                shape_str(scores),
                off + i
            )));
        }
    }
    Ok(())
}

/// Checks that every mask tensor fits the scores and that fills are usable; returns the
/// caveats the masks bring (where the fused op differs from the original on edge inputs).
pub fn caveats(
    view: &GraphView,
    masks: &[MaskLayer],
    scores_shape: &[Dim],
) -> Result<Vec<String>, Mismatch> {
    let mut caveats = Vec::new();
    for m in masks {
        let at = node_label(view.node(m.node()));
        for t in m.tensors() {
            let s = view.shape(t).ok_or_else(|| {
                Mismatch::new(
                    &at,
                    Check::Mask,
                    "mask tensors of known shape",
                    format!("shape of mask tensor '{t}' unknown"),
                )
            })?;
            fits(&at, s, scores_shape)?;
        }
        if let MaskLayer::Fill { fill_value, .. } = m {
            caveats.extend(fill_caveat(&at, *fill_value)?);
        }
    }
    caveats.dedup();
    Ok(caveats)
}

/// Fills at or below this replace a score exactly when added to it in float32: their spacing is
/// at least 2^76, so any score under 1e22 in magnitude vanishes (`s + fill == fill`).
/// transformers' `finfo(float32).min` is one.
const ABSORBING_FILL: f64 = -1.0e30;

/// The caveat of a `Where` fill fused into the op's mask (none when the fused form is exact), or
/// why the fill cannot be fused. The op adds the fill to the score, where `Where` replaces the
/// score by it: the same in float32 for an absorbing fill, so a row whose every key is masked
/// gets equal weights either way.
fn fill_caveat(at: &str, fill_value: f64) -> Result<Option<String>, Mismatch> {
    if fill_value.is_nan() || fill_value == f64::INFINITY {
        return Err(Mismatch::new(
            at,
            Check::Mask,
            "a fill that is -inf or finite",
            format!("mask fill {fill_value}"),
        ));
    }
    Ok(if fill_value == f64::NEG_INFINITY {
        Some("rows with every key masked: 0 from the ONNX Attention op, NaN in PyTorch".to_string())
    } else if fill_value <= ABSORBING_FILL {
        None
    } else {
        Some(format!(
            "masked_fill({}) fused as an additive mask: rows with every key masked differ",
            fill_str(fill_value)
        ))
    })
}
