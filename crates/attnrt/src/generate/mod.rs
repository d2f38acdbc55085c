//! Generation with a decoder exported with its key/value cache: the prompt runs once with an
//! empty past (the prefill), then one token per step, every present output fed back as the next
//! step's past. Several prompts run as one batch, one row each, padded on the left
//! (`step.rs`); a row that made its end-of-sequence token is finished and no longer changes.
//! One [`Session`] serves every step: the past length stays symbolic in the decode steps' plans
//! ([`ShapePolicy::DynamicDims`]) and the prompt's length in the prompt's, so a step costs the
//! step. A decoder-only model's prompt plan and decode steps' plan are made when the generator
//! is built, each with the batch symbolic too where tract can plan that (every decoder in
//! `models/`: attnrt's `Flatten` and `Mul` parsers make the TorchScript and optimum exports
//! plannable so); where it cannot, each batch size's plans are made at its first step (the
//! decode steps' while its prompt runs). A step's logits are computed at its last position only
//! where the graph allows it exactly (`last_position.rs`): the prompt's other positions never
//! choose a token.
//!
//! The cache is held in place where that is exact (`kv_cache.rs`,
//! [`GenerationOptions::kv_cache`]): the fused attention appends each step's keys and values to
//! a store the generation owns (`attnrt_runtime::kv_store`) and the cache tensors fed back are
//! zero-byte stand-ins carrying the length; elsewhere the presents are fed back as tensors.
//!
//! With a check, the original (unfused) graph runs in lockstep on its own session and its own
//! cache; a step whose token differs, or whose logits differ beyond the tolerance, fails the
//! check.
//!
//! An encoder–decoder (optimum's Whisper: the encoder, and the merged decoder with both caches)
//! generates the same way once its encoder has run ([`Generator::with_encoder`]): the encoder
//! runs once, on [`GenerationOptions::encoder_inputs`]; its states feed every decoder step, the
//! first step's cross-attention keys and values are fed back unchanged on every later one
//! (`encoder.rs`), and the self-attention cache grows as a decoder-only model's does.
//!
//! Generation stops at the model's context ([`context`]): the prompt and the generated tokens
//! together fill at most its positions, as Hugging Face's `max_length` counts them. A step that
//! fails keeps the tokens made before it ([`GenerationFailed`]).

mod check;
pub mod context;
mod encoder;
mod generation;
mod kv_cache;
mod kv_shapes;
mod last_position;
pub mod sampling;
mod signature;
mod step;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use attnrt_onnx::ModelProto;
use attnrt_runtime::{
    KvStore, NamedTensor, PlanStats, Session, SessionOptions, ShapePolicy, Threads,
};
use serde::Serialize;

use crate::harness::{OutputDiff, Tolerance};
use encoder::{CrossInputs, Encoder};

pub use check::PinnedStep;
pub use context::ContextLimit;
pub use generation::Generation;
use generation::{choose, Rows};
use kv_cache::HeldCache;
pub use kv_cache::{KvCacheMode, KvCacheReport};
pub use sampling::{Sampler, SamplingOptions};
pub use signature::{CacheSlot, DecoderSignature};
use step::{last_logits, StepInputs};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerationOptions {
    /// The prompts' token ids, one row of the batch each (at least one prompt of at least one
    /// token).
    pub prompts: Vec<Vec<i64>>,
    /// How many tokens to generate after the prompt.
    pub max_new_tokens: usize,
    /// A row stops after this token (it is kept); generation stops when every row has.
    pub eos_token: Option<i64>,
    /// Run the reference graph in lockstep and compare logits under this tolerance.
    pub check: Option<Tolerance>,
    /// The most positions (prompt and generated tokens together) to use, in place of the
    /// model's own context ([`Generator::context`]).
    pub max_length: Option<usize>,
    /// Greedy or sampled, and the logits processors.
    pub sampling: SamplingOptions,
    /// An encoder–decoder's encoder inputs (e.g. Whisper's `input_features`), one row per
    /// prompt: the encoder runs once on them, before the first step. Empty for a decoder-only
    /// model.
    pub encoder_inputs: Vec<NamedTensor>,
    /// How the key/value cache is kept (in place where that is exact, by default).
    pub kv_cache: KvCacheMode,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It made the tokens asked for.
    MaxNewTokens,
    /// It made the end-of-sequence token (every row, for a batch).
    Eos,
    /// Its text reached a stop string (found by the caller: [`Generation::finish_row`]).
    Stop,
    /// The prompt and the tokens made fill the context ([`GenerationReport::context`]).
    Context,
    /// A step failed ([`GenerationReport::error`]).
    Error,
}

