//! The attention rule, as a pipeline of stages that each hand a typed value to the next
//! ([`check`]):
//!
//! ```text
//! Softmax ─ core::match_core ──────► Core            Q·Kᵀ → scale → softcap → mask → Softmax → ·V
//!         ─ Shapes::of ────────────► Shapes          ranks and shapes of Q, Kᵀ, V
//!         ─ k_transpose::from_kt ──► KInput          K as the op reads it (source + perm)
//! rank 3  ─ batched::place ────────► Placed          (N, L, d) products: B = 1, N heads
//! rank 4  ─ gqa::before_repeat ────► BeforeRepeat?   K and V before a grouped-query repeat
//!         ─ heads::check ──────────► KvOperands      one batch, heads that match
//!         ─ kv_cache::joins ───────► Joins           Absent | Kept(why) | Found(joins)
//!         ─ three_d::layout ───────► HeadLayout      ThreeD | FourD(why)       ─► Placed
//!         ─ qk_output::tap ────────► QkTap?          a scores tensor the op must also output
//!         ─ mask_plan::plan ───────► MaskPlan        is_causal, attn_mask, caveats
//!         ─ Scale::attribute ──────► ScaleAttr       the `scale` attribute
//!         ─ exclusive::check ──────► AttentionMatch
//! Found   ─ kv_cache::takeover ────► Takeover        Producible: that match, the joins taken
//!                                                    over; Kept(why): the block placed
//!                                                    again without them (reading the
//!                                                    joined K and V)
//! ```
//!
//! The one place with two alternatives is a decoder's cache: whether the fused node can
//! produce the joins is known only once the block reading this step's K and V is matched, so
//! [`kv_cache::Takeover`] says which of the two blocks is taken. Every check fails with a
//! [`Mismatch`] naming the node and the check. The variants matched (the tags of the report's
//! rule) are written by the core's matchers and by this pipeline from the stages' values, in
//! stage order, and never read back.
//!
//! Which file matches which subgraph (open the one your variant belongs to) and how
//! skip-through nodes are looked through: `crates/attnrt-fusion/RULES.md`. Each file's own doc
//! shows its subgraph.

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

use attnrt_onnx::node_label;

pub use self::placed::{Layout, Placed, Shapes};

use self::core::Core;
use self::heads::KvOperands;
use self::k_transpose::KInput;
use self::kv_cache::{FoundJoins, Joins, Takeover};
use self::mask_plan::MaskPlan;
use self::qk_output::QkTap;
use self::scale::ScaleAttr;
use self::three_d::HeadLayout;
use crate::graph::{Dim, GraphView};
use crate::masks::MaskLayer;
use crate::mismatch::{Check, Mismatch};

/// A proven attention block, ready to rewrite: the values of the pipeline's last stages.
#[derive(Clone, Debug)]
pub struct AttentionMatch {
    /// The block placed in its layout. Its core's nodes are those the fused node replaces
    /// (their intermediate outputs are used nowhere else); its tags, the variants matched.
    pub placed: Placed,
    /// The masks as the fused node takes them: `attn_mask` layers, `is_causal`, caveats.
    pub mask: MaskPlan,
    /// The `scale` attribute.
    pub scale: ScaleAttr,
    /// A scores-path tensor also read outside the block, produced as the fused node's
    /// `qk_matmul_output`.
    pub qk_output: Option<QkTap>,
    /// Static shapes known for Q, K, V inputs (recorded as value_info so ONNX shape inference
    /// can type the fused node when the graph itself does not say).
    pub input_shapes: Vec<(String, i32, Vec<Dim>)>,
}

/// Checks the attention rule rooted at the Softmax node `sm`. With `strict`, a causal proof
/// that would add a caveat is not used (the mask is fused as it is).
pub fn check(view: &GraphView, sm: usize, strict: bool) -> Result<AttentionMatch, Mismatch> {
    let mut core = core::match_core(view, sm)?;
    let shapes = Shapes::of(view, &core)?;
    let k = k_transpose::from_kt(view, &core.kt, shapes.rank());
    if shapes.rank() == 3 {
        let placed = batched::place(view, core, k, &shapes)?;
        return finish(view, placed, &shapes, strict);
    }
    let repeat = gqa::before_repeat(view, &k, &core.v);
    let kv = heads::check(view, &core, k, &shapes, repeat)?;
    if kv.unrepeated {
        core.tags.push("gqa".into());
    }
    match kv_cache::joins(view, &kv.k, &kv.v) {
        Joins::Absent => finish(
            view,
            place_4d(view, core, &kv, None, &shapes),
            &shapes,
            strict,
        ),
        Joins::Kept(why) => {
            core.tags.push(why.tag());
            finish(
                view,
                place_4d(view, core, &kv, None, &shapes),
                &shapes,
                strict,
            )
        }
        Joins::Found(joins) => with_cache(view, core, &kv, joins, &shapes, strict),
    }
}

