//! Generation with a decoder exported with its key/value cache: the prompt runs once with an
//! empty past (the prefill), then one token per step, every present output fed back as the next
//! step's past. Several prompts run as one batch, one row each, padded on the left
//! ([`step`]); a row that made its end-of-sequence token is finished and no longer changes. One [`Session`] serves every step: the past length stays
//! symbolic in its plans ([`ShapePolicy::DynamicDims`]), so a step costs the step.
//!
//! With a check, the original (unfused) graph runs in lockstep on its own session and its own
//! cache; a step whose token differs, or whose logits differ beyond the tolerance, fails the
//! check.
//!
//! Generation stops at the model's context ([`context`]): the prompt and the generated tokens
//! together fill at most its positions, as Hugging Face's `max_length` counts them. A step that
//! fails keeps the tokens made before it ([`GenerationFailed`]).

pub mod context;
pub mod sampling;
mod signature;
mod step;

use std::time::Instant;

use anyhow::{bail, Result};
use attnrt_onnx::ModelProto;
use attnrt_runtime::{PlanStats, Session, SessionOptions, ShapePolicy, Threads};
use serde::Serialize;

use crate::harness::{OutputDiff, Tolerance};

pub use context::ContextLimit;
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
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It made the tokens asked for.
    MaxNewTokens,
    /// It made the end-of-sequence token.
    Eos,
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
    /// Same tokens in every row, and logits within tolerance.
    pub ok: bool,
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
    /// Of that, the time spent making a plan for a shape the session had not seen (the
    /// prompt, the first decode step), in milliseconds.
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
    /// How the session's plans were made (a step that needed a new plan shows here).
    pub plans: PlanStats,
    /// With a check: whether every step agreed.
    pub check_ok: Option<bool>,
    /// Why it ended (`Eos`: every row made it).
    pub stopped: StopReason,
    /// The context it ran within, when known.
    pub context: Option<ContextLimit>,
    /// The error of the step that failed ([`StopReason::Error`]).
    pub error: Option<String>,
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

/// What chooses a step's tokens: one sampler per row, and each row's tokens seen so far
/// (prompt and generated; `None` for a finished row, which chooses nothing).
struct Chooser<'a> {
    samplers: &'a mut [Sampler],
    seen: &'a [Option<Vec<i64>>],
}

impl Chooser<'_> {
    /// Each unfinished row's token from its row of `logits`.
    fn choose(
        samplers: &mut [Sampler],
        seen: &[Option<Vec<i64>>],
        logits: &[Vec<f32>],
    ) -> Result<Vec<Option<i64>>> {
        samplers
            .iter_mut()
            .zip(seen)
            .zip(logits)
            .map(|((sampler, seen), row)| {
                seen.as_ref()
                    .map(|seen| sampler.next_token(row, seen))
                    .transpose()
            })
            .collect()
    }
}

/// A decoder ready to generate: its signature, its context, and a session (and a reference
/// session for checks).
pub struct Generator {
    signature: DecoderSignature,
    context: Option<ContextLimit>,
    session: Session,
    reference: Option<Session>,
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
        let context = context::position_table(model, positions);
        let options = SessionOptions {
            shapes: ShapePolicy::DynamicDims(signature.dynamic_dims()),
            ..options.clone()
        };
        let session = Session::new(model, threads, what, &options)?;
        let reference = reference
            .map(|r| Session::new(r, threads, &format!("reference {what}"), &options))
            .transpose()?;
        Ok(Generator {
            signature,
            context,
            session,
            reference,
        })
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
        let context = self.check_prompts(options)?;
        let longest = options.prompts.iter().map(Vec::len).max().unwrap_or(0);
        let fits = |made: usize| {
            context
                .as_ref()
                .is_none_or(|c| longest + made < c.positions)
        };
        let mut samplers = (0..options.prompts.len())
            .map(|row| Sampler::for_row(options.sampling.clone(), row))
            .collect::<Result<Vec<_>>>()?;
        let mut ours = StepInputs::prefill(&self.signature, &options.prompts)?;
        let mut theirs = self.reference.as_ref().map(|_| ours.clone());
        let mut rows = Rows::new(&options.prompts);
        let mut steps = Vec::new();
        let mut stopped = StopReason::MaxNewTokens;
        while steps.len() < options.max_new_tokens {
            if !fits(steps.len()) {
                stopped = StopReason::Context;
                break;
            }
            let seen = rows.seen(&options.prompts);
            let chooser = Chooser {
                samplers: &mut samplers,
                seen: &seen,
            };
            let step = match self.step(steps.len(), &mut ours, theirs.as_mut(), chooser, options) {
                Ok(step) => step,
                Err(error) => {
                    let mut report = self.report(options, rows, steps, StopReason::Error, context);
                    report.error = Some(format!("{error:#}"));
                    return Err(GenerationFailed { report, error }.into());
                }
            };
            on_step(&step);
            let fed = rows.push(&step.tokens, options.eos_token);
            steps.push(step);
            if rows.all_finished() {
                stopped = StopReason::Eos;
                break;
            }
            ours.advance(&fed);
            if let Some(t) = theirs.as_mut() {
                t.advance(&fed);
            }
        }
        Ok(self.report(options, rows, steps, stopped, context))
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
    fn step(
        &self,
        index: usize,
        ours: &mut StepInputs,
        theirs: Option<&mut StepInputs>,
        chooser: Chooser,
        options: &GenerationOptions,
    ) -> Result<StepReport> {
        let (fed, past) = (ours.fed(), ours.past());
        let planned_before = self.session.plan_stats().build_ms;
        let started = Instant::now();
        let outputs = self.session.run_owned(ours.take_tensors()?)?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let planning_ms = self.session.plan_stats().build_ms - planned_before;
        let logits = ours.take_outputs(&self.signature, outputs)?;
        // The reference draws with the same state of the streams, so both see the same `u`.
        let mut twins = chooser.samplers.to_vec();
        let tokens = Chooser::choose(chooser.samplers, chooser.seen, &last_logits(&logits)?)?;
        let check = match (theirs, &self.reference) {
            (Some(t), Some(reference)) => {
                let outputs = reference.run_owned(t.take_tensors()?)?;
                let reference_logits = t.take_outputs(&self.signature, outputs)?;
                let reference_tokens =
                    Chooser::choose(&mut twins, chooser.seen, &last_logits(&reference_logits)?)?;
                let tol = options.check.unwrap_or_default();
                let diff = crate::harness::diff_tensor(
                    &self.signature.logits,
                    &logits,
                    &reference_logits,
                    tol,
                );
                Some(StepCheck {
                    reference_token: reference_tokens[0].unwrap_or(-1),
                    ok: diff.ok && reference_tokens == tokens,
                    reference_tokens,
                    logits: diff,
                })
            }
            _ => None,
        };
        Ok(StepReport {
            step: index,
            fed,
            past,
            token: tokens[0].unwrap_or(-1),
            tokens,
            ms,
            planning_ms,
            check,
        })
    }

