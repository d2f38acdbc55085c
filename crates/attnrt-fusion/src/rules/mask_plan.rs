//! What the fused node does with the block's mask layers: a layer proven to be exactly the
//! causal triangle becomes `is_causal=1` (what else it masked stays as `attn_mask`); every
//! remaining term must fit the scores; the mask is expanded to `[.., Lq, Lk]` when it
//! broadcasts on those axes (ONNX Runtime's Attention kernel does not broadcast them).

use crate::graph::{broadcast, Dim, GraphView};
use crate::masks::{self, causal, MaskLayer};
use crate::mismatch::Mismatch;

/// The masks as the fused node takes them.
#[derive(Clone, Debug)]
pub struct MaskPlan {
    /// Mask layers left for `attn_mask`, innermost first.
    pub masks: Vec<MaskLayer>,
    /// Whether a layer was proven to be the causal triangle.
    pub is_causal: bool,
    /// Why `is_causal` was or was not used (`None` when the block has no mask).
    pub causal_note: Option<String>,
    /// Where the fused op differs from the original on edge inputs.
    pub caveats: Vec<String>,
    /// Whether the mask must be expanded to `[.., Lq, Lk]`.
    pub expand: bool,
}

/// Plans the masks of a block whose scores have shape `scores`. `qk_output_mode` is the
/// block's `qk_matmul_output` stage, if one is produced; `past_key` is the cache the fused node
/// reads, if any; with `strict`, a causal proof that would add a caveat is not used.
pub fn plan(
    view: &GraphView,
    masks: Vec<MaskLayer>,
    scores: &[Dim],
    qk_output_mode: Option<i64>,
    past_key: Option<&str>,
    strict: bool,
) -> Result<MaskPlan, Mismatch> {
    let base = masks::caveats(view, &masks, scores)?;
    let mut plan = MaskPlan {
        masks,
        is_causal: false,
        causal_note: None,
        caveats: Vec::new(),
        expand: false,
    };
    if qk_output_mode == Some(2) {
        plan.causal_note = Some(
            "is_causal not used: the block's qk_matmul_output (mode 2) must hold the mask as it is"
                .to_string(),
        );
    } else if !plan.masks.is_empty() {
        let past = match past_key {
            None => Ok(None),
            Some(p) => past_length(view, p).map(Some),
        };
        plan.causal_note = Some(match past {
            Ok(past) => use_causal(view, &mut plan, &base, scores, past.as_ref(), strict),
            Err(note) => note,
        });
    }
    if !plan.is_causal {
        plan.caveats.extend(base);
    }
    plan.caveats.dedup();
    plan.expand = needs_expand(view, &plan.masks, scores);
    Ok(plan)
}

/// The past length (axis 2 of `past_key [B, Hkv, P, D]`), which offsets the op's causal
/// frontier; the note when it is not known.
fn past_length(view: &GraphView, past_key: &str) -> Result<Dim, String> {
    match view.shape(past_key) {
        Some(s) if s.len() == 4 => Ok(s[2].clone()),
        _ => Err(format!(
            "is_causal not used: the shape of past_key '{past_key}' is unknown (the op's causal \
             frontier is offset by the past length)"
        )),
    }
}

/// Tries the causal proof (frontier offset by `past` when the fused node reads a cache); on
/// success replaces the proven layer in `plan`. Returns the note.
fn use_causal(
    view: &GraphView,
    plan: &mut MaskPlan,
    base: &[String],
    scores: &[Dim],
    past: Option<&Dim>,
    strict: bool,
) -> String {
    let proof = match causal::prove(view, &plan.masks, scores, past) {
        Ok(p) => p,
        Err(why) => return format!("is_causal not used: {}", joined(&why)),
    };
    if let Some(why) = &proof.inexact {
        // Exact or not at all: the mask is fused as it is (the kernel adds it as the graph does).
        return format!("is_causal not used: {why}");
    }
    let mut with = plan.masks.clone();
    match proof.replacement {
        Some(l) => with[proof.layer] = l,
        None => {
            with.remove(proof.layer);
        }
    }
    let c = match masks::caveats(view, &with, scores) {
        Ok(c) => c,
        Err(m) => {
            return format!(
                "is_causal not used: the remaining mask does not fit: {}",
                m.reason()
            )
        }
    };
    let added: Vec<&str> = c
        .iter()
        .filter(|x| !base.contains(x))
        .map(String::as_str)
        .collect();
    if strict && !added.is_empty() {
        return format!(
            "is_causal not used: strict, and it would add the caveat: {}",
            added.join("; ")
        );
    }
    plan.masks = with;
    plan.caveats.extend(c);
    plan.is_causal = true;
    format!("is_causal=1: {}", proof.how)
}

fn joined(why: &[Mismatch]) -> String {
    why.iter()
        .map(Mismatch::brief)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether the combined mask broadcasts on the scores' last two axes (or is of unknown shape).
fn needs_expand(view: &GraphView, masks: &[MaskLayer], scores: &[Dim]) -> bool {
    if masks.is_empty() {
        return false;
    }
    let parts: Vec<Vec<Dim>> = masks
        .iter()
        .flat_map(MaskLayer::tensors)
        .filter_map(|t| view.shape(t).map(<[Dim]>::to_vec))
        .collect();
    let combined = parts
        .iter()
        .skip(1)
        .try_fold(parts[0].clone(), |a, b| broadcast(&a, b));
    let r = scores.len();
    match combined {
        Some(c) if c.len() >= 2 => {
            c[c.len() - 2] != scores[r - 2] || c[c.len() - 1] != scores[r - 1]
        }
        _ => true,
    }
}
