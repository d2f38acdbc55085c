//! Mask layers on the scores, between the scale and the Softmax:
//!
//! ```text
//! Add(scores, term) | Add(term, scores)                     additive ("add")
//! Where(cond, fill, scores)                                 masked_fill ("where")
//! Where(cond, scores, fill)                                 keep-where-true ("where-keep")
//! ```
//!
//! `fill` is a number known before run time. Which `Add` operand is the scores is the one that
//! leads back to the QK MatMul. An additive term proven to be all zeros is dropped.

use attnrt_onnx::node_label;

use crate::graph::{Dim, GraphView};
use crate::masks::{causal, fits, MaskLayer};
use crate::mismatch::{Check, Mismatch};
use crate::pattern::{alt, any, match_tensor, op, scalar, Captures, Pat};

/// How many scale/mask/cast nodes [`reaches_matmul`] looks through.
const SCORES_DEPTH: usize = 8;

/// One mask layer: an additive term, or masked_fill as `Where`.
pub fn mask_layer() -> Pat {
    alt([
        (
            "where",
            op(
                "mask",
                &["Where"],
                [any("cond"), scalar("fill"), any("inner")],
            ),
        ),
        (
            "where-keep",
            op(
                "mask",
                &["Where"],
                [any("cond"), any("inner"), scalar("fill")],
            ),
        ),
        ("add", op("mask", &["Add"], [any("inner"), any("term")])),
        ("add", op("mask", &["Add"], [any("term"), any("inner")])),
    ])
}

/// The mask layer producing `t` (node `p`): the layer and the masked tensor below it.
pub fn layer(view: &GraphView, p: usize, t: &str) -> Result<(MaskLayer, String), Mismatch> {
    let pn = view.node(p);
    let mut c = Captures::default();
    match_tensor(view, t, &mask_layer(), &mut c)?;
    if c.has_tag("add") {
        // Which operand is the scores path: the one a MatMul/Mul/Div/Add/Where chain reaches
        // the QK MatMul through; the first that does wins.
        let (a, b) = (&pn.input[0], &pn.input[1]);
        let leads = |t: &str| reaches_matmul(view, t, SCORES_DEPTH);
        let (inner, term) = if leads(a) {
            (a.clone(), b.clone())
        } else if leads(b) {
            (b.clone(), a.clone())
        } else {
            return Err(Mismatch::new(
                node_label(pn),
                Check::ScoresPath,
                "one Add operand leading to the QK MatMul",
                "neither Add operand leads to the QK MatMul",
            ));
        };
        return Ok((MaskLayer::Add { node: p, term }, inner));
    }
    let fill = c.tensor("fill").unwrap_or_default().to_string();
    let fill_value = view
        .value(&fill)
        .and_then(|v| v.scalar_f64())
        .unwrap_or(f64::NAN);
    let layer = MaskLayer::Fill {
        node: p,
        cond: c.tensor("cond").unwrap_or_default().to_string(),
        fill,
        fill_value,
        masked_when_true: c.has_tag("where"),
    };
    Ok((layer, c.tensor("inner").unwrap_or_default().to_string()))
}

/// Whether `t` reaches a MatMul through at most `depth` Mul/Div/Add/Where/Cast/Tanh or
/// skip-through nodes.
fn reaches_matmul(view: &GraphView, t: &str, depth: usize) -> bool {
    let Some(p) = view.producer(t) else {
        return false;
    };
    let n = view.node(p);
    match n.op_type.as_str() {
        "MatMul" => true,
        "Mul" | "Div" | "Add" | "Where" | "Cast" | "Tanh" | "Identity" | "Dropout" if depth > 0 => {
            // Where's condition is not a value path.
            let skip = usize::from(n.op_type == "Where");
            n.input
                .iter()
                .skip(skip)
                .any(|i| view.value(i).is_none() && reaches_matmul(view, i, depth - 1))
        }
        _ => false,
    }
}

/// Drops additive layers whose term is provably all zeros (x + 0 = x, also for -0), unless
/// the term would broadcast the scores (`qk_out`) to a larger shape; tags each drop.
pub fn drop_zero_terms(
    view: &GraphView,
    masks: &mut Vec<MaskLayer>,
    qk_out: Option<&[Dim]>,
    tags: &mut Vec<String>,
) {
    masks.retain(|m| {
        let MaskLayer::Add { term, .. } = m else {
            return true;
        };
        let fits =
            matches!((view.shape(term), qk_out), (Some(s), Some(q)) if fits("", s, q).is_ok());
        let zero = fits && causal::is_zero(view, term);
        if zero {
            tags.push("zero-mask-dropped".into());
        }
        !zero
    });
}
