//! The attention core, matched from its Softmax down to the QK product:
//!
//! ```text
//! context = MatMul(probs(Softmax(layers(MatMul(Q, Kᵀ)))), V)
//! layers  = (scale | softcap | mask | skip-through)*       from the Softmax input down
//! ```
//!
//! Each layer has its own file ([`super::scale`], [`super::softcap`],
//! [`super::mask_layers`]); this file walks them in order, checks the order is one the op can
//! express (scale, then softcap, then masks), and records the path for `qk_matmul_output`.

use std::collections::BTreeSet;

use attnrt_onnx::passthrough::Passthrough;
use attnrt_onnx::{node_label, NodeProto};

use super::mask_layers;
use super::probs;
use super::qk_output::Stage;
use super::scale::{scaled_operand, Scale};
use super::softcap;
use crate::graph::skip::{self, kind_name};
use crate::graph::{Dim, GraphView};
use crate::masks::MaskLayer;
use crate::mismatch::{Check, Mismatch};
use crate::pattern::{match_tensor, op, Captures, Pat};

/// A matched attention core: Q, Kᵀ and V as the products read them, and every layer between.
#[derive(Clone, Debug)]
pub struct Core {
    /// The Softmax node.
    pub softmax: usize,
    /// The Softmax output.
    pub softmax_out: String,
    /// The QK MatMul node.
    pub qk: usize,
    /// Q as the QK MatMul reads it (after any split scale).
    pub q: String,
    /// Kᵀ as the QK MatMul reads it (after any split scale).
    pub kt: String,
    /// V as the context MatMul reads it.
    pub v: String,
    /// The context MatMul's output.
    pub output: String,
    /// The scale of every scale layer.
    pub scale: Scale,
    /// Mask layers, innermost (closest to the QK MatMul) first.
    pub masks: Vec<MaskLayer>,
    /// The softcap, when the scores are capped.
    pub softcap: Option<f32>,
    /// The scores path from the Softmax input down to the QK product, with what produced each.
    pub path: Vec<(String, Stage)>,
    /// The nodes the fused node replaces.
    pub nodes: BTreeSet<usize>,
    /// The exporter variants matched, in match order.
    pub tags: Vec<String>,
}

/// `MatMul(Q, Kᵀ)` with an optional constant or shape-computed factor on either side.
pub fn qk() -> Pat {
    op(
        "qk",
        &["MatMul"],
        [
            scaled_operand("q_scale", "q", "q_factor", "q-scale", "q"),
            scaled_operand("k_scale", "kt", "k_factor", "k-scale", "k"),
        ],
    )
}

/// Matches the core of the block whose Softmax is node `sm`.
pub fn match_core(view: &GraphView, sm: usize) -> Result<Core, Mismatch> {
    let p = probs::match_probs(view, sm)?;
    let mut core = Core {
        softmax: sm,
        softmax_out: view.node(sm).output[0].clone(),
        qk: 0,
        q: String::new(),
        kt: String::new(),
        v: p.v,
        output: p.context,
        scale: Scale::default(),
        masks: Vec::new(),
        softcap: None,
        path: Vec::new(),
        nodes: p.nodes,
        tags: p.tags,
    };
    let mut cur = p.scores;
    let qk_caps = loop {
        let at = view.producer(&cur).ok_or_else(|| {
            Mismatch::new(
                node_label(view.node(sm)),
                Check::ScoresPath,
                "scores computed by a MatMul",
                format!("scores '{cur}' are not computed by a node"),
            )
        })?;
        if view.node(at).op_type == "MatMul" {
            let mut c = Captures::default();
            match_tensor(view, &cur, &qk(), &mut c)?;
            core.path.push((cur.clone(), Stage::MatMul));
            break c;
        }
        cur = core.layer(view, at, cur)?;
    };
    core.masks.reverse();
    let qk_out = qk_caps
        .tensor("qk")
        .and_then(|t| view.shape(t))
        .map(<[Dim]>::to_vec);
    mask_layers::drop_zero_terms(view, &mut core.masks, qk_out.as_deref(), &mut core.tags);
    core.tags.extend(
        qk_caps
            .tags
            .iter()
            .filter(|t| !matches!(**t, "q" | "k"))
            .map(|t| t.to_string()),
    );
    core.nodes.extend(qk_caps.nodes.values().copied());
    core.nodes.extend(qk_caps.skipped.iter().map(|(n, _)| *n));
    core.scale.split(view, &qk_caps);
    core.qk = qk_caps.node("qk").unwrap_or(0);
    core.scale.check(view, core.qk)?;
    core.q = qk_caps.tensor("q").unwrap_or_default().to_string();
    core.kt = qk_caps.tensor("kt").unwrap_or_default().to_string();
    Ok(core)
}

