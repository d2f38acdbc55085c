//! A tract-onnx session over an in-memory ONNX model: the graph rewritten by the passes of
//! `lower/`, parsed by tract with attnrt's ops registered (`registry.rs`), planned per family of
//! input shapes, run on one thread pool shared by tract's matmuls and attnrt's kernels.
//!
//! This module builds sessions and is their public face; `keys` maps inputs to the plan that
//! serves them, `execute` makes, runs and profiles plans.

mod execute;
mod keys;

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use attnrt_kernels::KernelSet;
use attnrt_onnx::ModelProto;
use tract_onnx::prelude::*;

use crate::guard::guarded;
use crate::kv_store::KvStore;
use crate::options::{SessionOptions, ShapePolicy};
use crate::plan::{PlanCache, PlanKey, PlanStats};
use crate::profile::{OpKinds, Profile};
use crate::registry::{onnx_frontend_with, OpCounts};
use crate::tensor::NamedTensor;
use crate::threads::Threads;
use execute::Timing;

/// What the model declares for one input, read once from tract's fact (a run's plan key is made
/// from it on every step).
#[derive(Clone, Debug)]
struct InputSpec {
    name: String,
    /// Its rank, when declared.
    rank: Option<usize>,
    /// Per declared axis: the size the file fixes, and the symbols of its size.
    dims: Vec<keys::DeclaredDim>,
}

/// A model ready to run on any input shapes it accepts: parsed by tract once, then planned
/// (typed, optimized) per family of shapes, plans kept in a bounded cache
/// ([`ShapePolicy`]).
/// A session can be shared between threads; each run has its own state.
pub struct Session {
    /// tract's parse of the graph; of each branch (false, then true) for a model whose graph
    /// chooses one from an input ([`attnrt_onnx::branch`]).
    parsed: Vec<InferenceModel>,
    /// The input that chooses the branch, by index, for such a model.
    branch_input: Option<usize>,
    inputs: Vec<InputSpec>,
    input_names: Vec<String>,
    output_names: Vec<String>,
    options: SessionOptions,
    plans: Mutex<PlanCache>,
    threads: Threads,
    /// The CPU kernels of every op of this session's plans, chosen once.
    kernels: KernelSet,
    what: String,
    /// ONNX op types by node name, for profiles.
    kinds: OpKinds,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("what", &self.what)
            .field("inputs", &self.input_names)
            .field("outputs", &self.output_names)
            .finish()
    }
}

impl Session {
    /// Parses `model` for tract; plans are made when inputs of a new shape first arrive.
    /// `what` names the model in errors (e.g. "fused model.onnx").
    pub fn new(
        model: &ModelProto,
        threads: &Threads,
        what: &str,
        options: &SessionOptions,
    ) -> Result<Session> {
        attnrt_onnx::validate_model(model).with_context(|| format!("{what}: invalid model"))?;
        let kernels =
            KernelSet::resolve().with_context(|| format!("{what}: choosing the CPU kernels"))?;
        let (graphs, branch) = graphs_of(model, what)?;
        let frontend = onnx_frontend_with(options);
        let mut parsed = Vec::with_capacity(graphs.len());
        for graph in &graphs {
            let (proto, held) = crate::lower::tract_proto(graph, options)
                .with_context(|| format!("{what}: re-reading the model for tract"))?;
            parsed.push(threads.install(|| guarded(what, || parse(&frontend, proto, held, what)))?);
        }
        let first = parsed.remove(0);
        let input_names: Vec<String> = first.inputs.iter().map(|i| i.name.clone()).collect();
        let branch_input = branch.and_then(|b| input_names.iter().position(|n| *n == b));
        Ok(Session {
            branch_input,
            input_names,
            parsed: std::iter::once(first.model)
                .chain(parsed.into_iter().map(|p| p.model))
                .collect(),
            inputs: first.inputs,
            output_names: first.output_names,
            options: options.clone(),
            plans: Mutex::new(PlanCache::new(options.max_plans)),
            threads: threads.clone(),
            kernels,
            what: what.to_string(),
            kinds: model
                .graph
                .as_ref()
                .map(OpKinds::of_graph)
                .unwrap_or_default(),
        })
    }

