//! Choosing the next token from a row of logits: greedy, or sampled after transformers' logits
//! processors in transformers' order — the repetition penalty on the logits of tokens already
//! seen (prompt and generated), then temperature, top-k, top-p and min-p, then one draw from the
//! softmax of what is left.
//!
//! Definitions (transformers' `RepetitionPenaltyLogitsProcessor`, `TemperatureLogitsWarper`,
//! `TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`, each keeping at least one token):
//! - penalty `r`: a seen token's logit `x` becomes `x / r` if `x > 0`, else `x · r`;
//! - temperature `t`: every logit is divided by `t`;
//! - top-k: logits below the k-th largest become `−inf` (ties with it are kept);
//! - top-p: sorted by probability, the smallest set of the most probable tokens whose
//!   probabilities reach `p` is kept, the rest become `−inf`;
//! - min-p: tokens whose probability is below `min_p` times the largest are removed.
//!
//! Draws come from a ChaCha8 stream seeded by the user, one `f64` in `[0, 1)` per token, so the
//! same seed gives the same tokens whatever the thread count.

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingOptions {
    /// Sample from the processed distribution (`false`: greedy, the processed argmax).
    pub do_sample: bool,
    /// Divides the logits (> 0; 1 leaves them).
    pub temperature: f32,
    /// Keep the `k` most likely tokens (0: off).
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities reach `p` (in (0, 1]; 1: off).
    pub top_p: f32,
    /// Remove tokens less likely than `min_p` times the most likely (in [0, 1]; 0: off).
    pub min_p: f32,
    /// Penalty on the logits of tokens already seen (> 0; 1: off).
    pub repetition_penalty: f32,
    /// Seed of the draws.
    pub seed: u64,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        SamplingOptions {
            do_sample: false,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplingOptions {
    /// Refuses values outside each option's range, naming the option.
    pub fn validate(&self) -> Result<()> {
        let positive = |v: f32| v.is_finite() && v > 0.0;
        if !positive(self.temperature) {
            bail!("--temperature must be > 0 (got {})", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("--top-p must be in (0, 1] (got {})", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            bail!("--min-p must be in [0, 1] (got {})", self.min_p);
        }
        if !positive(self.repetition_penalty) {
            bail!(
                "--repetition-penalty must be > 0 (got {})",
                self.repetition_penalty
            );
        }
        Ok(())
    }
}

/// Chooses tokens under [`SamplingOptions`], with its own seeded stream of draws.
#[derive(Clone)]
pub struct Sampler {
    options: SamplingOptions,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler for `options` (validated).
    pub fn new(options: SamplingOptions) -> Result<Sampler> {
        options.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(options.seed);
        Ok(Sampler { options, rng })
    }

    /// The sampler of row `row` of a batch: its own stream of draws (row 0's is
    /// [`Sampler::new`]'s), so a row's tokens do not depend on the other rows.
    pub fn for_row(options: SamplingOptions, row: usize) -> Result<Sampler> {
        let mut sampler = Sampler::new(options)?;
        sampler.rng.set_stream(row as u64);
        Ok(sampler)
    }

    /// The next token for one row of `logits`, given the tokens `seen` so far in that row.
    pub fn next_token(&mut self, logits: &[f32], seen: &[i64]) -> Result<i64> {
        let mut x = logits.to_vec();
        penalize(&mut x, seen, self.options.repetition_penalty);
        if !self.options.do_sample {
            return argmax(&x);
        }
        warp(&mut x, &self.options);
        let u: f64 = self.rng.gen();
        draw(&x, u)
    }
}

/// The index of the largest logit (the first of equals); NaN logits are skipped.
pub fn argmax(x: &[f32]) -> Result<i64> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in x.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    match best {
        Some((i, _)) => Ok(i as i64),
        None => bail!("every logit is NaN"),
    }
}

/// The repetition penalty on the logits of the tokens in `seen` (each once).
pub fn penalize(x: &mut [f32], seen: &[i64], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut done = vec![false; x.len()];
    for &t in seen {
        let Ok(t) = usize::try_from(t) else { continue };
        if t < x.len() && !done[t] {
            done[t] = true;
            x[t] = if x[t] > 0.0 {
                x[t] / penalty
            } else {
                x[t] * penalty
            };
        }
    }
}

/// Temperature, top-k, top-p and min-p, in that order.
pub fn warp(x: &mut [f32], o: &SamplingOptions) {
    if o.temperature != 1.0 {
        x.iter_mut().for_each(|v| *v /= o.temperature);
    }
    if o.top_k > 0 && o.top_k < x.len() {
        top_k(x, o.top_k);
    }
    if o.top_p < 1.0 {
        top_p(x, o.top_p);
    }
    if o.min_p > 0.0 {
        min_p(x, o.min_p);
    }
}

fn top_k(x: &mut [f32], k: usize) {
    let mut sorted: Vec<f32> = x.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let Some(&kth) = sorted.get(k - 1) else {
        return;
    };
    x.iter_mut()
        // below the k-th value, or NaN
        .filter(|v| (**v).partial_cmp(&kth).is_none_or(|o| o.is_lt()))
        .for_each(|v| *v = f32::NEG_INFINITY);
}

fn top_p(x: &mut [f32], p: f32) {
    let probs = softmax(x);
    let mut order: Vec<usize> = (0..x.len()).collect();
    // Most likely first; equal probabilities by index, as a stable sort of transformers' keeps.
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let mut mass = 0.0f64;
    let mut keep = 0;
    for &i in &order {
        keep += 1;
        mass += probs[i];
        if mass >= f64::from(p) {
            break;
        }
    }
    for &i in &order[keep..] {
        x[i] = f32::NEG_INFINITY;
    }
}

fn min_p(x: &mut [f32], min_p: f32) {
    let probs = softmax(x);
    let top = probs.iter().copied().fold(0.0f64, f64::max);
    let floor = top * f64::from(min_p);
    for (v, &q) in x.iter_mut().zip(&probs) {
        if q < floor {
            *v = f32::NEG_INFINITY;
        }
    }
}

/// The softmax of `x` in f64 (`−inf` gives 0).
pub fn softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![0.0; x.len()];
    }
    let e: Vec<f64> = x.iter().map(|&v| f64::from(v - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// The token whose cumulative probability first exceeds `u` (in `[0, 1)`).
fn draw(x: &[f32], u: f64) -> Result<i64> {
    let probs = softmax(x);
    let mut acc = 0.0;
    let mut last = None;
    for (i, &q) in probs.iter().enumerate() {
        if q > 0.0 {
            acc += q;
            last = Some(i);
            if u < acc {
                return Ok(i as i64);
            }
        }
    }
    // Rounding left the sum a hair under u: the last token with any probability.
    match last {
        Some(i) => Ok(i as i64),
        None => bail!("no token has a finite logit after sampling's processors"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGITS: [f32; 6] = [1.0, 3.0, -2.0, 3.0, 0.5, 2.0];

    fn opts() -> SamplingOptions {
        SamplingOptions {
            do_sample: true,
            ..SamplingOptions::default()
        }
    }

    /// The tokens a processor leaves (finite logits).
    fn kept(x: &[f32]) -> Vec<usize> {
        (0..x.len()).filter(|&i| x[i].is_finite()).collect()
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits_once() {
        let mut x = LOGITS.to_vec();
        penalize(&mut x, &[1, 2, 1, 99, -1], 2.0);
        assert_eq!(x, vec![1.0, 1.5, -4.0, 3.0, 0.5, 2.0]);
    }

    #[test]
    fn top_k_keeps_the_k_largest_and_their_ties() {
        let mut x = LOGITS.to_vec();
        top_k(&mut x, 1);
        assert_eq!(kept(&x), vec![1, 3], "both 3.0s tie for first");
        let mut x = LOGITS.to_vec();
        top_k(&mut x, 3);
        assert_eq!(kept(&x), vec![1, 3, 5]);
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        // Reference: probabilities in descending order, cumulative sums, first index reaching p.
        let probs = softmax(&LOGITS);
        for p in [0.05f32, 0.3, 0.5, 0.8, 0.95, 0.999] {
            let mut order: Vec<usize> = (0..6).collect();
            order.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap().then(a.cmp(&b)));
            let mut want = Vec::new();
            let mut mass = 0.0;
            for &i in &order {
                want.push(i);
                mass += probs[i];
                if mass >= f64::from(p) {
                    break;
                }
            }
            want.sort();
            let mut x = LOGITS.to_vec();
            top_p(&mut x, p);
            assert_eq!(kept(&x), want, "p = {p}");
        }
    }

    #[test]
    fn min_p_removes_tokens_below_a_share_of_the_most_likely() {
        let probs = softmax(&LOGITS);
        let top = probs.iter().cloned().fold(0.0, f64::max);
        for m in [0.1f32, 0.3, 0.5, 1.0] {
            let want: Vec<usize> = (0..6).filter(|&i| probs[i] >= top * f64::from(m)).collect();
            let mut x = LOGITS.to_vec();
            min_p(&mut x, m);
            assert_eq!(kept(&x), want, "min_p = {m}");
        }
    }

    #[test]
    fn temperature_scales_before_the_filters() {
        // At temperature 0.5 the gaps double: top-p 0.9 then needs fewer tokens than at 1.
        let o = SamplingOptions {
            temperature: 0.5,
            top_p: 0.9,
            ..opts()
        };
        let mut x = LOGITS.to_vec();
        warp(&mut x, &o);
        assert_eq!(x[1], 6.0);
        let mut plain = LOGITS.to_vec();
        top_p(&mut plain, 0.9);
        assert!(kept(&x).len() < kept(&plain).len());
    }

    #[test]
    fn top_k_one_is_greedy_and_greedy_applies_the_penalty() {
        let x = [0.1f32, 2.0, 1.9, -1.0];
        let mut s = Sampler::new(SamplingOptions { top_k: 1, ..opts() }).unwrap();
        for _ in 0..20 {
            assert_eq!(s.next_token(&x, &[]).unwrap(), 1);
        }
        let mut g = Sampler::new(SamplingOptions {
            repetition_penalty: 1.2,
            ..SamplingOptions::default()
        })
        .unwrap();
        assert_eq!(g.next_token(&x, &[]).unwrap(), 1);
        assert_eq!(g.next_token(&x, &[1]).unwrap(), 2, "2.0 / 1.2 < 1.9");
    }

    #[test]
    fn draws_follow_the_distribution_and_the_seed() {
        let x = [0.0f32, 1.0, 2.0];
        let probs = softmax(&x);
        let mut s = Sampler::new(SamplingOptions { seed: 7, ..opts() }).unwrap();
        let n = 20_000;
        let mut counts = [0usize; 3];
        let mut first = Vec::new();
        for i in 0..n {
            let t = s.next_token(&x, &[]).unwrap() as usize;
            counts[t] += 1;
            if i < 32 {
                first.push(t);
            }
        }
        for (c, p) in counts.iter().zip(&probs) {
            let freq = *c as f64 / n as f64;
            assert!((freq - p).abs() < 0.015, "{counts:?} vs {probs:?}");
        }
        let mut again = Sampler::new(SamplingOptions { seed: 7, ..opts() }).unwrap();
        let repeat: Vec<usize> = (0..32)
            .map(|_| again.next_token(&x, &[]).unwrap() as usize)
            .collect();
        assert_eq!(first, repeat, "same seed, same tokens");
        let mut other = Sampler::new(SamplingOptions { seed: 8, ..opts() }).unwrap();
        let differ: Vec<usize> = (0..32)
            .map(|_| other.next_token(&x, &[]).unwrap() as usize)
            .collect();
        assert_ne!(first, differ, "another seed, other tokens");
    }

    #[test]
    fn bad_options_are_refused_by_name() {
        for (o, name) in [
            (
                SamplingOptions {
                    temperature: 0.0,
                    ..opts()
                },
                "--temperature",
            ),
            (
                SamplingOptions {
                    top_p: 0.0,
                    ..opts()
                },
                "--top-p",
            ),
            (
                SamplingOptions {
                    min_p: 1.5,
                    ..opts()
                },
                "--min-p",
            ),
            (
                SamplingOptions {
                    repetition_penalty: -1.0,
                    ..opts()
                },
                "--repetition-penalty",
            ),
        ] {
            let e = Sampler::new(o).err().unwrap().to_string();
            assert!(e.contains(name), "{e}");
        }
    }
}
