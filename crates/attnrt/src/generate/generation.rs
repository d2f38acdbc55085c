//! One generation in progress: what [`Generator::start`](super::Generator::start) makes and
//! [`Generator::next_step`](super::Generator::next_step) moves forward one step at a time (the
//! loop of [`Generator::generate`](super::Generator::generate), of a streaming CLI, of the
//! Python `Generator`). It holds each row's tokens and state, the samplers, the inputs of the
//! next step (the cache among them) and the steps made.

use anyhow::Result;

use super::sampling::Sampler;
use super::step::StepInputs;
use super::{ContextLimit, GenerationOptions, KvCacheReport, RowReport, StepReport, StopReason};

/// A generation between two steps (see the module docs).
pub struct Generation {
    pub(super) options: GenerationOptions,
    pub(super) context: Option<ContextLimit>,
    pub(super) samplers: Vec<Sampler>,
    pub(super) ours: StepInputs,
    pub(super) theirs: Option<StepInputs>,
    pub(super) rows: Rows,
    pub(super) steps: Vec<StepReport>,
    /// Why it ended, once it has.
    pub(super) stopped: Option<StopReason>,
    /// The failing step's error ([`StopReason::Error`]).
    pub(super) error: Option<String>,
    /// The decode steps' plan, being made while the prompt runs (joined before the first
    /// decode step).
    pub(super) decode_plan: Option<std::thread::JoinHandle<()>>,
    /// An encoder–decoder's encoder run, in milliseconds.
    pub(super) encoder_ms: Option<f64>,
    /// How its key/value cache is kept.
    pub(super) kv_cache: KvCacheReport,
    /// The last step's logits at its last position, per row (as f32).
    pub(super) last_logits: Vec<Vec<f32>>,
}

impl Generation {
    /// Whether it has ended (every row finished, the tokens asked for made, the context full,
    /// or a step failed).
    pub fn is_done(&self) -> bool {
        self.stopped.is_some()
    }

    /// Why it ended, once it has.
    pub fn stopped(&self) -> Option<StopReason> {
        self.stopped
    }

    /// The options it runs with.
    pub fn options(&self) -> &GenerationOptions {
        &self.options
    }

    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        self.options.prompts.len()
    }

    /// The tokens row `row` has made so far.
    pub fn tokens(&self, row: usize) -> &[i64] {
        &self.rows.tokens[row]
    }

    /// Whether row `row` has finished.
    pub fn is_row_finished(&self, row: usize) -> bool {
        self.rows.finished[row].is_some()
    }

    /// Finishes row `row` for `reason` (a stop string found by the caller in its text): its
    /// tokens no longer change. The generation ends when every row has finished.
    pub fn finish_row(&mut self, row: usize, reason: StopReason) {
        if self.rows.finished[row].is_none() {
            self.rows.finished[row] = Some(reason);
        }
        if self.rows.all_finished() && self.stopped.is_none() {
            self.stopped = Some(self.rows.common_reason());
        }
    }

    /// The logits the last step chose its tokens from (its last position's, per row, as f32;
    /// empty before the first step).
    pub fn last_logits(&self) -> &[Vec<f32>] {
        &self.last_logits
    }

    /// How its key/value cache is kept.
    pub fn kv_cache(&self) -> &KvCacheReport {
        &self.kv_cache
    }

    /// The steps made so far.
    pub fn steps(&self) -> &[StepReport] {
        &self.steps
    }

    /// The longest prompt and the tokens made still fit the context.
    pub(super) fn fits(&self) -> bool {
        let longest = self.options.prompts.iter().map(Vec::len).max().unwrap_or(0);
        self.context
            .as_ref()
            .is_none_or(|c| longest + self.steps.len() < c.positions)
    }

    /// Records a step: its tokens join their rows, and the generation ends when every row has
    /// finished or the tokens asked for are made; else the next step's inputs are set.
    pub(super) fn record(&mut self, step: StepReport) {
        let fed = self.rows.push(&step.tokens, self.options.eos_token);
        self.steps.push(step);
        if self.rows.all_finished() {
            self.stopped = Some(self.rows.common_reason());
        } else if self.steps.len() >= self.options.max_new_tokens {
            self.stopped = Some(StopReason::MaxNewTokens);
        } else {
            self.ours.advance(&fed);
            if let Some(t) = self.theirs.as_mut() {
                t.advance(&fed);
            }
        }
    }
}

/// Each unfinished row's token from its row of `logits`, drawn by its sampler given the
/// row's tokens seen so far (prompt and generated; `None` for a finished row, which chooses
/// nothing).
pub(super) fn choose(
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

/// Each row's generated tokens, and why it finished, once it has.
pub(super) struct Rows {
    tokens: Vec<Vec<i64>>,
    finished: Vec<Option<StopReason>>,
}

impl Rows {
    pub(super) fn new(prompts: &[Vec<i64>]) -> Rows {
        Rows {
            tokens: vec![Vec::new(); prompts.len()],
            finished: vec![None; prompts.len()],
        }
    }

    /// Per row, the prompt and the tokens made so far; `None` for a finished row.
    pub(super) fn seen(&self, prompts: &[Vec<i64>]) -> Vec<Option<Vec<i64>>> {
        (0..prompts.len())
            .map(|r| {
                self.finished[r]
                    .is_none()
                    .then(|| [prompts[r].as_slice(), &self.tokens[r]].concat())
            })
            .collect()
    }

    /// Adds a step's tokens to the rows still generating; returns the token each row feeds
    /// next (a finished row feeds its last token again: its tokens no longer change).
    fn push(&mut self, chosen: &[Option<i64>], eos: Option<i64>) -> Vec<i64> {
        for (r, t) in chosen.iter().enumerate() {
            if let (Some(t), None) = (t, self.finished[r]) {
                self.tokens[r].push(*t);
                if eos == Some(*t) {
                    self.finished[r] = Some(StopReason::Eos);
                }
            }
        }
        self.tokens
            .iter()
            .map(|t| t.last().copied().unwrap_or(0))
            .collect()
    }

    fn all_finished(&self) -> bool {
        self.finished.iter().all(Option::is_some)
    }

    /// Why a generation whose rows all finished ended: their reason when they share one
    /// (`Eos`, `Stop`), else `Eos`.
    fn common_reason(&self) -> StopReason {
        match self.finished.first().copied().flatten() {
            Some(first) if self.finished.iter().all(|f| *f == Some(first)) => first,
            _ => StopReason::Eos,
        }
    }

    /// The rows' reports; a row still generating ended for `stopped`.
    pub(super) fn reports(&self, prompts: &[Vec<i64>], stopped: StopReason) -> Vec<RowReport> {
        self.tokens
            .iter()
            .zip(&self.finished)
            .zip(prompts)
            .map(|((tokens, finished), prompt)| RowReport {
                prompt: prompt.clone(),
                tokens: tokens.clone(),
                stopped: finished.unwrap_or(stopped),
            })
            .collect()
    }
}
