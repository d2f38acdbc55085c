//! Pinned activation quantization: how two runs of one dynamically quantized model (the fused
//! graph and the unfused one) are compared when a rounding difference flips a quantization step.
//!
//! `DynamicQuantizeLinear` is a step function: two float inputs that agree to the last bit but
//! one may straddle a rounding boundary (`x / scale` near `k + ½`), or move the tensor's range and
//! with it the scale, and then quantize one step apart; the integer product passes that step on
//! (`a_scale · w_scale · w[p, j]` in every output column) and the steps downstream compound it.
//! The fused attention and `Gelu` round differently from the unfused graph's ops (different sums,
//! by a few ulps), so on a large int8 model the two paths' outputs can differ by far more than
//! float32 rounding although each computed its own graph correctly.
//!
//! A comparison therefore records, in the reference run, each quantized projection's float input
//! and the quantization it made ([`QuantPins::recorder`]), and runs the other path again with
//! those quantizations offered ([`QuantPins::replayer`]): a projection whose input agrees with
//! the recorded one within the comparison's tolerance, element by element, takes the recorded
//! quantization (scale, zero point and codes), so both paths multiply the same integers; one
//! whose input does not agree quantizes its own and is counted as diverged (the comparison
//! fails). The pinned outputs must then agree within float32 tolerance. What the pins did is
//! reported ([`PinReport`]): how many projections took a recorded quantization, how many values
//! their own would have quantized a step apart, and the largest input difference seen.
//!
//! The pins are per run, not per session: [`QuantPins::during`] makes them the current ones of
//! the calling thread, and a session's run carries them onto the pool thread that evaluates the
//! plan (`session/execute.rs`).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use attnrt_kernels::quant::QuantizedRows;
use serde::Serialize;

/// The quantizations of one run, recorded or offered (see the module docs). Cheap to clone: the
/// clones share one record.
#[derive(Clone, Debug)]
pub struct QuantPins {
    inner: Arc<Mutex<Pins>>,
}

#[derive(Debug)]
struct Pins {
    /// `None` while recording; when replaying, how close an input must be to take the record.
    replay: Option<(f32, f32)>,
    /// Per projection node, its recorded quantizations in the order they were made.
    records: HashMap<String, VecDeque<Record>>,
    report: PinReport,
}

#[derive(Debug)]
struct Record {
    x: Vec<f32>,
    rows: QuantizedRows,
}

/// What the pins did in a replayed run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PinReport {
    /// Quantized projections evaluated (in the replayed run).
    pub projections: usize,
    /// Of those, how many took the recorded quantization.
    pub pinned: usize,
    /// Values the pinned projections' own quantization would have put a different number of
    /// steps from zero (a code flipped by rounding, or the zero point moved), summed.
    pub steps_flipped: usize,
    /// Pinned projections whose own scale or zero point differed from the recorded one.
    pub ranges_moved: usize,
    /// The largest |input − recorded input| of a pinned projection.
    pub input_max_abs: f64,
    /// Projections whose input was beyond the tolerance of the recorded one (or had no record):
    /// `node: why`.
    pub diverged: Vec<String>,
}

thread_local! {
    /// The pins of the run on this thread.
    static CURRENT: RefCell<Option<QuantPins>> = const { RefCell::new(None) };
}

impl QuantPins {
    /// Pins that record every quantization made while they are current.
    pub fn recorder() -> QuantPins {
        QuantPins::with_replay(None)
    }

    /// The quantizations `recorded`, offered to a run: an input within `atol + rtol·|recorded|`
    /// of the recorded one, element by element, takes the recorded quantization.
    pub fn replayer(recorded: &QuantPins, atol: f32, rtol: f32) -> QuantPins {
        let records = std::mem::take(&mut recorded.lock().records);
        let pins = QuantPins::with_replay(Some((atol, rtol)));
        pins.lock().records = records;
        pins
    }