/// The lockstep comparison of one step.
#[derive(Clone, Debug, Serialize)]
pub struct StepCheck {
    /// The reference graph's token for the first row.
    pub reference_token: i64,
    /// The reference graph's token for each row still generating (`None`: finished).
    pub reference_tokens: Vec<Option<i64>>,
    /// The logits comparison (fused vs reference).
    pub logits: OutputDiff,
    /// Same tokens in every row, and logits within tolerance (those of [`StepCheck::pinned`]
    /// when it ran).
    pub ok: bool,
    /// A dynamically quantized decoder whose step disagreed: the fused step again with the
    /// reference's activation quantizations pinned (`check.rs`).
    pub pinned: Option<PinnedStep>,
}

/// One step: the tokens it produced and how long it took.
#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    /// 0 for the prefill, then 1, 2, …
    pub step: usize,
    /// Tokens fed this step (per row).
    pub fed: usize,
    /// Past length this step.
    pub past: usize,
    /// The token the first row chose.
    pub token: i64,
    /// The token each row chose (`None`: the row had finished).
    pub tokens: Vec<Option<i64>>,
    /// Wall time of the model run, in milliseconds (the reference's not included).
    pub ms: f64,
    /// Of `ms`, the time spent inside the plan's nodes, summed, when the generator times them
    /// ([`Generator::with_node_times`]); the rest is what the step costs besides its nodes (its
    /// inputs, finding its plan, the memory and shape checks, tract's moves between nodes, its
    /// outputs).
    pub nodes_ms: Option<f64>,
    /// The time spent making plans while the step ran, in milliseconds: for the prefill, the
    /// prompt's plan when none served it yet (a single row's is made with the generator), and
    /// the decode steps' plan, made on its own thread alongside the prompt (so the prefill's
    /// figure may exceed its wall time); the decode steps' is 0.
    pub planning_ms: f64,
    /// The lockstep comparison, with a check.
    pub check: Option<StepCheck>,
}

/// One row of a batch: its prompt, its tokens and why it ended.
#[derive(Clone, Debug, Serialize)]
pub struct RowReport {
    /// The prompt.
    pub prompt: Vec<i64>,
    /// The generated tokens.
    pub tokens: Vec<i64>,
    /// Why the row ended.
    pub stopped: StopReason,
}

/// The outcome of a generation.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationReport {
    /// The first row's prompt (the prompt, for a batch of one).
    pub prompt: Vec<i64>,
    /// The first row's generated tokens.
    pub tokens: Vec<i64>,
    /// Every row.
    pub rows: Vec<RowReport>,
    /// Every step.
    pub steps: Vec<StepReport>,
    /// The prefill's time: prompt in, first token out (ms), planning included.
    pub time_to_first_token_ms: f64,
    /// Decode steps per second, over the steps that made no plan.
    pub decode_tokens_per_s: Option<f64>,
    /// Median decode-step time (ms), over the steps that made no plan.
    pub median_step_ms: Option<f64>,
    /// Median, over the same steps, of a step's time outside its nodes (ms): `ms - nodes_ms`,
    /// when the generator times the nodes ([`Generator::with_node_times`]).
    pub median_step_outside_ms: Option<f64>,
    /// How the session's plans were made (a step that needed a new plan shows here); with a
    /// first-step decoder ([`Generator::with_first_step`]), its session's plans too.
    pub plans: PlanStats,
    /// An encoder–decoder's encoder run, in milliseconds (the reference encoder's included with
    /// a check); not part of `time_to_first_token_ms`.
    pub encoder_ms: Option<f64>,
    /// With a check: whether every step agreed.
    pub check_ok: Option<bool>,
    /// Why it ended (`Eos`: every row made it).
    pub stopped: StopReason,
    /// The context it ran within, when known.
    pub context: Option<ContextLimit>,
    /// The error of the step that failed ([`StopReason::Error`]).
    pub error: Option<String>,
    /// How the key/value cache was kept.
    pub kv_cache: KvCacheReport,
}

