//! Proving that a mask layer is the causal triangle, so the fused node can say `is_causal=1`
//! (the kernel then skips every key block above the diagonal) instead of reading a mask.
//!
//! ONNX `Attention` (opset 23) with `is_causal=1` and no `past_key` lets query `i` see key `j`
//! iff `j ≤ i` (offset 0). This module evaluates the tensors a mask is built from in a small
//! abstract domain (`domain`) — a `Tri` holds one value on and below the diagonal (`j ≤ i`) and one
//! above it, for the last two axes — and accepts a layer only when every step is proven:
//!
//! - constants (initializers, `Constant`) are checked element by element (`constant`), and
//!   may be cut to the sequence length by `Slice`s that start at 0 on both axes (nanoGPT's /
//!   GPT-2's buffer);
//! - `Trilu` of a uniform tensor, with `k` and `upper` giving exactly the causal diagonal;
//! - comparisons of two `Range(0, L, 1)` index vectors laid out on the query and key axes
//!   (`positions`);
//! - `Equal`, `Not`, `Cast`, `Where` with constant branches, `And`/`Or` with another mask
//!   (which stays as the fused node's `attn_mask`), `Add` of zeros or of another additive mask,
//!   `Expand`/`Unsqueeze` that leave the last two axes alone, skip-through nodes (`Identity`,
//!   inference `Dropout`, same-type `Cast`) (`eval`).
//!
//! Anything else is a [`Mismatch`] saying why `is_causal` was not used.

mod constant;
mod domain;
mod eval;
mod positions;

use attnrt_onnx::node_label;

use self::domain::{refuse, strong, Rest, Sym, Tri, STRONG_FILL};
use super::{fill_str, MaskLayer};
use crate::graph::{shape_str, Dim, GraphView};
use crate::mismatch::Mismatch;

/// The proof that one mask layer is the causal rule.
#[derive(Clone, Debug)]
pub struct CausalProof {
    /// Index of the layer in the match's `masks` (innermost first).
    pub layer: usize,
    /// What replaces the layer (`None`: the layer goes away).
    pub replacement: Option<MaskLayer>,
    /// A sentence for the report: what was proven, and from what.
    pub how: String,
    /// Set when the triangle's fill is finite and another mask remains: a row whose every
    /// visible key that other mask removes spreads its weight over every key in the original
    /// (all its scores are the same fill), over the visible keys only with `is_causal`. Such a
    /// proof is not used: the layer is fused as it is.
    pub inexact: Option<String>,
}

/// Whether `t` is provably all zeros (an additive "mask" that masks nothing, such as the ONNX
/// expansions' empty `attn_bias` or ViT's `Where(Expand(true), 0, finfo.min)`).
pub fn is_zero(view: &GraphView, t: &str) -> bool {
    matches!(eval::eval(view, t), Ok(Sym::Uniform(v)) if v == 0.0)
}

/// Tries each mask layer in turn; the first that is (or contains) the causal triangle wins.
/// `scores` is the shape of the QK scores (`[.., Lq, Lk]`); `past` is the past length when the
/// fused node reads a cache (its `is_causal` frontier is then `j ≤ i + past`, bottom-right),
/// `None` without (`j ≤ i`, and then Lq must equal Lk). On failure, why each layer is not.
pub fn prove(
    view: &GraphView,
    masks: &[MaskLayer],
    scores: &[Dim],
    past: Option<&Dim>,
) -> Result<CausalProof, Vec<Mismatch>> {
    let r = scores.len();
    if r < 2 {
        return Err(vec![refuse(
            "(scores)",
            format!("scores {} have no [Lq, Lk] axes", shape_str(scores)),
        )]);
    }
    let (lq, lk) = (&scores[r - 2], &scores[r - 1]);
    if masks.is_empty() {
        return Err(vec![refuse("(scores)", "no mask")]);
    }
    let mut why = Vec::new();
    for (i, m) in masks.iter().enumerate() {
        let at = node_label(view.node(m.node()));
        match prove_layer(view, m) {
            Ok((tri, _, _)) if &tri.rows != lq || &tri.cols != lk => why.push(refuse(
                at,
                format!(
                    "the triangle ({}) is {}×{}, the scores {}: not provably [Lq, Lk]",
                    tri.how,
                    tri.rows,
                    tri.cols,
                    shape_str(scores)
                ),
            )),
            Ok((tri, _, _)) if Some(&tri.diagonal) != past.or(Some(&Dim::known(0))) => {
                why.push(off_diagonal(at, &tri, past))
            }
            Ok((tri, _, _)) if past.is_none() && lq != lk => why.push(refuse(
                at,
                format!(
                    "the triangle ({}) is causal but Lq {lq} and Lk {lk} are not provably equal \
                     (ONNX is_causal aligns differently when they differ)",
                    tri.how
                ),
            )),
            Ok(proven) => return Ok(proof(i, m, &at, proven, masks.len())),
            Err(e) => why.push(e),
        }
    }
    Err(why)
}

/// Why a triangle whose frontier is not the op's (`j ≤ i`, or `j ≤ i + past`) is refused.
fn off_diagonal(at: String, tri: &Tri, past: Option<&Dim>) -> Mismatch {
    let by = match past {
        None => tri.diagonal.clone(),
        Some(p) => tri.diagonal.sub(p).unwrap_or_else(|| tri.diagonal.clone()),
    };
    let by = match by.as_known() {
        Some(1) => "one".to_string(),
        _ => by.to_string(),
    };
    let op = match past {
        None => "j ≤ i".to_string(),
        Some(p) => format!("j ≤ i + {p} (bottom-right, with the past length)"),
    };
    refuse(
        at,
        format!(
            "keeps key j iff j - i ≤ {} ({}): off the causal diagonal by {by}; the op's is {op}",
            tri.diagonal, tri.how
        ),
    )
}