    fn with_replay(replay: Option<(f32, f32)>) -> QuantPins {
        QuantPins {
            inner: Arc::new(Mutex::new(Pins {
                replay,
                records: HashMap::new(),
                report: PinReport::default(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pins> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many quantizations were recorded (0: the run made none; nothing to pin).
    pub fn recorded(&self) -> usize {
        self.lock().records.values().map(VecDeque::len).sum()
    }

    /// What the pins did so far.
    pub fn report(&self) -> PinReport {
        self.lock().report.clone()
    }

    /// Runs `f` with these pins current on this thread (a session's run takes them along).
    pub fn during<R>(&self, f: impl FnOnce() -> R) -> R {
        scoped(Some(self.clone()), f)
    }
}

/// The pins current on this thread, if any.
pub(crate) fn current() -> Option<QuantPins> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Runs `f` with `pins` current on this thread, the outer ones restored after (also on a panic).
pub(crate) fn scoped<R>(pins: Option<QuantPins>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<QuantPins>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| *c.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(pins)));
    f()
}

/// The quantization of `x` for projection `node`: `own()`'s, recorded when the current pins
/// record, or the recorded one when they replay and `x` is within tolerance of its input.
pub(crate) fn quantize(
    node: &str,
    x: &[f32],
    own: impl FnOnce() -> QuantizedRows,
) -> QuantizedRows {
    let Some(pins) = current() else {
        return own();
    };
    let rows = own();
    let mut p = pins.lock();
    let Some((atol, rtol)) = p.replay else {
        let record = Record {
            x: x.to_vec(),
            rows: rows.clone(),
        };
        p.records
            .entry(node.to_string())
            .or_default()
            .push_back(record);
        return rows;
    };
    p.report.projections += 1;
    let Some(record) = p.records.get_mut(node).and_then(VecDeque::pop_front) else {
        p.report
            .diverged
            .push(format!("{node}: not quantized in the reference run"));
        return rows;
    };
    match input_max_abs(x, &record.x, atol, rtol) {
        Some(d) => {
            let r = &mut p.report;
            r.pinned += 1;
            r.input_max_abs = r.input_max_abs.max(f64::from(d));
            r.steps_flipped += rows.steps_differing(&record.rows);
            r.ranges_moved += usize::from(
                rows.scale().to_bits() != record.rows.scale().to_bits()
                    || rows.zero_point() != record.rows.zero_point(),
            );
            record.rows
        }
        None => {
            let why = format!("{node}: input beyond tolerance of the reference run's");
            p.report.diverged.push(why);
            rows
        }
    }
}

/// `max |x − r|` when every element is within `atol + rtol·|r|` (NaNs agreeing with NaNs) and
/// the lengths agree; `None` otherwise.
fn input_max_abs(x: &[f32], r: &[f32], atol: f32, rtol: f32) -> Option<f32> {
    if x.len() != r.len() {
        return None;
    }
    let mut worst = 0f32;
    for (&a, &b) in x.iter().zip(r) {
        if a.is_nan() && b.is_nan() {
            continue;
        }
        let d = (a - b).abs();
        if d.is_nan() || d > atol + rtol * b.abs() {
            return None;
        }
        worst = worst.max(d);
    }
    Some(worst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_kernels::KernelSet;

    fn rows(x: &[f32]) -> QuantizedRows {
        let k = KernelSet::resolve().unwrap();
        QuantizedRows::quantize_dynamic(k.quant(), k.threads(), x, 1, x.len())
    }

    #[test]
    fn a_replay_takes_the_recorded_quantization_of_an_input_within_tolerance() {
        // 126.5 (scale 1) sits on a rounding boundary, rounded to the even 126: one ulp more is 127.
        let reference = [0.0f32, 126.5, 255.0];
        let nudged = [0.0f32, 126.5f32.next_up(), 255.0];
        assert_ne!(rows(&reference), rows(&nudged), "the nudge flips a step");
        let recorder = QuantPins::recorder();
        let got = recorder.during(|| quantize("p", &reference, || rows(&reference)));
        assert_eq!(got, rows(&reference), "recording changes nothing");
        assert_eq!(recorder.recorded(), 1);
        let replay = QuantPins::replayer(&recorder, 1e-4, 1e-4);
        let got = replay.during(|| quantize("p", &nudged, || rows(&nudged)));
        assert_eq!(got, rows(&reference));
        let r = replay.report();
        assert_eq!((r.projections, r.pinned, r.steps_flipped), (1, 1, 1));
        assert!(r.diverged.is_empty());
        assert!(r.input_max_abs > 0.0 && r.input_max_abs < 1e-4);
    }

    #[test]
    fn an_input_beyond_tolerance_or_without_a_record_keeps_its_own_and_diverges() {
        let recorder = QuantPins::recorder();
        recorder.during(|| quantize("p", &[0.0, 1.0], || rows(&[0.0, 1.0])));
        let replay = QuantPins::replayer(&recorder, 1e-4, 1e-4);
        let far = [0.0f32, 2.0];
        let got = replay.during(|| {
            let a = quantize("p", &far, || rows(&far));
            let b = quantize("q", &far, || rows(&far));
            (a, b)
        });
        assert_eq!(got, (rows(&far), rows(&far)));
        let r = replay.report();
        assert_eq!((r.projections, r.pinned, r.diverged.len()), (2, 0, 2));
        // outside `during`, nothing is recorded or replayed
        assert_eq!(quantize("p", &far, || rows(&far)), rows(&far));
    }
}
