//! Timing sessions: warm-up runs, then timed rounds that alternate two sessions, reported as
//! median and spread of each and quartiles of their per-round ratio.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use attnrt_runtime::{NamedTensor, Profile, Session};

/// Statistics of repeated timings, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timing {
    /// Median.
    pub median_ms: f64,
    /// Fastest run.
    pub min_ms: f64,
    /// Slowest run.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// Median absolute deviation from the median (robust spread).
    pub mad_ms: f64,
    /// Number of timed runs.
    pub reps: usize,
}

impl Timing {
    /// Statistics of `samples` (milliseconds); `None` for no samples.
    pub fn from_samples(samples: &[f64]) -> Option<Timing> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let median = median_sorted(&s);
        let mut dev: Vec<f64> = s.iter().map(|x| (x - median).abs()).collect();
        dev.sort_by(|a, b| a.total_cmp(b));
        Some(Timing {
            median_ms: median,
            min_ms: s[0],
            max_ms: s[s.len() - 1],
            mean_ms: s.iter().sum::<f64>() / s.len() as f64,
            mad_ms: median_sorted(&dev),
            reps: s.len(),
        })
    }
}

fn median_sorted(s: &[f64]) -> f64 {
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Lower quartile, median and upper quartile of `samples` (the nearest ranks; zeros for none).
pub fn quartiles(samples: &[f64]) -> [f64; 3] {
    if samples.is_empty() {
        return [0.0; 3];
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |f: f64| s[((s.len() - 1) as f64 * f).round() as usize];
    [at(0.25), at(0.5), at(0.75)]
}

/// Two sessions timed in alternation (see [`time_paired`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairedTiming {
    /// The first session's runs.
    pub a: Timing,
    /// The second session's runs.
    pub b: Timing,
    /// Quartiles `[q1, median, q3]` of the per-round ratio `b / a` (> 1: `a` is faster).
    pub ratio_b_over_a: [f64; 3],
}

/// Times two sessions on the same inputs: `warmup` untimed runs of each, then `reps` rounds
/// that run each session once, the order swapped every round. On a machine whose speed drifts
/// (shared hosts, turbo), timing all of `a`'s runs and then all of `b`'s compares two different
/// moments; the per-round ratio compares runs taken seconds apart. `progress` is called after
/// every run, warm-up included (`2·(warmup + reps)` calls), so a caller can draw a progress bar.
/// Each timed run moves its own copy of `inputs` into the session (`Session::run_owned`),
/// copied before its clock starts.
pub fn time_paired(
    a: &Session,
    b: &Session,
    inputs: &[NamedTensor],
    warmup: usize,
    reps: usize,
    progress: impl FnMut(),
) -> Result<PairedTiming> {
    Ok(time_rounds(a, b, inputs, (warmup, reps), false, progress)?.0)
}

/// [`time_paired`], with every node of the timed runs timed too: the profiles of `a` and `b`,
/// each the mean over its `reps` timed runs (the same runs as the timing; the session always
/// times its nodes, so profiling adds only the bookkeeping).
pub fn time_paired_profiled(
    a: &Session,
    b: &Session,
    inputs: &[NamedTensor],
    warmup: usize,
    reps: usize,
    progress: impl FnMut(),
) -> Result<(PairedTiming, [Profile; 2])> {
    let (timing, profiles) = time_rounds(a, b, inputs, (warmup, reps), true, progress)?;
    Ok((timing, profiles.unwrap_or_default()))
}

fn time_rounds(
    a: &Session,
    b: &Session,
    inputs: &[NamedTensor],
    (warmup, reps): (usize, usize),
    profile: bool,
    mut progress: impl FnMut(),
) -> Result<(PairedTiming, Option<[Profile; 2]>)> {
    for s in [a, b] {
        for _ in 0..warmup {
            s.run(inputs)?;
            progress();
        }
    }
    let mut profiles = [Profile::default(), Profile::default()];
    // Each timed run gets its own copy of the inputs, made before the clock starts and moved
    // into the session: the time is the model's, as in a decode loop that feeds its outputs
    // back (and as ONNX Runtime's Python binding reads numpy inputs in place).
    let mut timed = |s: &Session, slot: usize| -> Result<f64> {
        let owned = inputs.to_vec();
        let t = Instant::now();
        if profile {
            let (_, p) = s.run_owned_profiled(owned)?;
            profiles[slot].merge(p);
        } else {
            s.run_owned(owned)?;
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        progress();
        Ok(ms)
    };
    let reps = reps.max(1);
    let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for round in 0..reps {
        let (x, y) = if round % 2 == 0 {
            let x = timed(a, 0)?;
            (x, timed(b, 1)?)
        } else {
            let y = timed(b, 1)?;
            (timed(a, 0)?, y)
        };
        ta.push(x);
        tb.push(y);
    }
    let ratios: Vec<f64> = ta.iter().zip(&tb).map(|(x, y)| y / x).collect();
    let timing = PairedTiming {
        a: Timing::from_samples(&ta).expect("at least one round"),
        b: Timing::from_samples(&tb).expect("at least one round"),
        ratio_b_over_a: quartiles(&ratios),
    };
    Ok((timing, profile.then_some(profiles)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        let t = Timing::from_samples(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(t.median_ms, 2.5);
        assert_eq!(t.min_ms, 1.0);
        assert_eq!(t.max_ms, 10.0);
        assert_eq!(t.reps, 4);
        assert_eq!(t.mad_ms, 1.0);
        assert!(Timing::from_samples(&[]).is_none());
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]), [2.0, 3.0, 4.0]);
        assert_eq!(quartiles(&[]), [0.0; 3]);
    }
}
