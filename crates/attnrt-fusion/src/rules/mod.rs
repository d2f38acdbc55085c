//! The attention rule, as stages that each hand a typed value to the next:
//!
//! ```text
//! Softmax ─ core::match_core ──► Core         Q·Kᵀ → scale → softcap → mask → Softmax → ·V
//!         ─ Shapes::of ────────► Shapes       ranks and shapes of Q, Kᵀ, V
//!         ─ k_transpose ───────► KInput       K as the op reads it (source + perm)
//!         ─ batched | heads ───► Placed       layout: 4-D (GQA un-repeated, cache joins
//!                                             taken over: kv_cache), 3-D, batched
//!         ─ qk_output::tap ────► QkTap        a scores tensor the op must also output
//!         ─ mask_plan::plan ───► MaskPlan     is_causal, attn_mask, caveats
//!         ─ exclusive ─────────► AttentionMatch
//! ```
//!
//! Every check fails with a [`Mismatch`] naming the node and the check. Which file matches
//! which subgraph (open the one your variant belongs to), how skip-through nodes are looked
//! through, and where a KV-cache stage would go: `crates/attnrt-fusion/RULES.md`. Each file's
//! own doc shows its subgraph.

pub mod batched;
pub mod core;
pub mod exclusive;
pub mod gqa;
pub mod heads;
pub mod k_transpose;
pub mod kv_cache;
pub mod mask_layers;
pub mod mask_plan;
pub mod placed;
pub mod probs;
pub mod qk_output;
pub mod scale;
pub mod softcap;
pub mod three_d;

use std::collections::BTreeSet;

use attnrt_onnx::node_label;

pub use self::placed::{Layout, Placed, Shapes};

use self::k_transpose::KInput;
use self::qk_output::QkTap;
use crate::graph::{Dim, GraphView};
use crate::masks::MaskLayer;
use crate::mismatch::{Check, Mismatch};

/// A proven attention block, ready to rewrite.
#[derive(Clone, Debug)]
pub struct AttentionMatch {
    /// The Softmax node index.
    pub softmax: usize,
    /// Nodes replaced by the fused node (their intermediate outputs are used nowhere else).
    pub core: BTreeSet<usize>,
    /// The tensor the fused node produces (same name as in the original graph).
    pub output: String,
    /// Q input.
    pub q: String,
    /// K input.
    pub k: KInput,
    /// V input.
    pub v: String,
    /// Layout.
    pub layout: Layout,
    /// The scale to emit (`None`: the op's default 1/sqrt(head_size)).
    pub scale_attr: Option<f32>,
    /// Mask layers left for `attn_mask`, innermost (closest to the QK MatMul) first.
    pub masks: Vec<MaskLayer>,
    /// Variant tags (for the report).
    pub tags: Vec<String>,
    /// Known deviations from the original on edge inputs.
    pub caveats: Vec<String>,
    /// Heads of Q and K/V when known.
    pub heads: (Option<i64>, Option<i64>),
    /// Whether the mask must be expanded to `[.., Lq, Lk]`: ONNX Runtime's Attention kernel
    /// does not broadcast the mask's last two axes although the spec allows it.
    pub expand_mask: bool,
    /// Whether a mask layer was proven to be the causal triangle (emitted as `is_causal=1`).
    pub is_causal: bool,
    /// Why `is_causal` was or was not used (`None` when the block has no mask).
    pub causal_note: Option<String>,
    /// `softcap · tanh(scores / softcap)` between the scale and the mask.
    pub softcap: Option<f32>,
    /// A scores-path tensor also read outside the block, produced as the fused node's
    /// `qk_matmul_output`.
    pub qk_output: Option<QkTap>,
    /// Static shapes known for Q, K, V inputs (recorded as value_info so ONNX shape inference
    /// can type the fused node when the graph itself does not say).
    pub input_shapes: Vec<(String, i32, Vec<Dim>)>,
    /// A decoder's cache joins the fused node takes over (`past_*` in, `present_*` out).
    pub kv_cache: Option<kv_cache::KvCache>,
}

/// Checks the attention rule rooted at the Softmax node `sm`. With `strict`, a causal proof
/// that would add a caveat is not used (the mask is fused as it is).
pub fn check(view: &GraphView, sm: usize, strict: bool) -> Result<AttentionMatch, Mismatch> {
    match check_with(view, sm, strict, true) {
        // The fused node cannot produce the cache joins its own inputs are computed from: the
        // block still fuses, reading the joined K and V as a decoder without cache would.
        Err(m) if m.check == Check::KvCache => {
            let mut kept = check_with(view, sm, strict, false)?;
            kept.tags.push(format!("cache-concat kept ({})", m.found));
            Ok(kept)
        }
        other => other,
    }
}

/// [`check`], taking a decoder's cache joins over when `absorb_cache`.
fn check_with(
    view: &GraphView,
    sm: usize,
    strict: bool,
    absorb_cache: bool,
) -> Result<AttentionMatch, Mismatch> {
    let core = core::match_core(view, sm)?;
    let shapes = Shapes::of(view, &core)?;
    let k = k_transpose::from_kt(view, &core.kt, shapes.rank());
    let mut p = match shapes.rank() {
        3 => batched::place(view, core, k, &shapes)?,
        _ => heads::place(view, core, k, &shapes, absorb_cache)?,
    };
    let qk_label = node_label(view.node(p.core.qk));
    let scores = view
        .shape(&view.node(p.core.qk).output[0])
        .ok_or_else(|| {
            Mismatch::new(
                &qk_label,
                Check::Shapes,
                "known scores shape",
                "scores shape unknown",
            )
        })?
        .to_vec();
    let c = &p.core;
    let tap = qk_output::tap(view, &c.path, &c.softmax_out, &c.nodes)?;
    if let Some(tap) = &tap {
        p.core.tags.push(format!("qk_matmul_output={}", tap.mode));
    }
    let masks = std::mem::take(&mut p.core.masks);
    let tap_mode = tap.as_ref().map(|t| t.mode);
    let past = p.kv.as_ref().map(|kv| kv.past_key.as_str());
    let plan = mask_plan::plan(
        view,
        masks,
        &scores,
        tap_mode,
        past,
        strict,
        &mut p.core.tags,
    )?;
    let head_size = shapes.q[shapes.rank() - 1].as_known();
    let scale_attr = p.core.scale.attribute(head_size, &mut p.core.tags);
    exclusive::check(view, &p, tap.as_ref().map(|t| t.tensor.as_str()))?;
    kv_cache::check_acyclic(view, &mut p, &plan.masks)?;
    let input_shapes = [&p.q, &p.k.source, &p.v]
        .into_iter()
        .filter_map(|t| Some((t.clone(), view.elem_type(t)?, view.shape(t)?.to_vec())))
        .collect();
    Ok(AttentionMatch {
        softmax: sm,
        core: p.core.nodes,
        output: p.output,
        q: p.q,
        k: p.k,
        v: p.v,
        layout: p.layout,
        scale_attr,
        masks: plan.masks,
        tags: p.core.tags,
        caveats: plan.caveats,
        heads: p.heads,
        expand_mask: plan.expand,
        is_causal: plan.is_causal,
        causal_note: plan.causal_note,
        softcap: p.core.softcap,
        qk_output: tap,
        input_shapes,
        kv_cache: p.kv,
    })
}