/// A generation whose step failed, with what it made before (`report`, stopped by the error).
#[derive(Debug)]
pub struct GenerationFailed {
    /// The tokens and steps made before the failing step.
    pub report: GenerationReport,
    /// The failing step's error.
    pub error: anyhow::Error,
}

impl std::fmt::Display for GenerationFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {} failed after {} generated token(s)",
            self.report.steps.len(),
            self.report.tokens.len()
        )
    }
}

impl std::error::Error for GenerationFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error.as_ref())
    }
}

/// A decoder ready to generate: its signature, its context, and a session (and a reference
/// session for checks).
pub struct Generator {
    signature: DecoderSignature,
    context: Option<ContextLimit>,
    session: Arc<Session>,
    reference: Option<Session>,
    /// An encoder–decoder's encoder.
    encoder: Option<Encoder>,
    /// The sessions (ours, the reference's) of the model that makes the first step, when the
    /// decoder cannot ([`Generator::with_first_step`]).
    first_step: Option<(Session, Option<Session>)>,
    /// The decoder's name in errors.
    what: String,
    /// How the prompt step's plan is keyed (its length symbolic, its batch too where tract can
    /// plan that), when the decoder's token ids name their length; `None`: as the decode steps'.
    prompt_policy: Option<ShapePolicy>,
    /// How the decode steps' plan is keyed (the past length symbolic, the batch too where
    /// tract can plan that); `None`: the session's own policy (the batch bound).
    decode_policy: Option<ShapePolicy>,
    /// Whether the decoder's logits are computed at the last position only (`last_position.rs`),
    /// else why not.
    last_position: Result<(), String>,
    /// The nodes that own the in-place cache's slots (its session's graph has them in store
    /// mode), or why it cannot serve this decoder (`kv_cache.rs`).
    in_place: Result<Arc<[kv_cache::Owner]>, String>,
    /// Whether every step's nodes are timed ([`Generator::with_node_times`]).
    node_times: bool,
}

/// A session for `model` and one for `reference` (the graph to check against) when given.
fn sessions(
    model: &ModelProto,
    reference: Option<&ModelProto>,
    threads: &Threads,
    what: &str,
    options: &SessionOptions,
) -> Result<(Session, Option<Session>)> {
    let session = Session::new(model, threads, what, options)?;
    let reference = reference
        .map(|r| Session::new(r, threads, &format!("reference {what}"), options))
        .transpose()?;
    Ok((session, reference))
}

impl Generator {
    /// Reads the decoder's signature from `model` and opens a session for it, plus one for
    /// `reference` (the graph to check against) when given, with the default
    /// [`SessionOptions`]. `what` names the model in errors.
    pub fn new(
        model: &ModelProto,
        reference: Option<&ModelProto>,
        threads: &Threads,
        what: &str,
    ) -> Result<Generator> {
        Generator::with_options(model, reference, threads, what, &SessionOptions::default())
    }