/// ` + P` for a frontier offset by a past length `P`, nothing for the top-left one.
fn frontier(tri: &Tri) -> String {
    match tri.diagonal.as_known() {
        Some(0) => String::new(),
        _ => format!(" + {}", tri.diagonal),
    }
}

/// The proof for layer `i` (`m`, labelled `at`) of `layers` mask layers.
fn proof(i: usize, m: &MaskLayer, at: &str, proven: Proven, layers: usize) -> CausalProof {
    let (tri, rest, fill) = proven;
    let node = m.node();
    let others = layers > 1 || rest != Rest::None;
    let inexact = (fill.is_finite() && others).then(|| {
        format!(
            "the triangle's fill is finite ({}) and another mask remains: a query row whose \
             every visible key that mask removes (a left-padded row) spreads its weight over all \
             keys in the original, over the visible ones only with is_causal",
            fill_str(fill)
        )
    });
    let (replacement, with) = match rest {
        Rest::None => (None, String::new()),
        Rest::Additive(term) => {
            let w = format!(" plus the additive mask '{term}'");
            (Some(MaskLayer::Add { node, term }), w)
        }
        Rest::Fill {
            cond,
            fill,
            fill_value,
            masked_when_true,
        } => {
            let w = if masked_when_true {
                format!(" or the mask '{cond}' (true = masked)")
            } else {
                format!(" and the mask '{cond}' (true = attend)")
            };
            let l = MaskLayer::Fill {
                node,
                cond,
                fill,
                fill_value,
                masked_when_true,
            };
            (Some(l), w)
        }
    };
    CausalProof {
        layer: i,
        inexact,
        replacement,
        how: format!(
            "{at} masks key j > query i{} ({}){with}",
            frontier(&tri),
            tri.how
        ),
    }
}

/// What a layer was proven to be: the triangle, what remains of the layer without it, and the
/// value the layer gave the keys above the diagonal.
type Proven = (Tri, Rest, f64);

/// The triangle of one layer, what remains of the layer without it, and the value the layer
/// gave the keys above the diagonal.
fn prove_layer(view: &GraphView, m: &MaskLayer) -> Result<Proven, Mismatch> {
    let at = node_label(view.node(m.node()));
    match m {
        MaskLayer::Add { term, .. } => {
            let (tri, rest) = additive_layer(view, &at, term)?;
            let fill = tri.above;
            Ok((tri, rest, fill))
        }
        MaskLayer::Fill {
            cond,
            fill,
            fill_value,
            masked_when_true,
            ..
        } => {
            let (tri, rest) = fill_layer(view, &at, cond, fill, *fill_value, *masked_when_true)?;
            Ok((tri, rest, *fill_value))
        }
    }
}

/// `scores + term`: the term must be 0 on/below the diagonal and strongly negative above.
fn additive_layer(view: &GraphView, at: &str, term: &str) -> Result<(Tri, Rest), Mismatch> {
    match eval::eval(view, term)? {
        Sym::Tri(t) => {
            if t.below != 0.0 || !strong(t.above) {
                return Err(refuse(
                    at,
                    format!(
                        "additive triangle ({}) is {} on/below the diagonal and {} above, not 0 \
                         and -inf (or ≤ {STRONG_FILL:e})",
                        t.how,
                        fill_str(t.below),
                        fill_str(t.above)
                    ),
                ));
            }
            Ok((t, Rest::None))
        }
        Sym::Additive(t, rest) => Ok((t, rest)),
        other => Err(refuse(
            at,
            format!("the additive mask is {}", other.describe()),
        )),
    }
}

/// `Where(cond, fill, scores)` / `Where(cond, scores, fill)`: the condition must be the
/// triangle (possibly with another mask) and the fill strong enough to remove the key.
fn fill_layer(
    view: &GraphView,
    at: &str,
    cond: &str,
    fill: &str,
    fill_value: f64,
    masked_when_true: bool,
) -> Result<(Tri, Rest), Mismatch> {
    let sym = eval::eval(view, cond)?;
    if !strong(fill_value) {
        return Err(refuse(
            at,
            format!(
                "the condition is {}, but the fill {} is not -inf nor ≤ {STRONG_FILL:e}: masked \
                 keys keep weight",
                sym.describe(),
                fill_str(fill_value)
            ),
        ));
    }
    match (sym, masked_when_true) {
        (Sym::Tri(t), true) if t.below == 0.0 && t.above == 1.0 => Ok((t, Rest::None)),
        (Sym::Tri(t), false) if t.below == 1.0 && t.above == 0.0 => Ok((t, Rest::None)),
        (Sym::MaskedOr(t, cond), true) | (Sym::KeepAnd(t, cond), false) => Ok((
            t,
            Rest::Fill {
                cond,
                fill: fill.to_string(),
                fill_value,
                masked_when_true,
            },
        )),
        (s, _) => Err(refuse(
            at,
            format!(
                "the condition is {}, not the causal rule for a Where that {}",
                s.describe(),
                if masked_when_true {
                    "masks where true"
                } else {
                    "keeps where true"
                }
            ),
        )),
    }
}