/// The block of a decoder whose cache joins were found: the block reading this step's K and V
/// when the fused node can produce the joins ([`kv_cache::takeover`]), else the block reading
/// the joined K and V (tagged why: decided last, so tagged last).
fn with_cache(
    view: &GraphView,
    core: Core,
    kv: &KvOperands,
    joins: FoundJoins,
    shapes: &Shapes,
    strict: bool,
) -> Result<AttentionMatch, Mismatch> {
    let cache = joins.cache.clone();
    let mut m = finish(
        view,
        place_4d(view, core.clone(), kv, Some(joins), shapes),
        shapes,
        strict,
    )?;
    let p = &mut m.placed;
    let mut inputs = vec![p.q.as_str(), p.k.source.as_str(), p.v.as_str()];
    inputs.extend(
        m.mask
            .masks
            .iter()
            .flat_map(MaskLayer::tensors)
            .map(String::as_str),
    );
    let at = node_label(view.node(p.core.qk));
    match kv_cache::takeover(view, &cache, inputs, &at) {
        Takeover::Producible { shape_readers } => {
            // The rewrite replaces them (their outputs keep their names).
            p.core.nodes.extend(shape_readers.iter().map(|r| r.node));
            p.kv = Some(kv_cache::KvCache {
                shape_readers,
                ..cache
            });
            Ok(m)
        }
        Takeover::Kept(why) => {
            let mut m = finish(view, place_4d(view, core, kv, None, shapes), shapes, strict)?;
            m.placed.core.tags.push(why.tag());
            Ok(m)
        }
    }
}

/// Places a rank-4 core reading `kv` (or, with `joins`, this step's K and V, the joins going
/// with the block), in the 3-D layout when [`three_d::layout`] proves it.
fn place_4d(
    view: &GraphView,
    mut core: Core,
    kv: &KvOperands,
    joins: Option<FoundJoins>,
    shapes: &Shapes,
) -> Placed {
    let (k, v, cache) = match joins {
        None => (kv.k.clone(), kv.v.clone(), None),
        Some(j) => {
            core.nodes.extend(j.nodes);
            core.tags.push("kv-cache".into());
            let k = KInput {
                source: j.cache.new_key.clone(),
                perm: None,
            };
            (k, j.cache.new_value.clone(), Some(j.cache))
        }
    };
    // The joined and this step's V have the same heads and head size: the merge's check
    // holds for either.
    let layout = three_d::layout(view, &core.q, &k, &v, &core.output, &shapes.q, &kv.v_shape);
    core.tags.push(layout.tag());
    let (q, k, v, output, layout) = match layout {
        HeadLayout::ThreeD(t) => {
            core.nodes.extend(t.merge);
            let k = KInput {
                source: t.k,
                perm: None,
            };
            let (q_heads, kv_heads) = (t.q_heads, t.kv_heads);
            (t.q, k, t.v, t.output, Layout::ThreeD { q_heads, kv_heads })
        }
        HeadLayout::FourD(_) => (core.q.clone(), k, v, core.output.clone(), Layout::FourD),
    };
    Placed {
        core,
        q,
        k,
        v,
        output,
        layout,
        heads: kv.heads,
        kv: cache,
    }
}

/// The stages after the placement: the `qk_matmul_output` tap, the mask plan, the scale
/// attribute, exclusivity.
fn finish(
    view: &GraphView,
    mut p: Placed,
    shapes: &Shapes,
    strict: bool,
) -> Result<AttentionMatch, Mismatch> {
    let scores = scores_shape(view, p.core.qk)?;
    let c = &p.core;
    let tap = qk_output::tap(view, &c.path, &c.softmax_out, &c.nodes)?;
    if let Some(tap) = &tap {
        p.core.tags.push(format!("qk_matmul_output={}", tap.mode));
    }
    let tap_mode = tap.as_ref().map(|t| t.mode);
    let past = p.kv.as_ref().map(|kv| kv.past_key.as_str());
    let masks = p.core.masks.clone();
    let mask = mask_plan::plan(view, masks, &scores, tap_mode, past, strict)?;
    if mask.is_causal {
        p.core.tags.push("causal".into());
    }
    let scale = p
        .core
        .scale
        .attribute(shapes.q[shapes.rank() - 1].as_known());
    p.core.tags.extend(scale.tag().map(String::from));
    exclusive::check(view, &p, tap.as_ref().map(|t| t.tensor.as_str()))?;
    let input_shapes = [&p.q, &p.k.source, &p.v]
        .into_iter()
        .filter_map(|t| Some((t.clone(), view.elem_type(t)?, view.shape(t)?.to_vec())))
        .collect();
    Ok(AttentionMatch {
        placed: p,
        mask,
        scale,
        qk_output: tap,
        input_shapes,
    })
}

/// The shape of the scores (the output of the QK MatMul `qk`).
fn scores_shape(view: &GraphView, qk: usize) -> Result<Vec<Dim>, Mismatch> {
    let n = view.node(qk);
    view.shape(&n.output[0])
        .map(<[Dim]>::to_vec)
        .ok_or_else(|| {
            Mismatch::new(
                node_label(n),
                Check::Shapes,
                "known scores shape",
                "scores shape unknown",
            )
        })
}