    /// [`Generator::new`] with these session options (tract's ops, memory budget...); the
    /// shape policy is the generator's own (the past length stays symbolic).
    pub fn with_options(
        model: &ModelProto,
        reference: Option<&ModelProto>,
        threads: &Threads,
        what: &str,
        options: &SessionOptions,
    ) -> Result<Generator> {
        let signature = DecoderSignature::detect(model, what)?;
        let positions = signature.position_ids.as_ref().map(|(n, _)| n.as_str());
        let context = context::position_table(model, positions).or_else(|| {
            // a merged decoder's table is inside its branches: the later steps' one
            let branch = signature.cache_branch.as_deref()?;
            let later = attnrt_onnx::branch::choose_branch(model, branch, true).ok()?;
            context::position_table(&later, positions)
        });
        let options = SessionOptions {
            shapes: ShapePolicy::DynamicDims(signature.dynamic_dims()),
            ..options.clone()
        };
        let sliced =
            last_position::logits_at_last_position(model, &signature.logits, &signature.input_ids);
        let decoder_only = signature.encoder_states.is_none() && signature.cross_cache.is_empty();
        let base = sliced.as_ref().unwrap_or(model);
        let in_place = kv_cache::in_place_model(base, &signature);
        let (session, reference) = sessions(
            in_place.as_ref().map_or(base, |p| &p.model),
            reference,
            threads,
            what,
            &options,
        )?;
        let mut generator = Generator {
            prompt_policy: None,
            decode_policy: None,
            signature,
            context,
            session: Arc::new(session),
            reference,
            encoder: None,
            first_step: None,
            what: what.to_string(),
            last_position: sliced.as_ref().map(|_| ()).map_err(Clone::clone),
            in_place: in_place.map(|p| p.owners.into()),
            node_times: false,
        };
        if decoder_only {
            (generator.prompt_policy, generator.decode_policy) = generator.prepare_first_steps();
        }
        Ok(generator)
    }

    /// Makes the prompt's plan (its length symbolic, its batch too where tract can plan that)
    /// and the decode steps' plan (the past length symbolic, the batch too where tract can)
    /// while the model loads: the first token then costs the prompt's compute, not a plan, and
    /// the prompt step does not share the cores with making the decode steps' plan. Returns
    /// how the two plans are keyed: the first of [`DecoderSignature::prompt_shapes`] and of
    /// [`DecoderSignature::decode_shapes`] tract can plan (`None`: none; the step is planned
    /// as before, for its own shapes, when it comes). Not for encoder–decoders (their steps'
    /// shapes follow the encoder's).
    fn prepare_first_steps(&self) -> (Option<ShapePolicy>, Option<ShapePolicy>) {
        // shaped as the default cache's (`KvCacheMode::InPlace`) steps are
        let held = self.in_place.as_ref().ok().map(|owners| HeldCache {
            store: Arc::new(KvStore::new(1)),
            owners: Arc::clone(owners),
        });
        let Ok(prompt) = StepInputs::prefill(&self.signature, &[vec![0]], None, held) else {
            return (None, None);
        };
        let plannable = |shapes: &[NamedTensor], policies: Vec<ShapePolicy>| {
            let mut policies = policies.into_iter();
            policies.find(|p| self.session.try_prepare_with(shapes, p).is_ok())
        };
        let prompt_policy = prompt
            .clone()
            .take_tensors()
            .ok()
            .and_then(|shapes| plannable(&shapes, self.signature.prompt_shapes()));
        let Ok(shapes) = prompt.next_step_shapes(&self.signature) else {
            return (prompt_policy, None);
        };
        let decode_policy = plannable(&shapes, self.signature.decode_shapes());
        if decode_policy.is_none() {
            // A failure here is the decode step's to report, when it comes.
            let _ = self.session.prepare(&shapes);
        }
        (prompt_policy, decode_policy)
    }

    /// Whether the decoder's logits are computed at the last position of a step only (the
    /// graph's output product sliced to it before it runs), not at every position fed.
    pub fn last_position_logits(&self) -> bool {
        self.last_position.is_ok()
    }

    /// Why the decoder's logits are computed at every position fed (`None`: at the last one
    /// only, [`Generator::last_position_logits`]): the graph's logits are not a product the
    /// rewrite can slice exactly (not a product by a constant weight through ops that keep
    /// each position's values apart, or hidden states not shown to be
    /// `[batch, sequence, hidden]` with the two first axes kept up to the logits).
    pub fn last_position_refusal(&self) -> Option<&str> {
        self.last_position.as_ref().err().map(String::as_str)
    }

