//! The compare pipeline: fuse → run fused → run unfused → diff → compare with expected outputs.
//!
//! One function, [`compare`], used by `attnrt run`, the tests over `models/` and the benches'
//! correctness checks, returns a [`Comparison`]: the fusion report, what each path ran (op
//! placement, build and run times), the fused-vs-unfused diffs and the diffs against expected
//! outputs (e.g. PyTorch's, saved next to a model), each output judged by the tolerance of its
//! element type unless the caller fixes one. It serializes to JSON as is. A dynamically
//! quantized model whose paths differ is compared again with its int8 steps pinned
//! ([`PinnedDiffs`], `attnrt_runtime::quant_pins`).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use attnrt_fusion::{FusionOptions, FusionReport};
use attnrt_onnx::ModelProto;
use attnrt_runtime::quant_pins::{PinReport, QuantPins};
use attnrt_runtime::{
    run_once_in_session, DatumType, MemoryBudget, NamedTensor, OpCounts, Profile, RunResult,
    Session, SessionOptions, ShapePolicy, Threads,
};
use serde::Serialize;

use super::diff::{diff_outputs, OutputDiff, ToleranceChoice};

/// What to run and how to judge it.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Do not fuse: run the original graph only.
    pub no_fuse: bool,
    /// Run the fused model only (no unfused reference, no fused-vs-unfused diff).
    pub no_diff: bool,
    /// Fuse only blocks whose fused form is exact on every input.
    pub strict: bool,
    /// Leave GELU activations unfused.
    pub no_gelu: bool,
    /// Tolerance of the fused-vs-unfused diff.
    pub tolerance: ToleranceChoice,
    /// Tolerance of the diffs against expected outputs (`None`: the same as `tolerance`).
    pub expect_tolerance: Option<ToleranceChoice>,
    /// attnrt's ops for the projections, `LayerNormalization` and `Gelu`
    /// ([`SessionOptions::attnrt_ops`]; on by default).
    pub attnrt_ops: bool,
    /// A float16/bfloat16 model's arithmetic in float32 ([`SessionOptions::half_as_float`];
    /// on by default).
    pub half_as_float: bool,
    /// Time every node of each path's run ([`PathRun::profile`]).
    pub profile: bool,
    /// The memory each path's run may need; a path over it is refused before it runs.
    pub budget: MemoryBudget,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            no_fuse: false,
            no_diff: false,
            strict: false,
            no_gelu: false,
            tolerance: ToleranceChoice::default(),
            expect_tolerance: None,
            attnrt_ops: SessionOptions::default().attnrt_ops,
            half_as_float: SessionOptions::default().half_as_float,
            profile: false,
            budget: MemoryBudget::default(),
        }
    }
}

/// One path that ran (the fused or the unfused graph).
#[derive(Debug, Clone, Serialize)]
pub struct PathRun {
    /// Outputs in graph order (not serialized; see [`Comparison::primary`]).
    #[serde(skip)]
    pub outputs: Vec<NamedTensor>,
    /// Time to parse, type, optimize and plan the graph, in milliseconds.
    pub build_ms: f64,
    /// Time of the one run, in milliseconds.
    pub run_ms: f64,
    /// What the planned graph ran, by implementation.
    pub ops: OpCounts,
    /// Where the run's time went, with [`CompareOptions::profile`] (not serialized; see
    /// [`Profile::report`]).
    #[serde(skip)]
    pub profile: Option<Profile>,
}

impl From<RunResult> for PathRun {
    fn from(r: RunResult) -> Self {
        PathRun {
            outputs: r.outputs,
            build_ms: r.build_ms,
            run_ms: r.run_ms,
            ops: r.ops,
            profile: r.profile,
        }
    }
}

/// The result of [`compare`].
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The model's name in messages (usually its path).
    pub model: String,
    /// The fusion report; `None` with [`CompareOptions::no_fuse`].
    pub fusion: Option<FusionReport>,
    /// The fused model, when at least one block was fused (not serialized).
    #[serde(skip)]
    pub fused_model: Option<ModelProto>,
    /// The fused path, when a block was fused.
    pub fused: Option<PathRun>,
    /// The unfused path, when it ran (no block fused, or as the reference of the diff).
    pub unfused: Option<PathRun>,
    /// Fused vs unfused, per output; `None` when only one path ran.
    pub diffs: Option<Vec<OutputDiff>>,
    /// Per path (`"fused"`, `"unfused"`), its outputs against the expected ones.
    pub expect: Option<BTreeMap<String, Vec<OutputDiff>>>,
    /// The tolerance the fused-vs-unfused diff used.
    pub tolerance: ToleranceChoice,
    /// A dynamically quantized model whose fused and unfused outputs differ beyond tolerance:
    /// the fused path again, with the unfused run's activation quantizations pinned.
    pub pinned: Option<PinnedDiffs>,
}

/// The fused path run a second time with the unfused run's activation quantizations pinned
/// (`attnrt_runtime::quant_pins`): each quantized projection whose input is within the diff's
/// float32 tolerance of the unfused run's takes that run's quantization, so a step flipped by a
/// rounding difference upstream is not passed on. The fused path agrees with the unfused one
/// when no projection diverged and these diffs are within tolerance.
#[derive(Debug, Clone, Serialize)]
pub struct PinnedDiffs {
    /// What the pins did.
    pub pins: PinReport,
    /// Pinned fused vs unfused, per output.
    pub diffs: Vec<OutputDiff>,
}

impl PinnedDiffs {
    /// No projection diverged and every output is within tolerance.
    pub fn ok(&self) -> bool {
        self.pins.diverged.is_empty() && self.diffs.iter().all(|d| d.ok)
    }
}

