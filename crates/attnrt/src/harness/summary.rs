//! A one-line summary of a tensor's values (min, max, mean, NaN count).

use attnrt_runtime::Tensor;
use serde::Serialize;

/// Min, max and mean of a tensor's values (NaNs counted apart), for the run report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TensorSummary {
    /// Smallest non-NaN value.
    pub min: f64,
    /// Largest non-NaN value.
    pub max: f64,
    /// Mean of the non-NaN values.
    pub mean: f64,
    /// Number of NaN values.
    pub nan: usize,
}

/// Summarizes a numeric or bool tensor; `None` for types without a numeric view.
pub fn summarize(t: &Tensor) -> Option<TensorSummary> {
    let c = t.cast_to::<f64>().ok()?;
    let data = c.try_as_plain_ram().ok()?.as_slice::<f64>().ok()?;
    let (mut min, mut max, mut sum, mut n, mut nan) =
        (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0usize, 0usize);
    for &x in data {
        if x.is_nan() {
            nan += 1;
            continue;
        }
        min = min.min(x);
        max = max.max(x);
        sum += x;
        n += 1;
    }
    if n == 0 {
        return Some(TensorSummary {
            min: f64::NAN,
            max: f64::NAN,
            mean: f64::NAN,
            nan,
        });
    }
    Some(TensorSummary {
        min,
        max,
        mean: sum / n as f64,
        nan,
    })
}