    /// This decoder (with past: optimum's `decoder_with_past_model.onnx`, which takes the
    /// cross-attention keys and values but cannot compute them) with `model` making the first
    /// step (optimum's `decoder_model.onnx`: the encoder's states in, every present out);
    /// `reference` is its graph to check against. The encoder's inputs are read off `model`, so
    /// give the encoder after it. `what` names `model` in errors.
    pub fn with_first_step(
        mut self,
        model: &ModelProto,
        reference: Option<&ModelProto>,
        threads: &Threads,
        what: &str,
        options: &SessionOptions,
    ) -> Result<Generator> {
        self.signature.adopt_first_step(model, what, &self.what)?;
        self.in_place = Err(format!(
            "the first step runs on another decoder ({what}), whose presents are tensors"
        ));
        let sig = &self.signature;
        let sliced = last_position::logits_at_last_position(model, &sig.logits, &sig.input_ids);
        let model = sliced.as_ref().unwrap_or(model);
        self.first_step = Some(sessions(model, reference, threads, what, options)?);
        Ok(self)
    }

    /// This decoder with its encoder (`model`, and `reference` to check against when given):
    /// the decoder must take the encoder's states, which one of the encoder's outputs must
    /// give (see [`GenerationOptions::encoder_inputs`]). `what` names the encoder in errors.
    pub fn with_encoder(
        mut self,
        model: &ModelProto,
        reference: Option<&ModelProto>,
        threads: &Threads,
        what: &str,
        options: &SessionOptions,
    ) -> Result<Generator> {
        let decoder = (&self.signature, self.what.as_str());
        self.encoder = Some(Encoder::new(
            model, reference, threads, what, options, decoder,
        )?);
        Ok(self)
    }

    /// This generator timing every node of every step (`on`): each step's
    /// [`StepReport::nodes_ms`] and the report's [`GenerationReport::median_step_outside_ms`],
    /// what a step costs besides its nodes. Off by default: it reads the clock twice per node
    /// (some 0.04 ms a step on a 125M decoder's 450 nodes).
    pub fn with_node_times(mut self, on: bool) -> Generator {
        self.node_times = on;
        self
    }

    /// The decoder's signature.
    pub fn signature(&self) -> &DecoderSignature {
        &self.signature
    }

    /// The model's context, when its graph shows one (a position table).
    pub fn context(&self) -> Option<&ContextLimit> {
        self.context.as_ref()
    }

    /// Generates (greedily or sampled, per `options.sampling`), every prompt as one row of a
    /// batch; `on_step` sees every step as it completes (for progress). Stops at the context
    /// (`options.max_length`, else the model's); a step that fails gives a
    /// [`GenerationFailed`] error holding the tokens made before it.
    pub fn generate(
        &self,
        options: &GenerationOptions,
        mut on_step: impl FnMut(&StepReport),
    ) -> Result<GenerationReport> {
        let mut g = self.start(options)?;
        loop {
            match self.next_step(&mut g) {
                Ok(Some(step)) => on_step(step),
                Ok(None) => return Ok(self.report(&g)),
                Err(error) => {
                    let report = self.report(&g);
                    return Err(GenerationFailed { report, error }.into());
                }
            }
        }
    }

    /// A generation of `options`, before its first step (the prompts checked, the prefill's
    /// inputs ready); [`Generator::next_step`] runs its steps.
    pub fn start(&self, options: &GenerationOptions) -> Result<Generation> {
        let context = self.check_prompts(options)?;
        let samplers = (0..options.prompts.len())
            .map(|row| Sampler::for_row(options.sampling.clone(), row))
            .collect::<Result<Vec<_>>>()?;
        let (cross, reference_cross, encoder_ms) = match self.encode(options)? {
            Some((ours, theirs, ms)) => (Some(ours), Some(theirs), Some(ms)),
            None => (None, None, None),
        };
        let (store, kv_cache) = self.kv_store_for(options, context.as_ref());
        let ours = StepInputs::prefill(&self.signature, &options.prompts, cross, store)?;
        let theirs = self
            .reference
            .as_ref()
            .map(|_| StepInputs::prefill(&self.signature, &options.prompts, reference_cross, None))
            .transpose()?;
        let stopped = (options.max_new_tokens == 0).then_some(StopReason::MaxNewTokens);
        Ok(Generation {
            rows: Rows::new(&options.prompts),
            options: options.clone(),
            context,
            samplers,
            ours,
            theirs,
            steps: Vec::new(),
            stopped,
            error: None,
            decode_plan: None,
            encoder_ms,
            kv_cache,
            last_logits: Vec::new(),
        })
    }

