//! Attention fusion for ONNX models exported from PyTorch.
//!
//! [`fuse`] finds every multi-head-attention block (QK MatMul → scale → mask → Softmax →
//! context MatMul, with the exporters' head split/merge, GQA repeat, split scales and guards
//! around it), proves it exact, and replaces it by one standard ONNX `Attention` node
//! (opset 23). Each Softmax that is not fused is reported as a [`NearMiss`] naming the node
//! and the failed check.
//!
//! A mask layer proven to be exactly the causal triangle (`key j visible iff j ≤ i`, Lq = Lk)
//! becomes `is_causal=1` (the kernel then skips the key blocks above the diagonal); whatever
//! else that layer masked (padding) stays as `attn_mask`. Each block's report says how the
//! triangle was proven, or why `is_causal` was not used.
//!
//! How it is built: [`fuse`] runs two passes in order (and, between them, gives the `Attention`
//! nodes already in the model their cache joins), each pass a [`pass::FusionPass`] that the one
//! driver [`pass::run`] takes through the same steps (find → raise the opset if the fused op
//! needs it → rematch → rewrite → validate):
//!
//! ```text
//! fuse ─ pass::run(AttentionPass)   find: rules::check on each Softmax ─► Block
//!                                   raise to 23; rematch each block on the graph the previous
//!                                   rewrite left; rewrite::rewrite ─► one `Attention` node
//!      ─ past_inputs::give_caches   `Attention` nodes already in the model (opset-23 exports)
//!                                   take over the cache joins written outside them
//!      ─ pass::run(GeluPass)        find: activations::gelu on each Tanh/Erf anchor ─► Gelus
//!                                   raise to 20; rematch after a raise; all rewritten at once
//! ```
//!
//! The attention rule ([`rules::check`]) is itself a pipeline of stages, each returning a typed
//! value to the next and none calling another:
//!
//! ```text
//! match_core ─► Core ─► Shapes ─► KInput ─┬ rank 3: batched::place ──────────────────┐
//!                                         └ rank 4: gqa ─► heads ─► kv_cache::joins  │
//!                                                   ─► three_d::layout ──────────────┴► Placed
//! ─► qk_output::tap ─► mask_plan::plan ─► Scale::attribute ─► exclusive::check ─► AttentionMatch
//! ```
//!
//! A decoder's cache joins are the one stage with two outcomes, chosen explicitly: the block
//! reading this step's K and V with the joins taken over, or, when an input of that block is
//! computed from the joins, the block reading the joined K and V
//! ([`rules::kv_cache::Takeover`]). The variants matched become the tags of the report's rule;
//! no stage reads them back.
//!
//! Modules, from the ground up (each uses only those before it):
//!
//! - [`mismatch`]: the one failure type every check returns;
//! - [`graph`]: a view with producers/consumers, skip-through nodes and a symbolic
//!   shape/value evaluator;
//! - [`pattern`]: the declarative pattern language, which looks through skip-through nodes
//!   (`Identity`, `Dropout` in inference mode, same-type `Cast`);
//! - [`masks`]: mask layers and the causal-mask proofs;
//! - [`rules`]: the attention rule's stages, one file per piece
//!   (`crates/attnrt-fusion/RULES.md` maps each file to the subgraph it matches);
//! - [`rewrite`]: emission and cleanup;
//! - [`report`]: the report and its text; [`upgrade`]: the opset raise; [`text`]: snapshots,
//!   DOT;
//! - [`pass`]: the pass trait and its driver;
//! - [`attention`]: the attention pass (Softmax candidates, one block rewritten at a time);
//! - [`past_inputs`]: `Attention` nodes already in the model take over their cache joins;
//! - [`activations`]: the GELU pass (one ONNX `Gelu` per exported GELU, all rewritten at once).

#![warn(missing_docs)]

pub mod activations;
pub mod attention;
mod branches;
pub mod graph;
pub mod masks;
pub mod mismatch;
pub mod pass;
pub mod past_inputs;
pub mod pattern;
pub mod report;
pub mod rewrite;
pub mod rules;
pub mod text;
pub mod upgrade;

use anyhow::{Context, Result};
use attnrt_onnx::{opset, validate_model, ModelProto};

use activations::GeluPass;
use attention::AttentionPass;
pub use attention::ATTENTION_OPSET;
pub use mismatch::{Check, Mismatch};
pub use report::{Fused, FusedBlock, FusionReport, NearMiss};
pub use text::{block_dot, structure_text};

/// Options of [`fuse`].
#[derive(Clone, Debug)]
pub struct FusionOptions {
    /// Refuse blocks whose fusion has caveats (results that differ from the original on edge
    /// inputs, such as rows where every key is masked).
    pub strict: bool,
    /// Also fuse GELU in its exported forms into ONNX `Gelu` ([`activations`]); on by default.
    pub gelu: bool,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions {
            strict: false,
            gelu: true,
        }
    }
}

/// Finds and fuses the attention blocks of `model`, gives the `Attention` nodes it already
/// had their cache joins ([`past_inputs`]), then (with `options.gelu`) fuses its GELUs.
pub fn fuse(model: &ModelProto, options: &FusionOptions) -> Result<Fused> {
    validate_model(model).context("the input model is not valid")?;
    let opset_before = opset::default_version(model).unwrap_or(1);
    let mut report = FusionReport {
        opset_before,
        opset_after: opset_before,
        ..Default::default()
    };
    let attention_pass = AttentionPass {
        strict: options.strict,
    };
    let attention = pass::run(&attention_pass, model, &mut report)?;
    let given = past_inputs::give_caches(attention.as_ref().unwrap_or(model), &mut report)?;
    let attention = given.or(attention);
    let base = attention.as_ref().unwrap_or(model);
    let gelu = match options.gelu {
        true => pass::run(&GeluPass, base, &mut report)?,
        false => None,
    };
    let top = gelu.or(attention);
    let branched = branches::fuse_branches(top.as_ref().unwrap_or(model), options, &mut report)?;
    match branched.or(top) {
        Some(model) => Ok(Fused { model, report }),
        None => {
            report.opset_after = opset_before;
            Ok(Fused {
                model: model.clone(),
                report,
            })
        }
    }
}
