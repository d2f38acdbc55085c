//! Timing a session: warm-up runs, then timed repetitions, reported as median and spread.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::io::NamedTensor;
use crate::session::Session;

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

/// Runs `session` `warmup` times untimed, then `reps` times timed; `progress` is called after
/// every run (warm-up included) so a caller can draw a progress bar.
pub fn time_session(
    session: &Session,
    inputs: &[NamedTensor],
    warmup: usize,
    reps: usize,
    mut progress: impl FnMut(),
) -> Result<Timing> {
    for _ in 0..warmup {
        session.run(inputs)?;
        progress();
    }
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        session.run(inputs)?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        progress();
    }
    Ok(Timing::from_samples(&samples).expect("at least one sample"))
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
    }
}