    /// The in-place cache of a generation of `options` within `context`, when it asks for one
    /// and the decoder can use it (room for the longest prompt and the tokens to make, within
    /// the context), and how the cache is kept.
    fn kv_store_for(
        &self,
        options: &GenerationOptions,
        context: Option<&ContextLimit>,
    ) -> (Option<HeldCache>, KvCacheReport) {
        let copy = |fallback| KvCacheReport {
            mode: KvCacheMode::Copy,
            fallback,
        };
        if options.kv_cache == KvCacheMode::Copy {
            return (None, copy(None));
        }
        let owners = match &self.in_place {
            Ok(owners) => Arc::clone(owners),
            Err(why) => return (None, copy(Some(why.clone()))),
        };
        let longest = options.prompts.iter().map(Vec::len).max().unwrap_or(0);
        // (a slot grows past it if need be: an open-ended generation starts with 4096 more)
        let mut capacity = longest.saturating_add(options.max_new_tokens.min(4096));
        if let Some(c) = context {
            capacity = capacity.min(c.positions.max(longest));
        }
        let report = KvCacheReport {
            mode: KvCacheMode::InPlace,
            fallback: None,
        };
        let held = HeldCache {
            store: Arc::new(KvStore::new(capacity)),
            owners,
        };
        (Some(held), report)
    }

    /// Runs the encoder of an encoder–decoder on `options.encoder_inputs`: the cross inputs of
    /// the generator's session and of the reference's (the fused encoder's states when no
    /// reference encoder is given), and the encoder's time. Nothing for a decoder-only model.
    fn encode(
        &self,
        options: &GenerationOptions,
    ) -> Result<Option<(CrossInputs, CrossInputs, f64)>> {
        let Some(encoder) = &self.encoder else {
            if let Some((name, _)) = &self.signature.encoder_states {
                bail!(
                    "{}: takes the encoder's states ('{name}'): generate with its encoder \
                     (`attnrt generate --encoder`)",
                    self.what
                );
            }
            if let Some(slot) = self.signature.cross_cache.first() {
                bail!(
                    "{}: takes the cross-attention keys and values ('{}', ...) but not the \
                     encoder's states, so no step of it can compute them: give the decoder that \
                     makes the first step (optimum's decoder_model.onnx, `--first-step`) and the \
                     encoder, or use the merged decoder (decoder_model_merged.onnx)",
                    self.what,
                    slot.past
                );
            }
            if !options.encoder_inputs.is_empty() {
                bail!("{}: encoder inputs given, but no encoder", self.what);
            }
            return Ok(None);
        };
        let rows = options.prompts.len();
        let encoded = encoder.encode(&options.encoder_inputs, rows, &self.signature)?;
        let slots = &self.signature.cross_cache;
        let reference_states = encoded.reference.unwrap_or_else(|| encoded.states.clone());
        let reference = CrossInputs::new(reference_states, encoded.mask.clone(), slots)?;
        let ours = CrossInputs::new(encoded.states, encoded.mask, slots)?;
        Ok(Some((ours, reference, encoded.ms)))
    }

