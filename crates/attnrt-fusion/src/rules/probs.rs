//! The attention probabilities and the context product:
//!
//! ```text
//! context = MatMul(probs, V)
//! probs   = Softmax(scores, axis=-1)                                  "softmax"
//!         | Where(IsNaN(p), 0, p) with p = Softmax(scores)            "nan-guard"
//! ```
//!
//! with skip-through nodes looked through anywhere (tagged by kind in data-flow order, e.g.
//! "cast-cast"): ViT / LLaMA TorchScript exports `Softmax(dtype=float32)` as `Cast→Cast` to the
//! type it already has, `Dropout` in inference mode sits between the Softmax and the context
//! MatMul when an eval-mode model is exported without constant folding. SDPA exports add the
//! NaN guard.

use std::collections::BTreeSet;

use attnrt_onnx::{attr, node_label, NodeProto};

use crate::graph::skip::kind_name;
use crate::graph::GraphView;
use crate::mismatch::{Check, Mismatch};
use crate::pattern::{alt, any, match_tensor, op, scalar, Captures, Pat};

/// How far below the Softmax the context MatMul is looked for.
const CONTEXT_DEPTH: usize = 8;

/// The ops that may stand between the Softmax and the context MatMul: the NaN guard's and
/// the skip-through nodes'.
const BETWEEN_OPS: [&str; 5] = ["IsNaN", "Where", "Identity", "Dropout", "Cast"];

/// The Softmax of a block and what reads it up to the context MatMul.
#[derive(Clone, Debug)]
pub struct Probs {
    /// The Softmax node.
    pub softmax: usize,
    /// The Softmax input: the masked, scaled scores.
    pub scores: String,
    /// The context MatMul's output.
    pub context: String,
    /// V, the context MatMul's second input.
    pub v: String,
    /// The nodes from the Softmax to the context MatMul.
    pub nodes: BTreeSet<usize>,
    /// The exporter variants matched.
    pub tags: Vec<String>,
}

/// Checks that Softmax node `n` normalises the last (key) axis.
pub fn softmax_last_axis(view: &GraphView, n: &NodeProto) -> Result<(), Mismatch> {
    let refuse = |found: String| {
        Mismatch::new(
            node_label(n),
            Check::SoftmaxAxis,
            "the last (key) axis",
            found,
        )
    };
    // Before opset 13 Softmax flattens from `axis` (default 1); axis = rank-1 is still the
    // last axis. The caller passes models with opset < 13 only with an explicit axis.
    let axis = attr::int(n, "axis")
        .map_err(|e| refuse(e.to_string()))?
        .unwrap_or(-1);
    if axis == -1 {
        return Ok(());
    }
    let rank = n
        .input
        .first()
        .and_then(|i| view.rank(i))
        .ok_or_else(|| refuse("rank of the Softmax input is unknown".into()))?;
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    if axis != rank as i64 - 1 {
        return Err(refuse(format!(
            "softmax over axis {axis} of a rank-{rank} tensor, not the last (key) axis"
        )));
    }
    Ok(())
}

fn zero_fill(view: &GraphView, n: &NodeProto) -> Result<(), Mismatch> {
    let v = n
        .input
        .get(1)
        .and_then(|t| view.value(t))
        .and_then(|v| v.scalar_f64());
    if v != Some(0.0) {
        return Err(Mismatch::new(
            node_label(n),
            Check::NanGuard,
            "Where(IsNaN(p), 0, p)",
            "the NaN guard does not replace NaN by 0",
        ));
    }
    Ok(())
}

/// `Softmax(scores)` over the last axis.
pub fn softmax() -> Pat {
    op("softmax", &["Softmax"], [any("scores")]).check(softmax_last_axis)
}

/// The attention probabilities: the Softmax, or the Softmax behind the NaN guard.
pub fn probs() -> Pat {
    alt([
        ("softmax", softmax()),
        // NaN appears only in rows whose every key is masked with -inf (or from NaN inputs);
        // the corrected Attention spec gives 0 there too.
        (
            "nan-guard",
            op(
                "guard",
                &["Where"],
                [
                    op("isnan", &["IsNaN"], [softmax()]),
                    scalar("guard_zero"),
                    softmax(),
                ],
            )
            .check(zero_fill),
        ),
    ])
}

