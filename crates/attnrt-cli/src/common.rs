//! Flags shared by several commands: limits, the memory budget, inputs, threads.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use attnrt::harness::{InputOptions, PreparedInputs};
use attnrt::{Limits, LoadedModel, MemoryBudget, OpCounts, Threads};
use clap::Args;

/// Limits on what a model may make attnrt do (issue: hostile models).
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Largest model file accepted, in bytes: 2 GiB, or the default memory budget when that is
    /// less. (Limit flags may be repeated; the last one wins.)
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_model_bytes, overrides_with = "max_model_bytes")]
    pub max_model_bytes: u64,
    /// Largest number of elements of one tensor (initializers, inputs): 2^32, or fewer when the
    /// default memory budget holds fewer at 8 bytes each.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_tensor_elements, overrides_with = "max_tensor_elements")]
    pub max_tensor_elements: u64,
    /// Largest number of graph nodes (subgraphs included).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_nodes, overrides_with = "max_nodes")]
    pub max_nodes: usize,
    /// Deepest nesting of subgraphs (If/Loop/Scan bodies) accepted.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_subgraph_depth, overrides_with = "max_subgraph_depth")]
    pub max_subgraph_depth: usize,
}

impl LimitArgs {
    /// The limits for attnrt-onnx.
    pub fn limits(&self) -> Limits {
        Limits {
            max_model_bytes: self.max_model_bytes,
            max_tensor_elements: self.max_tensor_elements,
            max_nodes: self.max_nodes,
            max_subgraph_depth: self.max_subgraph_depth,
            ..Limits::default()
        }
    }
}

/// `--max-memory`: the memory budget of the runs (issue 28).
#[derive(Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Refuse, before allocating, inputs or a run whose tensors alive at once would need more
    /// memory than SIZE: bytes, or a number with K, M, G or T (powers of 1024), e.g. 8G, 512M
    /// [default: 75% of the memory available]
    #[arg(long, value_name = "SIZE", value_parser = parse_budget, overrides_with = "max_memory")]
    pub max_memory: Option<MemoryBudget>,
}

fn parse_budget(s: &str) -> Result<MemoryBudget, String> {
    MemoryBudget::parse(s).map_err(|e| e.to_string())
}

impl MemoryArgs {
    /// The budget given, else the machine's default.
    pub fn budget(&self) -> MemoryBudget {
        self.max_memory
            .clone()
            .unwrap_or_else(MemoryBudget::machine_default)
    }
}

/// Where input values come from.
#[derive(Args, Debug, Clone)]
pub struct InputArgs {
    /// An input from a .npy file (repeatable).
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Inputs from one .npz file, by name (--input overrides single entries).
    #[arg(long, value_name = "FILE.npz")]
    pub input_npz: Option<PathBuf>,
    /// Seed of the random inputs used when no input file is given.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Binds a symbolic dimension (repeatable); unbound ones default to 1 (batch-like) or 16.
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
    pub dims: Vec<(String, usize)>,
    /// Random integer inputs are drawn from [0, N) (default: the smallest embedding table the
    /// input indexes, else 2). Inputs whose name contains "mask" get ones.
    #[arg(long, value_name = "N")]
    pub vocab: Option<u64>,
}

fn parse_input(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((n, f)) if !n.is_empty() && !f.is_empty() => Ok((n.to_string(), PathBuf::from(f))),
        _ => Err(format!("expected NAME=FILE.npy, got '{s}'")),
    }
}