    fn report(
        &self,
        options: &GenerationOptions,
        rows: Rows,
        steps: Vec<StepReport>,
        stopped: StopReason,
        context: Option<ContextLimit>,
    ) -> GenerationReport {
        let rows = rows.reports(&options.prompts, stopped);
        let mut decode: Vec<f64> = steps
            .iter()
            .skip(1)
            .filter(|s| s.planning_ms == 0.0)
            .map(|s| s.ms)
            .collect();
        let decode_ms: f64 = decode.iter().sum();
        decode.sort_by(f64::total_cmp);
        GenerationReport {
            prompt: rows[0].prompt.clone(),
            tokens: rows[0].tokens.clone(),
            rows,
            time_to_first_token_ms: steps.first().map_or(0.0, |s| s.ms),
            decode_tokens_per_s: (decode_ms > 0.0).then(|| decode.len() as f64 / decode_ms * 1e3),
            median_step_ms: (!decode.is_empty()).then(|| decode[decode.len() / 2]),
            plans: self.session.plan_stats(),
            check_ok: self
                .reference
                .as_ref()
                .map(|_| steps.iter().all(|s| s.check.as_ref().is_some_and(|c| c.ok))),
            steps,
            stopped,
            context,
            error: None,
        }
    }
}

/// Each row's generated tokens, and whether it has finished (made the end-of-sequence token).
struct Rows {
    tokens: Vec<Vec<i64>>,
    finished: Vec<bool>,
}

impl Rows {
    fn new(prompts: &[Vec<i64>]) -> Rows {
        Rows {
            tokens: vec![Vec::new(); prompts.len()],
            finished: vec![false; prompts.len()],
        }
    }

    /// Per row, the prompt and the tokens made so far; `None` for a finished row.
    fn seen(&self, prompts: &[Vec<i64>]) -> Vec<Option<Vec<i64>>> {
        (0..prompts.len())
            .map(|r| (!self.finished[r]).then(|| [prompts[r].as_slice(), &self.tokens[r]].concat()))
            .collect()
    }

    /// Adds a step's tokens to the rows still generating; returns the token each row feeds
    /// next (a finished row feeds its last token again: it is masked in nothing, but its
    /// tokens no longer change).
    fn push(&mut self, chosen: &[Option<i64>], eos: Option<i64>) -> Vec<i64> {
        for (r, t) in chosen.iter().enumerate() {
            if let (Some(t), false) = (t, self.finished[r]) {
                self.tokens[r].push(*t);
                self.finished[r] = eos == Some(*t);
            }
        }
        self.tokens
            .iter()
            .map(|t| t.last().copied().unwrap_or(0))
            .collect()
    }

    fn all_finished(&self) -> bool {
        self.finished.iter().all(|&f| f)
    }

    /// The rows' reports; a row not finished by its end-of-sequence token ended for `stopped`.
    fn reports(self, prompts: &[Vec<i64>], stopped: StopReason) -> Vec<RowReport> {
        self.tokens
            .into_iter()
            .zip(self.finished)
            .zip(prompts)
            .map(|((tokens, finished), prompt)| RowReport {
                prompt: prompt.clone(),
                tokens,
                stopped: if finished { StopReason::Eos } else { stopped },
            })
            .collect()
    }
}