/// `MatMul(probs, V)`.
pub fn context() -> Pat {
    op("context", &["MatMul"], [probs(), any("v")])
}

/// Matches the probabilities and the context product of the Softmax node `sm`.
pub fn match_probs(view: &GraphView, sm: usize) -> Result<Probs, Mismatch> {
    let smn = view.node(sm);
    let sm_label = node_label(smn);
    let sm_out = smn
        .output
        .first()
        .ok_or_else(|| Mismatch::new(&sm_label, Check::Context, "a Softmax output", "no output"))?;
    softmax_last_axis(view, smn)?;
    let ctx = find_context(view, sm_out).ok_or_else(|| {
        let quantized = view
            .consumers(sm_out)
            .iter()
            .any(|&c| !view.in_subgraph(c) && view.node(c).op_type == "QuantizeLinear");
        let found = if quantized {
            "the probabilities are quantized (QuantizeLinear, as a QDQ model's fake \
             quantization) before the MatMul with V: the fused kernel keeps them in float32, so \
             its result would not be the graph's"
        } else {
            "the Softmax output does not reach a MatMul with V (as its first input)"
        };
        Mismatch::new(
            &sm_label,
            Check::Context,
            "a MatMul with V reading the probabilities as its first input",
            found,
        )
    })?;
    let ctx_label = node_label(view.node(ctx));
    let ctx_out =
        view.node(ctx).output.first().ok_or_else(|| {
            Mismatch::new(&ctx_label, Check::Context, "a MatMul output", "no output")
        })?;
    let mut caps = Captures::default();
    match_tensor(view, ctx_out, &context(), &mut caps)?;
    if caps.node("softmax") != Some(sm) {
        return Err(Mismatch::new(
            ctx_label,
            Check::Context,
            format!("the probabilities of {sm_label}"),
            "the context MatMul is fed by another Softmax",
        ));
    }
    // Skip-through nodes, named in data-flow order: "cast-cast" for Softmax→Cast→Cast.
    let skipped: Vec<&str> = caps
        .skipped
        .iter()
        .rev()
        .map(|(_, k)| kind_name(*k))
        .collect();
    let tags = (!skipped.is_empty())
        .then(|| skipped.join("-"))
        .into_iter()
        .chain(
            caps.tags
                .iter()
                .filter(|t| **t != "softmax")
                .map(|t| t.to_string()),
        )
        .collect();
    Ok(Probs {
        softmax: sm,
        scores: caps.tensor("scores").unwrap_or_default().to_string(),
        context: caps.tensor("context").unwrap_or_default().to_string(),
        v: caps.tensor("v").unwrap_or_default().to_string(),
        nodes: caps
            .nodes
            .values()
            .copied()
            .chain(caps.skipped.iter().map(|(n, _)| *n))
            .collect(),
        tags,
    })
}

/// The first MatMul (breadth first, at most [`CONTEXT_DEPTH`] levels down through
/// [`BETWEEN_OPS`]) reading the Softmax output `sm_out`, or a tensor derived from it, as its
/// first input; a subgraph's nodes are not followed.
fn find_context(view: &GraphView, sm_out: &str) -> Option<usize> {
    let mut frontier = vec![sm_out.to_string()];
    for _ in 0..CONTEXT_DEPTH {
        let mut next = Vec::new();
        for t in &frontier {
            for &c in view.consumers(t).iter().filter(|&&c| !view.in_subgraph(c)) {
                let n = view.node(c);
                if n.op_type == "MatMul" && n.input.first() == Some(t) {
                    return Some(c);
                }
                if BETWEEN_OPS.contains(&n.op_type.as_str()) {
                    next.extend(n.output.iter().cloned());
                }
            }
        }
        frontier = next;
    }
    None
}