    /// A session planned for the shapes of `inputs` (one plan per shape; the plan for these
    /// inputs is built now, so a first [`Session::run`] costs the run only), with the default
    /// options otherwise ([`SessionOptions::per_shape`]).
    pub fn build(
        model: &ModelProto,
        inputs: &[NamedTensor],
        threads: &Threads,
        what: &str,
    ) -> Result<Session> {
        Session::build_with_options(model, inputs, threads, what, &SessionOptions::per_shape())
    }

    /// A session with these `options`, its plan for the shapes of `inputs` built now.
    pub fn build_with_options(
        model: &ModelProto,
        inputs: &[NamedTensor],
        threads: &Threads,
        what: &str,
        options: &SessionOptions,
    ) -> Result<Session> {
        let session = Session::new(model, threads, what, options)?;
        session.prepare(inputs)?;
        Ok(session)
    }

    /// Op names of the planned graph's nodes, in plan order (e.g. `AttnrtAttention`,
    /// `AttnrtProjection`): what actually runs, for the most recently used plan (empty before
    /// the first plan is made).
    pub fn op_names(&self) -> Vec<String> {
        let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans
            .latest()
            .map(|p| {
                p.model()
                    .nodes()
                    .iter()
                    .map(|n| n.op().name().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many of the planned graph's operations run on attnrt's attention kernel, on attnrt's
    /// projection op and on tract (graph inputs and constants not counted; what each of
    /// attnrt's ops counts as is the op registry's).
    pub fn op_counts(&self) -> OpCounts {
        OpCounts::of_ops(self.op_names().iter().map(String::as_str))
    }

    /// The CPU kernels the session's ops run (resolved once, when it was made).
    pub fn kernels(&self) -> &KernelSet {
        &self.kernels
    }

    /// How the session's plans have been made and used.
    pub fn plan_stats(&self) -> PlanStats {
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).stats()
    }

    /// Names of the graph inputs, in order.
    pub fn input_names(&self) -> &[String] {
        &self.input_names
    }

    /// Names of the graph outputs, in order.
    pub fn output_names(&self) -> &[String] {
        &self.output_names
    }

    /// Runs the model once on `inputs` (any order; extra names are ignored), planning for
    /// their shapes first if no plan serves them yet. A run whose inputs and intermediates would
    /// need more than [`SessionOptions::max_memory`] is refused before it starts.
    ///
    /// tract takes its inputs by value, so this copies every input tensor once (tract's tensors
    /// have no shared storage); [`Session::run_owned`] hands them over without a copy.
    pub fn run(&self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>> {
        Ok(self.run_cloned(inputs, Timing::Off)?.outputs)
    }

    /// Runs the model once, as [`Session::run`], timing every node of the plan: the outputs
    /// and where the time went ([`Profile`]; merge several runs' profiles for a mean).
    pub fn run_profiled(&self, inputs: &[NamedTensor]) -> Result<(Vec<NamedTensor>, Profile)> {
        let started = std::time::Instant::now();
        let ran = self.run_cloned(inputs, Timing::Profile)?;
        let wall = started.elapsed();
        Ok((ran.outputs, self.profile_of(ran.times, wall)))
    }

    /// Runs on copies of the graph's inputs found in `inputs`.
    fn run_cloned(&self, inputs: &[NamedTensor], timing: Timing) -> Result<execute::Ran> {
        let used = self
            .inputs
            .iter()
            .map(|spec| self.find_input(inputs, &spec.name).cloned())
            .collect::<Result<_>>()?;
        self.run_ordered(used, timing, &self.options.shapes, None)
    }

    /// Runs the model once, consuming `inputs` (same rules as [`Session::run`]): the tensors
    /// move into tract without a copy, so the run's extra memory is the graph's intermediates
    /// and outputs only. Inputs the graph does not use are dropped.
    pub fn run_owned(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>> {
        self.run_owned_with(inputs, &self.options.shapes)
    }

    /// [`Session::run_owned`] on the plan `policy` chooses for these inputs, in place of the
    /// session's [`SessionOptions::shapes`]: e.g. a decoder's prompt planned with its length
    /// symbolic, where the session keeps the past length symbolic for the decode steps. The
    /// plans of every policy share the session's cache.
    pub fn run_owned_with(
        &self,
        inputs: Vec<NamedTensor>,
        policy: &ShapePolicy,
    ) -> Result<Vec<NamedTensor>> {
        Ok(self
            .run_ordered(self.order_inputs(inputs)?, Timing::Off, policy, None)?
            .outputs)
    }

    /// [`Session::run_owned_with`] with a generation's in-place cache: the store-mode
    /// `Attention` nodes keep their keys and values in `store` ([`crate::kv_store`]).
    /// `policy`: the session's [`SessionOptions::shapes`] when `None`.
    pub fn run_owned_in(
        &self,
        inputs: Vec<NamedTensor>,
        policy: Option<&ShapePolicy>,
        store: &Arc<KvStore>,
    ) -> Result<Vec<NamedTensor>> {
        let policy = policy.unwrap_or(&self.options.shapes);
        let ordered = self.order_inputs(inputs)?;
        Ok(self
            .run_ordered(ordered, Timing::Off, policy, Some(store))?
            .outputs)
    }

    /// [`Session::run_owned_with`] (the session's [`SessionOptions::shapes`] when `policy` is
    /// `None`), with a generation's in-place cache when `store` is given, as
    /// [`Session::run_owned_in`]; also returns the time spent inside the plan's nodes, summed
    /// (the run's wall time less it is what the run costs besides its nodes: finding the plan,
    /// the memory and shape checks, tract's moves between nodes). Timing the nodes reads the
    /// clock twice per node, which the untimed runs do not.
    pub fn run_owned_timed(
        &self,
        inputs: Vec<NamedTensor>,
        policy: Option<&ShapePolicy>,
        store: Option<&Arc<KvStore>>,
    ) -> Result<(Vec<NamedTensor>, std::time::Duration)> {
        let policy = policy.unwrap_or(&self.options.shapes);
        let ordered = self.order_inputs(inputs)?;
        let ran = self.run_ordered(ordered, Timing::Nodes, policy, store)?;
        Ok((ran.outputs, ran.nodes.unwrap_or_default()))
    }

    /// [`Session::run_owned`], timing every node as [`Session::run_profiled`] does.
    pub fn run_owned_profiled(
        &self,
        inputs: Vec<NamedTensor>,
    ) -> Result<(Vec<NamedTensor>, Profile)> {
        let started = std::time::Instant::now();
        let ordered = self.order_inputs(inputs)?;
        let ran = self.run_ordered(ordered, Timing::Profile, &self.options.shapes, None)?;
        let wall = started.elapsed();
        Ok((ran.outputs, self.profile_of(ran.times, wall)))
    }

    /// `inputs` in the graph's input order, unused ones dropped.
    fn order_inputs(&self, mut inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>> {
        let mut ordered = Vec::with_capacity(self.inputs.len());
        for spec in &self.inputs {
            let at = inputs
                .iter()
                .position(|t| t.name == spec.name)
                .with_context(|| {
                    format!("{}: no value given for input '{}'", self.what, spec.name)
                })?;
            ordered.push(inputs.swap_remove(at));
        }
        Ok(ordered)
    }

    /// Makes the plan that will serve inputs of these shapes and element types (the values of
    /// `inputs` are not read), so that the run that needs it does not wait for it: e.g. the
    /// decode steps' plan, made while a generation's prompt runs. Nothing is made when a plan
    /// serves them already.
    pub fn prepare(&self, inputs: &[NamedTensor]) -> Result<()> {
        self.prepare_with(inputs, &self.options.shapes)
    }

    /// [`Session::prepare`] for the runs of [`Session::run_owned_with`] under `policy`.
    pub fn prepare_with(&self, inputs: &[NamedTensor], policy: &ShapePolicy) -> Result<()> {
        self.plan_for(&self.inputs_of(inputs)?, policy).map(drop)
    }

    /// Makes the plan `policy` keys these inputs by, as [`Session::prepare_with`] does, or
    /// returns why tract cannot make it: no concrete plan is made in its place and nothing is
    /// recorded against the key, so a caller can try another policy.
    pub fn try_prepare_with(&self, inputs: &[NamedTensor], policy: &ShapePolicy) -> Result<()> {
        self.plan_exactly(&self.inputs_of(inputs)?, policy)
    }

    /// Runs on the graph's inputs in order, moving them into tract, on the plan `policy`
    /// chooses.
    fn run_ordered(
        &self,
        ordered: Vec<NamedTensor>,
        timing: Timing,
        policy: &ShapePolicy,
        store: Option<&Arc<KvStore>>,
    ) -> Result<execute::Ran> {
        let refs: Vec<&NamedTensor> = ordered.iter().collect();
        let plan = self.plan_for(&refs, policy)?;
        let shapes: Vec<(DatumType, Vec<usize>)> = ordered
            .iter()
            .map(|t| (t.tensor.datum_type(), t.tensor.shape().to_vec()))
            .collect();
        let values = ordered
            .into_iter()
            .map(|t| t.tensor.into_tvalue())
            .collect();
        self.run_plan_shapes(plan, values, &shapes, timing, store)
    }

    /// The graph's inputs, in order, found by name in `inputs`.
    fn inputs_of<'a>(&self, inputs: &'a [NamedTensor]) -> Result<Vec<&'a NamedTensor>> {
        self.inputs
            .iter()
            .map(|spec| self.find_input(inputs, &spec.name))
            .collect()
    }

    fn find_input<'a>(&self, inputs: &'a [NamedTensor], name: &str) -> Result<&'a NamedTensor> {
        inputs
            .iter()
            .find(|t| t.name == name)
            .with_context(|| format!("{}: no value given for input '{name}'", self.what))
    }
}

/// The graphs a session parses: `model`'s, or for a model whose graph chooses a branch from
/// an input, one per value of that input (false, then true), with the input's name.
fn graphs_of<'m>(
    model: &'m ModelProto,
    what: &str,
) -> Result<(Vec<Cow<'m, ModelProto>>, Option<String>)> {
    let Some(input) = attnrt_onnx::branch::branch_inputs(model).into_iter().next() else {
        return Ok((vec![Cow::Borrowed(model)], None));
    };
    let graphs = [false, true]
        .into_iter()
        .map(|v| {
            attnrt_onnx::branch::choose_branch(model, &input, v)
                .map(Cow::Owned)
                .with_context(|| format!("{what}: the branch '{input}' = {v} chooses"))
        })
        .collect::<Result<_>>()?;
    Ok((graphs, Some(input)))
}

impl Session {
    /// tract's graph that serves `key` (its branch's, for a model with one).
    pub(super) fn graph_for(&self, key: &PlanKey) -> &InferenceModel {
        &self.parsed[key.branch.map_or(0, usize::from)]
    }
}

/// tract's model as parsed, with what its inputs declare and the names of its outputs.
struct Parsed {
    model: InferenceModel,
    inputs: Vec<InputSpec>,
    output_names: Vec<String>,
}

/// Parses `proto` with `frontend`, then gives the `held` weights their homes
/// ([`crate::weights::place`]).
fn parse(
    frontend: &tract_onnx::Onnx,
    proto: tract_onnx::pb::ModelProto,
    held: Vec<crate::weights::HeldWeight>,
    what: &str,
) -> Result<Parsed> {
    let mut parsed = frontend
        .parse(&proto, None)
        .with_context(|| format!("{what}: tract cannot load the graph"))?;
    drop(proto);
    crate::weights::place(&mut parsed.model, held)
        .with_context(|| format!("{what}: placing the weights"))?;
    if !parsed.unresolved_inputs.is_empty() {
        bail!(
            "{what}: tensors used but never produced: {}",
            parsed.unresolved_inputs.join(", ")
        );
    }
    let im = parsed.model;
    let mut inputs = Vec::new();
    for (ix, o) in im.input_outlets()?.iter().enumerate() {
        inputs.push(InputSpec::of(
            im.node(o.node).name.clone(),
            im.input_fact(ix)?,
        ));
    }
    let output_names = im
        .output_outlets()?
        .iter()
        .map(|o| {
            im.outlet_label(*o)
                .map(str::to_string)
                .unwrap_or_else(|| im.node(o.node).name.clone())
        })
        .collect();
    Ok(Parsed {
        model: im,
        inputs,
        output_names,
    })
}