fn parse_dim(s: &str) -> Result<(String, usize), String> {
    let (n, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got '{s}'"))?;
    if n.is_empty() {
        return Err(format!("expected NAME=VALUE, got '{s}'"));
    }
    let v: usize = v
        .parse()
        .map_err(|_| format!("'{v}' is not a non-negative integer"))?;
    Ok((n.to_string(), v))
}

impl InputArgs {
    /// Builds the inputs of `model`, refusing them over `budget` before they are allocated.
    pub fn prepare(
        &self,
        loaded: &LoadedModel,
        limits: &Limits,
        budget: &MemoryBudget,
    ) -> Result<PreparedInputs> {
        let mut dims = BTreeMap::new();
        for (n, v) in &self.dims {
            if dims.insert(n.clone(), *v).is_some_and(|old| old != *v) {
                bail!("--dim {n} given twice with different values");
            }
        }
        if self.vocab == Some(0) {
            bail!("--vocab must be at least 1");
        }
        let options = InputOptions {
            npy: self.inputs.clone(),
            npz: self.input_npz.clone(),
            seed: self.seed,
            dims,
            vocab: self.vocab,
            max_elements: limits.max_tensor_elements,
            budget: budget.clone(),
        };
        attnrt::harness::prepare_inputs(&loaded.model, &options)
            .with_context(|| format!("preparing the inputs of {}", loaded.path.display()))
    }
}

/// Loads a model (external data inlined), with the path in every error.
pub fn load(path: &std::path::Path, limits: &Limits) -> Result<LoadedModel> {
    attnrt::load_model(path, limits)
}

/// `--matmul`: which implementation runs the `MatMul`s by a constant weight (the projections).
#[derive(Args, Debug, Clone, Copy)]
pub struct MatmulArgs {
    /// Implementation of `MatMul` by a constant 2-D f32 weight (the projections), on every path
    /// run: `attnrt` (the `gemm` crate's kernels) or `tract` (tract's own, as plain tract-onnx).
    #[arg(long, value_enum, default_value_t = Matmul::Attnrt)]
    pub matmul: Matmul,
}

/// Values of `--matmul`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matmul {
    /// attnrt's projection op.
    Attnrt,
    /// tract's matmul.
    Tract,
}

impl MatmulArgs {
    /// The session switch it sets: `--matmul tract` turns attnrt's projection,
    /// `LayerNormalization` and `Gelu` ops off (`SessionOptions::attnrt_ops`).
    pub fn attnrt_ops(&self) -> bool {
        self.matmul == Matmul::Attnrt
    }

    /// The value as written on the command line.
    pub fn name(&self) -> &'static str {
        match self.matmul {
            Matmul::Attnrt => "attnrt",
            Matmul::Tract => "tract",
        }
    }
}

/// `--half-as-float`: how a float16/bfloat16 model's arithmetic runs.
#[derive(Args, Debug, Clone, Copy)]
pub struct HalfArgs {
    /// A float16/bfloat16 model's arithmetic in float32 (`on`: weights widened once when the
    /// session is built, graph inputs and outputs keep their types, results within float16
    /// rounding of the graph's, on attnrt's float32 kernels) or as declared (`off`: tract's
    /// generic half-precision code).
    #[arg(long, value_enum, default_value_t = OnOff::On, value_name = "on|off")]
    pub half_as_float: OnOff,
}

/// A switch's value on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnOff {
    /// Switched on.
    On,
    /// Switched off.
    Off,
}

impl HalfArgs {
    /// The session switch it sets (`SessionOptions::half_as_float`).
    pub fn on(&self) -> bool {
        self.half_as_float == OnOff::On
    }

    /// What a report says about `model`'s half precision (`None`: it has none).
    pub fn report_line(&self, model: &attnrt::ModelProto) -> Option<String> {
        let report = attnrt::half_as_float_report(model)?;
        Some(if self.on() {
            report.to_string()
        } else {
            "run in half precision as declared (--half-as-float off)".to_string()
        })
    }

    /// The same for `--json`: the rewrite's counts, or `null` when it is off or not needed.
    pub fn report_json(&self, model: &attnrt::ModelProto) -> serde_json::Value {
        match attnrt::half_as_float_report(model) {
            Some(r) if self.on() => serde_json::json!(r),
            _ => serde_json::Value::Null,
        }
    }
}

/// `--threads`: `None` = all cores.
pub fn threads(n: Option<usize>) -> Result<Threads> {
    Threads::new(n)
}

/// A one-line description of the dims bindings (`batch=1 (default), sequence=16 (--dim)`).
pub fn dims_line(p: &PreparedInputs) -> String {
    if p.dims.is_empty() {
        return "none".to_string();
    }
    p.dims
        .iter()
        .map(|(k, b)| format!("{k}={} ({})", b.value, b.from))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `{"attention": n, "projection": n, "tract": n}`: what a planned graph runs, for `--json`.
pub fn ops_json(c: &OpCounts) -> serde_json::Value {
    serde_json::json!({"attention": c.attention, "projection": c.projection, "tract": c.tract})
}

/// `"debug"` or `"release"`: how this binary was built (`"build"` in `--json` reports).
pub fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The line a text report prints under its timings when they come from a debug build.
pub fn debug_build_note() -> Option<&'static str> {
    cfg!(debug_assertions)
        .then_some("note: debug build; timings are not meaningful (build with --release)")
}
