//! One fusion pass, driven the same way for every fused op ([`run`]):
//!
//! ```text
//! find      the candidates on the input model (near misses recorded)
//! raise     the default-domain opset, when the fused op needs a newer one (noted)
//! rematch   each candidate again on the model being rewritten, when it changed since
//! rewrite   the candidate's nodes replaced by the fused node (report entries recorded)
//! validate  the model after each rewrite
//! ```
//!
//! A [`FusionPass`] says what each step means for its op: attention ([`crate::attention`])
//! rewrites one block at a time, each proven again on the graph the previous one left; GELU
//! ([`crate::activations`]) proves and rewrites all GELUs of a graph as one candidate (they
//! never overlap).

use anyhow::{Context, Result};
use attnrt_onnx::{opset, validate_model, ModelProto};

use crate::report::{FusionReport, NearMiss};
use crate::upgrade::{self, UpgradeReport};

/// One fused op's steps, for [`run`].
pub trait FusionPass {
    /// A candidate proven on a model: what the rewrite replaces.
    type Candidate;

    /// The fused op, as the notes name it (`no {NAME} fused: …`).
    const NAME: &'static str;
    /// The default-domain opset the fused op needs.
    const OPSET: i64;
    /// What the opset raise note says the raise is for (empty, or ` (Gelu)`).
    const RAISE_FOR: &'static str;

    /// The candidates of `model` (of default-domain opset `opset`), in graph order; records
    /// the near misses in `report`.
    fn find(
        &self,
        model: &ModelProto,
        opset: i64,
        report: &mut FusionReport,
    ) -> Result<Vec<Self::Candidate>>;

    /// The near misses of `candidates` left unfused because the opset cannot be raised
    /// (`why`); none by default.
    fn unraisable(&self, candidates: Vec<Self::Candidate>, why: &anyhow::Error) -> Vec<NearMiss> {
        let _ = (candidates, why);
        Vec::new()
    }

    /// `candidate` proven again on `work`, which earlier steps changed (node indices may
    /// differ); `None` when it no longer holds (a near miss recorded, if the pass names one).
    fn rematch(
        &self,
        work: &ModelProto,
        candidate: Self::Candidate,
        report: &mut FusionReport,
    ) -> Result<Option<Self::Candidate>>;

    /// Replaces `candidate`'s nodes in `work` by the fused node and records it in `report`;
    /// returns what was fused, for an error after it (`attnrt/Attention_0 (Softmax …)`).
    fn rewrite(
        &self,
        work: &mut ModelProto,
        candidate: Self::Candidate,
        report: &mut FusionReport,
    ) -> Result<String>;
}

/// Runs `pass` on `model`: the model with every candidate that still holds fused, or `None`
/// when nothing was fused (near misses and notes recorded in `report` either way).
pub fn run<P: FusionPass>(
    pass: &P,
    model: &ModelProto,
    report: &mut FusionReport,
) -> Result<Option<ModelProto>> {
    let opset_now = opset::default_version(model).unwrap_or(1);
    let opset_after = report.opset_after;
    let candidates = pass.find(model, opset_now, report)?;
    if candidates.is_empty() {
        return Ok(None);
    }
    let (mut work, mut changed) = if opset_now >= P::OPSET {
        (model.clone(), false)
    } else {
        match upgrade::raise_opset(model, P::OPSET) {
            Ok((raised, how)) => {
                note_raise(report, &how, P::RAISE_FOR);
                (raised, true)
            }
            Err(e) => {
                report.notes.push(format!(
                    "no {} fused: cannot raise the opset to {}: {e:#}",
                    P::NAME,
                    P::OPSET
                ));
                report.near_misses.extend(pass.unraisable(candidates, &e));
                return Ok(None);
            }
        }
    };
    let mut fused = 0;
    for candidate in candidates {
        let proven = match changed {
            true => pass.rematch(&work, candidate, report)?,
            false => Some(candidate),
        };
        let Some(proven) = proven else { continue };
        let what = pass.rewrite(&mut work, proven, report)?;
        validate_model(&work)
            .with_context(|| format!("the model is invalid after fusing {what}"))?;
        changed = true;
        fused += 1;
    }
    if fused == 0 {
        report.opset_after = opset_after;
        return Ok(None);
    }
    Ok(Some(work))
}

/// Records an opset raise (for `what`, e.g. " (Gelu)") and its converted nodes in the notes.
fn note_raise(report: &mut FusionReport, up: &UpgradeReport, what: &str) {
    if up.from != up.to {
        report.notes.push(format!(
            "default-domain opset raised {} → {}{what}",
            up.from, up.to
        ));
    }
    report
        .notes
        .extend(up.converted.iter().map(|c| format!("converted {c}")));
    report.opset_after = up.to;
}