impl Comparison {
    /// Number of attention blocks fused.
    pub fn blocks(&self) -> usize {
        self.fusion.as_ref().map_or(0, |f| f.blocks.len())
    }

    /// The path whose outputs a user gets: the fused one when it ran, else the unfused one.
    pub fn primary(&self) -> &PathRun {
        match (&self.fused, &self.unfused) {
            (Some(f), _) => f,
            (None, Some(u)) => u,
            (None, None) => unreachable!("compare always runs one path"),
        }
    }

    /// Whether every diff is within its tolerance.
    pub fn ok(&self) -> bool {
        self.failures().is_empty()
    }

    /// One phrase per output out of tolerance, e.g. `'y' fused vs unfused`.
    pub fn failures(&self) -> Vec<String> {
        let mut bad = Vec::new();
        match &self.pinned {
            Some(p) => {
                for d in p.diffs.iter().filter(|d| !d.ok) {
                    bad.push(format!(
                        "'{}' fused vs unfused (quantization pinned)",
                        d.name
                    ));
                }
                for why in &p.pins.diverged {
                    bad.push(format!("quantized projection {why}"));
                }
            }
            None => {
                for d in self.diffs.iter().flatten().filter(|d| !d.ok) {
                    bad.push(format!("'{}' fused vs unfused", d.name));
                }
            }
        }
        for (path, ds) in self.expect.iter().flatten() {
            for d in ds.iter().filter(|d| !d.ok) {
                bad.push(format!("'{}' {path} vs expected", d.name));
            }
        }
        bad
    }

    /// One line on what fusion did.
    pub fn fusion_note(&self) -> String {
        match &self.fusion {
            None => "not attempted (--no-fuse)".to_string(),
            Some(_) if self.blocks() == 0 => {
                "found no attention block to fuse; ran the original graph".to_string()
            }
            Some(_) => format!("{} attention block(s) fused", self.blocks()),
        }
    }
}

/// Fuses `model` (unless told not to), runs the fused and the unfused graph on `inputs`, and
/// diffs them against each other and against `expected` when given.
pub fn compare(
    model: &ModelProto,
    name: &str,
    inputs: &[NamedTensor],
    expected: Option<&[NamedTensor]>,
    threads: &Threads,
    options: &CompareOptions,
) -> Result<Comparison> {
    let fused = if options.no_fuse {
        None
    } else {
        let fusion = FusionOptions {
            strict: options.strict,
            gelu: !options.no_gelu,
        };
        Some(
            attnrt_fusion::fuse(model, &fusion)
                .with_context(|| format!("{name}: fusion failed"))?,
        )
    };
    let (fusion, fused_model) = match fused {
        Some(f) if f.report.changed() => (Some(f.report), Some(f.model)),
        Some(f) => (Some(f.report), None),
        None => (None, None),
    };
    let session = SessionOptions {
        attnrt_ops: options.attnrt_ops,
        half_as_float: options.half_as_float,
        shapes: ShapePolicy::PerShape,
        max_memory: options.budget.clone(),
        ..SessionOptions::default()
    };
    let run = |m: &ModelProto, what: String| -> Result<(Session, PathRun)> {
        let (s, r) = run_once_in_session(m, inputs, threads, &what, &session, options.profile)?;
        Ok((s, r.into()))
    };
    // The fused session lives until the other paths have run: their sessions share its packed
    // weights and constants (the fused model shares the initializers' bytes), rather than
    // making them again after it is gone (a second packing of every weight, and the allocator's
    // pages of the first still resident beside it).
    let (fused_session, fused_run) = match fused_model.as_ref() {
        Some(m) => {
            let (s, r) = run(m, format!("fused {name}"))?;
            (Some(s), Some(r))
        }
        None => (None, None),
    };
    // The unfused run records its activation quantizations, for `pinned` below.
    let recorder = QuantPins::recorder();
    let unfused_run = (fused_run.is_none() || !options.no_diff)
        .then(|| recorder.during(|| run(model, name.to_string())))
        .transpose()?
        .map(|(_, r)| r);
    let diffs = match (&fused_run, &unfused_run) {
        (Some(f), Some(u)) => Some(diff_outputs(&f.outputs, &u.outputs, options.tolerance)),
        _ => None,
    };
    let flipped = diffs.iter().flatten().any(|d| !d.ok) && recorder.recorded() > 0;
    let pinned = match (&fused_model, &unfused_run) {
        (Some(m), Some(u)) if flipped => {
            let f32_tol = options.tolerance.for_dtype(DatumType::F32);
            let pins = QuantPins::replayer(&recorder, f32_tol.atol as f32, f32_tol.rtol as f32);
            let (_, again) =
                pins.during(|| run(m, format!("fused {name} (quantization pinned)")))?;
            Some(PinnedDiffs {
                pins: pins.report(),
                diffs: diff_outputs(&again.outputs, &u.outputs, options.tolerance),
            })
        }
        _ => None,
    };
    drop(fused_session);
    let expect = expected.map(|exp| {
        let tol = options.expect_tolerance.unwrap_or(options.tolerance);
        [("fused", &fused_run), ("unfused", &unfused_run)]
            .into_iter()
            .filter_map(|(path, r)| {
                Some((
                    path.to_string(),
                    diff_outputs(&r.as_ref()?.outputs, exp, tol),
                ))
            })
            .collect()
    });
    Ok(Comparison {
        model: name.to_string(),
        fusion,
        fused_model,
        fused: fused_run,
        unfused: unfused_run,
        diffs,
        expect,
        tolerance: options.tolerance,
        pinned,
    })
}
