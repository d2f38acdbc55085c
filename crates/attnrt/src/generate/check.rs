//! The lockstep check of `--check` ([`GenerationOptions::check`](super::GenerationOptions)):
//! each step, the reference graph runs on its own inputs and its logits and tokens are compared
//! with the fused graph's.
//!
//! A dynamically quantized decoder (int8 projections, `DynamicQuantizeLinear` on the
//! activations) can disagree by more than float32 rounding although both graphs are right: a
//! rounding difference of a few ulps upstream of a quantizer flips an int8 step, and the step is
//! passed on. So the reference run records its activation quantizations, and when the step
//! disagrees and the reference quantized activations, the fused graph runs again on the
//! reference's inputs with those quantizations pinned (`attnrt_runtime::quant_pins`: taken only
//! where the fused input is within the check's tolerance of the reference's); that run is judged
//! ([`PinnedStep`]).

use anyhow::{Context, Result};
use attnrt_runtime::quant_pins::{PinReport, QuantPins};
use std::sync::Arc;

use attnrt_runtime::{KvStore, NamedTensor, Session, Tensor};
use serde::Serialize;

use super::generation::choose;
use super::sampling::Sampler;
use super::step::{at_positions_of, last_logits, StepInputs};
use super::{Generator, StepCheck};
use crate::harness::{diff_tensor, OutputDiff, Tolerance};

/// The fused step run again on the reference's inputs with the reference's activation
/// quantizations pinned (see the module docs).
#[derive(Clone, Debug, Serialize)]
pub struct PinnedStep {
    /// What the pins did.
    pub pins: PinReport,
    /// The pinned fused logits vs the reference's.
    pub logits: OutputDiff,
    /// The tokens the pinned fused logits give, per row.
    pub tokens: Vec<Option<i64>>,
}

impl PinnedStep {
    /// No projection diverged, the logits are within tolerance and the tokens are the
    /// reference's.
    fn agrees(&self, reference_tokens: &[Option<i64>]) -> bool {
        self.pins.diverged.is_empty() && self.logits.ok && self.tokens == reference_tokens
    }
}

/// What a fused step made: its logits, the tokens chosen from them, the rows' tokens seen
/// before it and the samplers' state before the choice (the reference draws from the same).
pub(super) struct Ours<'a> {
    pub logits: &'a Tensor,
    pub tokens: &'a [Option<i64>],
    pub seen: &'a [Option<Vec<i64>>],
    pub samplers: Vec<Sampler>,
    /// Whether the fused steps keep their cache in place.
    pub in_place: bool,
}

impl Generator {
    /// The reference's step `inputs` (its cache tensors among them) run on the fused session:
    /// with the in-place cache, the cache tensors move into a store of their own and stand-ins
    /// take their place (the plan of the fused steps serves it).
    fn run_fused_on(
        &self,
        mut inputs: Vec<NamedTensor>,
        prompt: bool,
        in_place: bool,
    ) -> Result<Vec<NamedTensor>> {
        let owners = match &self.in_place {
            Ok(owners) if in_place => owners,
            _ => return Ok(self.run_on(&self.session, inputs, prompt, None)?.0),
        };
        let store = Arc::new(KvStore::new(1));
        for o in owners.iter() {
            let find = |name: &str| -> Result<&Tensor> {
                let t = inputs.iter().find(|t| t.name == name);
                t.map(|t| &t.tensor)
                    .with_context(|| format!("no cache input '{name}'"))
            };
            store.fill(&o.node, find(&o.key)?, find(&o.value)?)?;
        }
        let is_cache = |name: &str| self.signature.cache.iter().any(|c| c.past == name);
        for t in inputs.iter_mut().filter(|t| is_cache(&t.name)) {
            let mut shape = t.tensor.shape().to_vec();
            shape[3] = 0;
            t.tensor = Tensor::zero_dt(t.tensor.datum_type(), &shape)?;
        }
        Ok(self.run_on(&self.session, inputs, prompt, Some(&store))?.0)
    }

    /// Runs the reference on its step inputs `t` (moving its cache forward) and compares it
    /// with `ours` under `tol` (see the module docs).
    pub(super) fn check_step(
        &self,
        t: &mut StepInputs,
        reference: &Session,
        ours: Ours,
        tol: Tolerance,
    ) -> Result<StepCheck> {
        let prompt = t.past() == 0;
        let feeds = t.take_tensors()?;
        let kept = feeds.clone();
        let recorder = QuantPins::recorder();
        let outputs = recorder.during(|| reference.run_owned(feeds))?;
        let reference_logits = t.take_outputs(&self.signature, outputs)?;
        let mut twins = ours.samplers.clone();
        let reference_tokens = choose(&mut twins, ours.seen, &last_logits(&reference_logits)?)?;
        let name = &self.signature.logits;
        // the reference's logits at the positions ours were computed at (`last_position.rs`)
        let reference_logits = at_positions_of(&reference_logits, ours.logits)?;
        let logits = diff_tensor(name, ours.logits, &reference_logits, tol);
        let mut ok = logits.ok && reference_tokens == ours.tokens;
        let mut pinned = None;
        if !ok && recorder.recorded() > 0 {
            let pins = QuantPins::replayer(&recorder, tol.atol as f32, tol.rtol as f32);
            let outputs = pins.during(|| self.run_fused_on(kept, prompt, ours.in_place))?;
            let again = outputs
                .into_iter()
                .find(|o| o.name == *name)
                .with_context(|| format!("the model gave no output '{name}'"))?
                .tensor;
            let mut twins = ours.samplers;
            let step = PinnedStep {
                pins: pins.report(),
                logits: diff_tensor(name, &again, &reference_logits, tol),
                tokens: choose(&mut twins, ours.seen, &last_logits(&again)?)?,
            };
            ok = step.agrees(&reference_tokens);
            pinned = Some(step);
        }
        Ok(StepCheck {
            reference_token: reference_tokens[0].unwrap_or(-1),
            ok,
            reference_tokens,
            logits,
            pinned,
        })
    }
}