    /// Runs the next step of `g` (the prefill first): `None` once it has ended (it may end
    /// here, at the context). A step that fails ends it with [`StopReason::Error`].
    pub fn next_step<'g>(&self, g: &'g mut Generation) -> Result<Option<&'g StepReport>> {
        if g.is_done() {
            return Ok(None);
        }
        if !g.fits() {
            g.stopped = Some(StopReason::Context);
            return Ok(None);
        }
        match self.step(g) {
            Ok(step) => {
                g.record(step);
                Ok(g.steps.last())
            }
            Err(e) => {
                g.stopped = Some(StopReason::Error);
                g.error = Some(format!("{e:#}"));
                Err(e)
            }
        }
    }

    /// Refuses no prompt, a prompt that is empty, outside the vocabulary or longer than the
    /// context, and returns the context the generation runs within.
    fn check_prompts(&self, options: &GenerationOptions) -> Result<Option<ContextLimit>> {
        if options.prompts.is_empty() {
            bail!("no prompt: give at least one");
        }
        let context = match options.max_length {
            Some(positions) => Some(ContextLimit {
                positions,
                table: None,
            }),
            None => self.context.clone(),
        };
        for (row, prompt) in options.prompts.iter().enumerate() {
            let which = if options.prompts.len() > 1 {
                format!("prompt {row}")
            } else {
                "the prompt".to_string()
            };
            if prompt.is_empty() {
                bail!("{which} is empty: give at least one token");
            }
            if let Some(v) = self.signature.vocab {
                if let Some(bad) = prompt.iter().find(|&&t| t < 0 || t as usize >= v) {
                    bail!("{which}: token {bad} is outside the vocabulary [0, {v})");
                }
            }
            if let Some(c) = context.as_ref().filter(|c| prompt.len() > c.positions) {
                bail!("{which}'s {} tokens do not fit {c}", prompt.len());
            }
        }
        Ok(context)
    }

    /// Runs one step on both sessions; the cache of each moves forward with its own presents.
    fn step(&self, g: &mut Generation) -> Result<StepReport> {
        let (fed, past) = (g.ours.fed(), g.ours.past());
        // (nothing to make when the decode steps' plan, made at load, serves every batch)
        let planned = self.decode_policy.is_some() && self.first_step.is_none();
        if g.steps.is_empty() && g.options.max_new_tokens > 1 && !planned {
            g.decode_plan = Some(self.plan_decode_steps(g.ours.next_step_shapes(&self.signature)?));
        } else if let Some(pending) = g.decode_plan.take() {
            // a failed preparation leaves the step to plan (and report) for itself
            let _ = pending.join();
        }
        let (session, reference) = match (&self.first_step, g.steps.is_empty()) {
            (Some((first, reference)), true) => (first, reference.as_ref()),
            _ => (&*self.session, self.reference.as_ref()),
        };
        let planned_before = self.planning_ms();
        let started = Instant::now();
        let store = g.ours.store().cloned();
        let inputs = g.ours.take_tensors()?;
        let (outputs, nodes) = self.run_on(session, inputs, g.steps.is_empty(), store.as_ref())?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let planning_ms = self.planning_ms() - planned_before;
        let logits = g.ours.take_outputs(&self.signature, outputs)?;
        let seen = g.rows.seen(&g.options.prompts);
        // The reference draws with the same state of the streams, so both see the same `u`.
        let twins = g.samplers.clone();
        g.last_logits = last_logits(&logits)?;
        let tokens = choose(&mut g.samplers, &seen, &g.last_logits)?;
        let check = match (g.theirs.as_mut(), reference) {
            (Some(t), Some(reference)) => {
                let ours = check::Ours {
                    logits: &logits,
                    tokens: &tokens,
                    seen: &seen,
                    samplers: twins,
                    in_place: store.is_some(),
                };
                let tol = g.options.check.unwrap_or_default();
                Some(self.check_step(t, reference, ours, tol)?)
            }
            _ => None,
        };
        Ok(StepReport {
            step: g.steps.len(),
            fed,
            past,
            token: tokens[0].unwrap_or(-1),
            tokens,
            ms,
            nodes_ms: nodes.map(|d| d.as_secs_f64() * 1e3),
            planning_ms,
            check,
        })
    }

    /// Runs a step's `inputs` on `session`: the prefill (`prompt`) on the prompt's plan, its
    /// length symbolic, when the decoder makes its own first step and names that length; a
    /// decode step on the decode steps' plan (its batch symbolic where tract can plan that).
    /// With `store`, the cache's attention nodes keep their keys and values there. Also
    /// returns the time spent inside the plan's nodes, when the generator times them.
    fn run_on(
        &self,
        session: &Session,
        inputs: Vec<NamedTensor>,
        prompt: bool,
        store: Option<&Arc<KvStore>>,
    ) -> Result<(Vec<NamedTensor>, Option<Duration>)> {
        let policy = match prompt {
            true => self.prompt_policy.as_ref(),
            false => self.decode_policy.as_ref(),
        };
        let policy = policy.filter(|_| self.first_step.is_none());
        if self.node_times {
            let (outputs, nodes) = session.run_owned_timed(inputs, policy, store)?;
            return Ok((outputs, Some(nodes)));
        }
        let outputs = match (store, policy) {
            (Some(store), policy) => session.run_owned_in(inputs, policy, store),
            (None, Some(policy)) => session.run_owned_with(inputs, policy),
            (None, None) => session.run_owned(inputs),
        }?;
        Ok((outputs, None))
    }

    /// The time the sessions (the decoder's, and the first step's) spent making plans, in ms.
    fn planning_ms(&self) -> f64 {
        self.plan_stats().build_ms
    }

    /// The plans of the decoder's session and of the first step's, so far (a decoder-only
    /// model's single-row decode plan is made when the generator is built).
    pub fn plan_stats(&self) -> PlanStats {
        let mut stats = self.session.plan_stats();
        if let Some((first, _)) = &self.first_step {
            let f = first.plan_stats();
            stats.built += f.built;
            stats.build_ms += f.build_ms;
            stats.cached += f.cached;
            stats.symbolic_cached += f.symbolic_cached;
            stats.refusals.extend(f.refusals);
        }
        stats
    }

    /// Makes the decode steps' plan on its own thread, while the prompt runs: the first decode
    /// step then costs its compute, not a plan (the past length is symbolic in that plan, so it
    /// serves every later step too). Not called when the plan made with the generator serves
    /// every batch; a single row's plan exists already (made when the generator was built:
    /// [`Generator::plan_stats`]); the thread then finds it and ends.
    fn plan_decode_steps(&self, shapes: Vec<NamedTensor>) -> std::thread::JoinHandle<()> {
        let session = Arc::clone(&self.session);
        std::thread::spawn(move || {
            let _ = session.prepare(&shapes);
        })
    }

    /// The report of `g` so far (its tokens, steps and times, why it ended).
    pub fn report(&self, g: &Generation) -> GenerationReport {
        let stopped = g.stopped.unwrap_or(StopReason::MaxNewTokens);
        let rows = g.rows.reports(&g.options.prompts, stopped);
        let steps = g.steps.clone();
        let decode_steps = || steps.iter().skip(1).filter(|s| s.planning_ms == 0.0);
        let mut decode: Vec<f64> = decode_steps().map(|s| s.ms).collect();
        let mut outside: Vec<f64> = decode_steps()
            .filter_map(|s| s.nodes_ms.map(|n| s.ms - n))
            .collect();
        let decode_ms: f64 = decode.iter().sum();
        decode.sort_by(f64::total_cmp);
        outside.sort_by(f64::total_cmp);
        GenerationReport {
            prompt: rows[0].prompt.clone(),
            tokens: rows[0].tokens.clone(),
            rows,
            time_to_first_token_ms: steps.first().map_or(0.0, |s| s.ms),
            decode_tokens_per_s: (decode_ms > 0.0).then(|| decode.len() as f64 / decode_ms * 1e3),
            median_step_ms: (!decode.is_empty()).then(|| decode[decode.len() / 2]),
            median_step_outside_ms: (!outside.is_empty()).then(|| outside[outside.len() / 2]),
            plans: self.plan_stats(),
            encoder_ms: g.encoder_ms,
            check_ok: self
                .reference
                .as_ref()
                .map(|_| steps.iter().all(|s| s.check.as_ref().is_some_and(|c| c.ok))),
            steps,
            stopped,
            context: g.context.clone(),
            error: g.error.clone(),
            kv_cache: g.kv_cache.clone(),
        }
    }
}