impl Core {
    /// Takes the layer producing `t` (node `at`) into the core; returns the tensor below it.
    fn layer(&mut self, view: &GraphView, at: usize, t: String) -> Result<String, Mismatch> {
        let n = view.node(at);
        // A Mul is a softcap when it has the whole form, else a scale.
        let capped = match n.op_type.as_str() {
            "Mul" => softcap::layer(view, at),
            _ => None,
        };
        let (stage, inner, nodes) = match (view.passthrough(at), n.op_type.as_str(), capped) {
            (Ok(kind), _, _) => (Stage::Skip, self.skip(kind, n), vec![at]),
            (Err(Some(_)), _, _) => return Err(not_identity(view, at)),
            (Err(None), _, Some(s)) => {
                self.in_order(view, at, Stage::Softcap)?;
                self.softcap = Some(s.cap);
                self.tags.push("softcap".into());
                (Stage::Softcap, s.inner, s.nodes)
            }
            (Err(None), "Mul" | "Div", None) => {
                let inner = self.scale.layer(view, at, &t, &mut self.tags)?;
                (Stage::Scale, inner, vec![at])
            }
            (Err(None), "Add" | "Where", None) => {
                self.in_order(view, at, Stage::MaskAdd)?;
                let (layer, inner) = mask_layers::layer(view, at, &t)?;
                let stage = match layer {
                    MaskLayer::Add { .. } => Stage::MaskAdd,
                    MaskLayer::Fill { .. } => Stage::MaskFill,
                };
                self.masks.push(layer);
                (stage, inner, vec![at])
            }
            (Err(None), op, None) => {
                return Err(Mismatch::new(
                    node_label(n),
                    Check::ScoresPath,
                    "a scale, softcap, mask or skip-through node",
                    format!("{op} between the QK MatMul and the Softmax is not a scale or mask"),
                ))
            }
        };
        self.path.push((t, stage));
        self.nodes.extend(nodes);
        Ok(inner)
    }

    /// A skip-through node on the scores (the ONNX expansions' softmax_precision Cast to the
    /// type the scores already have, an Identity, an inference Dropout): tagged once per kind.
    fn skip(&mut self, kind: Passthrough, n: &NodeProto) -> String {
        let tag = format!("scores-{}", kind_name(kind));
        if !self.tags.contains(&tag) {
            self.tags.push(tag);
        }
        n.input[0].clone()
    }

    /// Checks that a softcap or mask layer (`stage`) at node `at` comes where the op applies
    /// it: the op scales, then caps, then masks.
    fn in_order(&self, view: &GraphView, at: usize, stage: Stage) -> Result<(), Mismatch> {
        let found = match stage {
            Stage::Softcap if self.softcap.is_some() => "a second softcap",
            Stage::Softcap if self.scale.seen => {
                "a scale applied after the softcap cannot be expressed by the op"
            }
            _ if stage != Stage::Softcap && self.scale.seen => {
                "a mask applied before the scale would be scaled too"
            }
            _ if stage != Stage::Softcap && self.softcap.is_some() => {
                "a mask applied before the softcap would be capped too"
            }
            _ => return Ok(()),
        };
        Err(Mismatch::new(
            node_label(view.node(at)),
            Check::LayerOrder,
            "scale, then softcap, then masks, from the QK MatMul up",
            found,
        ))
    }
}

/// The failure at node `at` on the scores path that is none of the layers and not the
/// identity at inference (a type-changing Cast, a Dropout that may train).
fn not_identity(view: &GraphView, at: usize) -> Mismatch {
    let n = view.node(at);
    Mismatch::new(
        node_label(n),
        Check::SkipThrough,
        skip::EXPECTED,
        format!(
            "{} between the QK MatMul and the Softmax is not provably the identity ({})",
            n.op_type,
            view.why_not_passthrough(at).unwrap_or_default()
        ),
    )
}
