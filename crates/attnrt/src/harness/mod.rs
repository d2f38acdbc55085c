//! The harness around a run: where inputs come from ([`inputs`], [`npy`]), how outputs are
//! compared ([`diff`], with tolerances that follow the element type), timed ([`timing`]) and
//! summarised ([`summary`]), profiled (`attnrt_runtime::profile`), and [`compare()`]: the one pipeline "fuse → run fused → run unfused →
//! diff → compare with expected outputs" that `attnrt run`, the model tests and the benches
//! share, returning a serializable [`compare::Comparison`].
//!
//! The runtime crate stays "graph → session → outputs"; everything a user or a test wraps
//! around that lives here.

pub mod compare;
pub mod diff;
pub mod inputs;
pub mod npy;
pub mod summary;
pub mod timing;

pub use compare::{compare, CompareOptions, Comparison, PathRun, PinnedDiffs};
pub use diff::{diff_outputs, diff_tensor, OutputDiff, Tolerance, ToleranceChoice};
pub use inputs::{prepare_inputs, vocab_bound, DimBinding, InputOptions, PreparedInputs};
pub use npy::{read_npz_tensors, write_npz};
pub use summary::{summarize, TensorSummary};
pub use timing::{quartiles, time_paired, time_paired_profiled, PairedTiming, Timing};
