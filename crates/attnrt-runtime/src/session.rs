//! A tract-onnx session over an in-memory ONNX model, with attnrt's `Attention` op registered
//! and one thread pool shared by tract's matmuls and attnrt's kernel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use attnrt_onnx::{MemoryBudget, ModelProto};
use prost::Message;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::infer::{Factoid, InferenceFact};

use crate::plan::{self, DimKey, Plan, PlanCache, PlanKey, PlanStats};
use crate::profile::{OpKinds, Profile};
use crate::projection::Backend;
use crate::tensor::NamedTensor;
use crate::threads::Threads;

/// The ONNX front-end of tract with attnrt's `Attention` parser in place of tract's, and
/// constant-weight `MatMul`s on attnrt's projection op, `LayerNormalization` and
/// `Gelu` on its own ops ([`Backend::Attnrt`]).
pub fn onnx_frontend() -> tract_onnx::Onnx {
    onnx_frontend_with(Backend::default())
}

/// [`onnx_frontend`] with the projections on `backend`.
pub fn onnx_frontend_with(backend: Backend) -> tract_onnx::Onnx {
    let mut onnx = tract_onnx::onnx();
    crate::attention::register(&mut onnx.op_register);
    crate::projection::register(&mut onnx.op_register, backend);
    crate::layer_norm::register(&mut onnx.op_register, backend);
    crate::gelu::register(&mut onnx.op_register, backend);
    crate::gather::register(&mut onnx.op_register);
    onnx
}

/// Number of [`guarded`] regions running (on any thread).
static GUARDED: AtomicUsize = AtomicUsize::new(0);

/// Whether a panic now would be caught by a guarded tract call and turned into an error. A
/// process-wide panic hook that exits should let such panics unwind instead.
pub fn panic_is_guarded() -> bool {
    GUARDED.load(Ordering::SeqCst) > 0
}

/// Runs `f`, turning a panic inside tract into an error: a model file is untrusted input and
/// tract asserts on some malformed graphs.
fn guarded<R>(what: &str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            GUARDED.fetch_sub(1, Ordering::SeqCst);
        }
    }
    GUARDED.fetch_add(1, Ordering::SeqCst);
    let _depth = Depth;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => bail!(
            "{what}: tract failed internally ({})",
            crate::plan::panic_message(&*p)
        ),
    }
}

/// How a session plans for the input shapes it is given.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ShapePolicy {
    /// Every dimension the model leaves open (a `dim_param` such as `batch` or `past_sequence`,
    /// or no size at all) stays symbolic: one plan serves every size, checked node by node;
    /// when tract cannot plan it symbolically, or a check fails, that shape gets its own plan.
    #[default]
    Dynamic,
    /// Only the dimensions declared with these `dim_param` names stay symbolic; every other
    /// dimension is bound per plan. The first name is the anchor: a dimension declared with
    /// one of the other names is planned as the anchor plus the offset seen in the inputs
    /// (e.g. `["past_sequence", "total_sequence"]` for a decoder: batch and new tokens bound,
    /// `total_sequence` = `past_sequence` + new tokens; one plan for the prompt and one for
    /// every decode step).
    DynamicDims(Vec<String>),
    /// One plan per distinct set of input shapes.
    PerShape,
}

/// Options of [`Session::new`].
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Where constant-weight `MatMul`s run.
    pub backend: Backend,
    /// How shapes map to plans.
    pub shapes: ShapePolicy,
    /// How many plans the session keeps (least recently used dropped first).
    pub max_plans: usize,
    /// Run `Pow` by a constant 2, 3 or 4 (float32/float64 base) as multiplications, within
    /// two roundings of tract's `powf` (see `lower/pow.rs`); off runs tract's `powf`.
    pub pow_as_mul: bool,
    /// The most memory a run may need (its inputs and the intermediates alive at once, from
    /// the plan's facts); a run over it is refused before it starts ([`crate::memory`]).
    pub max_memory: MemoryBudget,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            backend: Backend::default(),
            shapes: ShapePolicy::default(),
            max_plans: 8,
            pow_as_mul: true,
            max_memory: MemoryBudget::machine_default(),
        }
    }
}

/// What the model declares for one input.
#[derive(Clone, Debug)]
struct InputSpec {
    name: String,
    fact: InferenceFact,
}

/// A model ready to run on any input shapes it accepts: parsed by tract once, then planned
/// (typed, optimized) per family of shapes, plans kept in a bounded cache ([`ShapePolicy`]).
/// A session can be shared between threads; each run has its own state.
pub struct Session {
    parsed: InferenceModel,
    inputs: Vec<InputSpec>,
    input_names: Vec<String>,
    output_names: Vec<String>,
    options: SessionOptions,
    plans: Mutex<PlanCache>,
    threads: Threads,
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

/// Drops the shapes the file declares for outputs and intermediate values (`value_info`),
/// keeping element types. The inputs' real shapes are set from the given tensors, and tract
/// infers every other shape from them; declared symbolic dims (`batch`, `sequence`) would
/// otherwise have to unify with the concrete ones, which tract refuses ("Impossible to unify
/// Sym(batch) with Val(2)"), and exporters sometimes declare wrong output shapes (ViT).
fn forget_declared_shapes(proto: &mut tract_onnx::pb::ModelProto) {
    fn strip(g: &mut tract_onnx::pb::GraphProto) {
        g.value_info.clear();
        for o in &mut g.output {
            if let Some(tract_onnx::pb::type_proto::Value::TensorType(t)) =
                o.r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                t.shape = None;
            }
        }
        for n in &mut g.node {
            for a in &mut n.attribute {
                for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                    strip(sub);
                }
            }
        }
    }
    if let Some(g) = proto.graph.as_mut() {
        strip(g);
    }
}

/// Makes every `Pad` node's `constant_value` (input 2, opset ≥ 11) a scalar with a
/// `Reshape(value, [])` in front of it.
///
/// tract types that input as rank 0 only ("Impossible to unify 1 with 0"), as the ONNX text
/// says, but ONNX's own function bodies (the Attention-24 expansion's `Pad` of the mask) pass a
/// 1-element 1-D tensor, which ONNX Runtime accepts. The reshape keeps the value, and fails
/// with an error if the input has more than one element. Only tract's copy of the graph is
/// changed.
fn scalar_pad_values(g: &mut tract_onnx::pb::GraphProto) {
    use tract_onnx::pb::{attribute_proto::AttributeType, tensor_proto::DataType};
    use tract_onnx::pb::{AttributeProto, NodeProto, TensorProto};
    let nodes = std::mem::take(&mut g.node);
    g.node.reserve(nodes.len());
    for (ix, mut n) in nodes.into_iter().enumerate() {
        for a in &mut n.attribute {
            for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                scalar_pad_values(sub);
            }
        }
        let is_onnx = n.domain.is_empty() || n.domain == "ai.onnx";
        if n.op_type == "Pad" && is_onnx && n.input.get(2).is_some_and(|v| !v.is_empty()) {
            // The node index keeps the names unique even for unnamed nodes.
            let base = format!("attnrt_pad{ix}_{}", n.name);
            let shape = format!("{base}_scalar_shape");
            let value = format!("{base}_scalar_value");
            g.node.push(NodeProto {
                name: shape.clone(),
                op_type: "Constant".into(),
                output: vec![shape.clone()],
                attribute: vec![AttributeProto {
                    name: "value".into(),
                    r#type: AttributeType::Tensor as i32,
                    t: Some(TensorProto {
                        dims: vec![0],
                        data_type: DataType::Int64 as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            });
            g.node.push(NodeProto {
                name: value.clone(),
                op_type: "Reshape".into(),
                input: vec![std::mem::take(&mut n.input[2]), shape],
                output: vec![value.clone()],
                ..Default::default()
            });
            n.input[2] = value;
        }
        g.node.push(n);
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
        let proto = tract_proto(model, options)
            .with_context(|| format!("{what}: re-reading the model for tract"))?;
        let frontend = onnx_frontend_with(options.backend);
        threads.install(|| {
            guarded(what, || {
                let parsed = frontend
                    .parse(&proto, None)
                    .with_context(|| format!("{what}: tract cannot load the graph"))?;
                if !parsed.unresolved_inputs.is_empty() {
                    bail!(
                        "{what}: tensors used but never produced: {}",
                        parsed.unresolved_inputs.join(", ")
                    );
                }
                let im = parsed.model;
                let mut inputs = Vec::new();
                for (ix, o) in im.input_outlets()?.iter().enumerate() {
                    inputs.push(InputSpec {
                        name: im.node(o.node).name.clone(),
                        fact: im.input_fact(ix)?.clone(),
                    });
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
                Ok(Session {
                    parsed: im,
                    input_names: inputs.iter().map(|i: &InputSpec| i.name.clone()).collect(),
                    inputs,
                    output_names,
                    options: options.clone(),
                    plans: Mutex::new(PlanCache::new(options.max_plans)),
                    threads: threads.clone(),
                    what: what.to_string(),
                    kinds: model
                        .graph
                        .as_ref()
                        .map(OpKinds::of_graph)
                        .unwrap_or_default(),
                })
            })
        })
    }

    /// A session planned for the shapes of `inputs` (one plan per shape; the plan for these
    /// inputs is built now, so a first [`Session::run`] costs the run only).
    pub fn build(
        model: &ModelProto,
        inputs: &[NamedTensor],
        threads: &Threads,
        what: &str,
    ) -> Result<Session> {
        Session::build_with(model, inputs, threads, what, Backend::default())
    }

    /// [`Session::build`] with constant-weight `MatMul`s on `backend` ([`Backend::Tract`] runs
    /// the graph as plain tract-onnx would, apart from `Attention`).
    pub fn build_with(
        model: &ModelProto,
        inputs: &[NamedTensor],
        threads: &Threads,
        what: &str,
        backend: Backend,
    ) -> Result<Session> {
        let options = SessionOptions {
            backend,
            shapes: ShapePolicy::PerShape,
            ..SessionOptions::default()
        };
        Session::build_with_options(model, inputs, threads, what, &options)
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
        let refs: Vec<&NamedTensor> = session
            .inputs
            .iter()
            .map(|spec| session.find_input(inputs, &spec.name))
            .collect::<Result<_>>()?;
        session.plan_for(&refs)?;
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
    /// projection op and on tract (graph inputs and constants not counted).
    pub fn op_counts(&self) -> OpCounts {
        let mut c = OpCounts::default();
        for name in self.op_names() {
            match name.as_str() {
                crate::attention::OP_NAME => c.attention += 1,
                crate::projection::OP_NAME => c.projection += 1,
                "Source" | "Const" => {}
                _ => c.tract += 1,
            }
        }
        c
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
        Ok(self.run_maybe_profiled(inputs, false)?.0)
    }

    /// Runs the model once, as [`Session::run`], timing every node of the plan: the outputs
    /// and where the time went ([`Profile`]; merge several runs' profiles for a mean).
    pub fn run_profiled(&self, inputs: &[NamedTensor]) -> Result<(Vec<NamedTensor>, Profile)> {
        let started = std::time::Instant::now();
        let (outputs, profile) = self.run_maybe_profiled(inputs, true)?;
        let mut profile = profile.unwrap_or_default();
        profile.set_wall(started.elapsed());
        Ok((outputs, profile))
    }

    fn run_maybe_profiled(
        &self,
        inputs: &[NamedTensor],
        profile: bool,
    ) -> Result<(Vec<NamedTensor>, Option<Profile>)> {
        let used = self
            .inputs
            .iter()
            .map(|spec| self.find_input(inputs, &spec.name).cloned())
            .collect::<Result<_>>()?;
        self.run_ordered(used, profile)
    }

    /// Runs the model once, consuming `inputs` (same rules as [`Session::run`]): the tensors
    /// move into tract without a copy, so the run's extra memory is the graph's intermediates
    /// and outputs only. Inputs the graph does not use are dropped.
    pub fn run_owned(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>> {
        Ok(self.run_ordered(self.order_inputs(inputs)?, false)?.0)
    }

    /// [`Session::run_owned`], timing every node as [`Session::run_profiled`] does.
    pub fn run_owned_profiled(
        &self,
        inputs: Vec<NamedTensor>,
    ) -> Result<(Vec<NamedTensor>, Profile)> {
        let started = std::time::Instant::now();
        let (outputs, profile) = self.run_ordered(self.order_inputs(inputs)?, true)?;
        let mut profile = profile.unwrap_or_default();
        profile.set_wall(started.elapsed());
        Ok((outputs, profile))
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

    /// Runs on the graph's inputs in order, moving them into tract.
    fn run_ordered(
        &self,
        ordered: Vec<NamedTensor>,
        profile: bool,
    ) -> Result<(Vec<NamedTensor>, Option<Profile>)> {
        let refs: Vec<&NamedTensor> = ordered.iter().collect();
        let plan = self.plan_for(&refs)?;
        let shapes: Vec<(DatumType, Vec<usize>)> = ordered
            .iter()
            .map(|t| (t.tensor.datum_type(), t.tensor.shape().to_vec()))
            .collect();
        let values = ordered
            .into_iter()
            .map(|t| t.tensor.into_tvalue())
            .collect();
        self.run_plan_shapes(plan, values, &shapes, profile)
    }

    fn find_input<'a>(&self, inputs: &'a [NamedTensor], name: &str) -> Result<&'a NamedTensor> {
        inputs
            .iter()
            .find(|t| t.name == name)
            .with_context(|| format!("{}: no value given for input '{name}'", self.what))
    }

    /// The key of the plan that serves these inputs under the session's policy. Refuses an
    /// input whose rank differs from the declared one.
    fn key_for(&self, inputs: &[&NamedTensor]) -> Result<PlanKey> {
        let anchor = match &self.options.shapes {
            ShapePolicy::DynamicDims(names) => names.first().cloned(),
            _ => None,
        };
        let anchor_value = anchor.as_ref().and_then(|a| self.symbol_value(a, inputs));
        let mut key = Vec::with_capacity(inputs.len());
        for (spec, t) in self.inputs.iter().zip(inputs) {
            let shape = t.tensor.shape();
            if let Some(rank) = spec.fact.shape.rank().concretize() {
                if rank as usize != shape.len() {
                    bail!(
                        "{}: input '{}' has rank {}, the model declares rank {rank}",
                        self.what,
                        spec.name,
                        shape.len()
                    );
                }
            }
            let dims = shape
                .iter()
                .enumerate()
                .map(|(axis, &size)| {
                    self.dim_key(&spec.fact, axis, size, anchor.as_deref(), anchor_value)
                })
                .collect();
            key.push((t.tensor.datum_type(), dims));
        }
        let anchor = anchor.filter(|_| anchor_value.is_some());
        Ok(PlanKey {
            inputs: key,
            anchor,
        })
    }

    /// How `axis` of an input is planned: symbolic when the policy keeps its declared name
    /// symbolic and the file does not fix its size (a size the file fixes but the caller
    /// contradicts is bound, as given); tied to the anchor for the other kept names.
    fn dim_key(
        &self,
        fact: &InferenceFact,
        axis: usize,
        size: usize,
        anchor: Option<&str>,
        anchor_value: Option<usize>,
    ) -> DimKey {
        if plan::declared_static(fact, axis).is_some() {
            return DimKey::Bound(size);
        }
        let names = match &self.options.shapes {
            ShapePolicy::PerShape => return DimKey::Bound(size),
            ShapePolicy::Dynamic => return DimKey::Symbolic,
            ShapePolicy::DynamicDims(names) => names,
        };
        let syms = plan::declared_symbols(fact, axis);
        if syms.is_empty() || !syms.iter().all(|s| names.contains(s)) {
            return DimKey::Bound(size);
        }
        match (anchor, anchor_value) {
            (Some(a), _) if syms.len() == 1 && syms[0] == a => DimKey::Symbolic,
            (Some(_), Some(v)) if syms.len() == 1 => DimKey::Tied(size as i64 - v as i64),
            // A kept name with no anchor value to relate it to, or an expression of several
            // names (dynamo's `past_sequence + sequence`): bound.
            _ => DimKey::Bound(size),
        }
    }

    /// The size the inputs give the declared symbol `name` (the first axis declared as it).
    fn symbol_value(&self, name: &str, inputs: &[&NamedTensor]) -> Option<usize> {
        self.inputs.iter().zip(inputs).find_map(|(spec, t)| {
            (0..t.tensor.rank()).find_map(|axis| {
                let syms = plan::declared_symbols(&spec.fact, axis);
                (syms.len() == 1 && syms[0] == name).then(|| t.tensor.shape()[axis])
            })
        })
    }

    /// The plan serving `inputs`: cached, or built now. A symbolic plan that tract cannot make
    /// is recorded as refused and these exact shapes are planned instead.
    fn plan_for(&self, inputs: &[&NamedTensor]) -> Result<(PlanKey, Plan)> {
        let key = self.key_for(inputs)?;
        let shapes: Vec<(DatumType, Vec<usize>)> = inputs
            .iter()
            .map(|t| (t.tensor.datum_type(), t.tensor.shape().to_vec()))
            .collect();
        let key = {
            let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
            if plans.refusal(&key).is_some() {
                PlanKey::concrete(&shapes)
            } else {
                key
            }
        };
        if let Some(plan) = self
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok((key, plan));
        }
        match self.build_plan(&key) {
            Ok(plan) => Ok((key, plan)),
            Err(e) if key.is_symbolic() => {
                self.refuse(&key, format!("{e:#}"));
                let concrete = PlanKey::concrete(&shapes);
                Ok((concrete.clone(), self.build_plan(&concrete)?))
            }
            Err(e) => Err(e),
        }
    }

    fn build_plan(&self, key: &PlanKey) -> Result<Plan> {
        let started = std::time::Instant::now();
        let plan = self.threads.install(|| {
            guarded(&self.what, || {
                Plan::build(&self.parsed, key, &self.threads).with_context(|| {
                    format!("{}: planning for input shapes {}", self.what, key_str(key))
                })
            })
        })?;
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).insert(
            key.clone(),
            plan.clone(),
            started.elapsed().as_secs_f64() * 1e3,
        );
        Ok(plan)
    }

    fn refuse(&self, key: &PlanKey, why: String) {
        self.plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refuse(key, why);
    }

    /// Runs `plan`. A symbolic plan that fails (its shape check, or an op refusing inputs that
    /// tract's symbolic planning got wrong) is refused, and these shapes run on a concrete plan;
    /// if that fails too, its error is the answer. The inputs are kept for the second try only
    /// when the plan is symbolic. With `profile`, the profile of the run that succeeded. A run
    /// over the memory budget is refused before it starts, on either plan.
    fn run_plan_shapes(
        &self,
        (key, plan): (PlanKey, Plan),
        values: TVec<TValue>,
        shapes: &[(DatumType, Vec<usize>)],
        profile: bool,
    ) -> Result<(Vec<NamedTensor>, Option<Profile>)> {
        self.check_memory(&plan, shapes)?;
        let retry = key.is_symbolic().then(|| values.clone());
        match self.execute(&plan, values, profile) {
            Ok(outputs) => Ok(outputs),
            Err(e) if retry.is_some() => {
                self.refuse(&key, format!("{e:#}"));
                let concrete = PlanKey::concrete(shapes);
                let plan = self.build_plan(&concrete)?;
                self.check_memory(&plan, shapes)?;
                self.execute(&plan, retry.unwrap_or_default(), profile)
            }
            Err(e) => Err(e),
        }
    }

    /// Refuses a run of `plan` on inputs of these shapes that would need more memory than the
    /// session's budget ([`SessionOptions::max_memory`]).
    fn check_memory(&self, plan: &Plan, shapes: &[(DatumType, Vec<usize>)]) -> Result<()> {
        let shapes: Vec<&[usize]> = shapes.iter().map(|(_, s)| s.as_slice()).collect();
        plan.check_memory(&shapes, &self.options.max_memory, &self.what)
    }

    fn execute(
        &self,
        plan: &Plan,
        values: TVec<TValue>,
        profile: bool,
    ) -> Result<(Vec<NamedTensor>, Option<Profile>)> {
        let mut times: Vec<(usize, std::time::Duration)> = Vec::new();
        let outputs = self.threads.install(|| {
            guarded(&self.what, || {
                plan.run(values, |node, took| {
                    if profile {
                        times.push((node.id, took));
                    }
                })
                .with_context(|| format!("{}: run failed", self.what))
            })
        })?;
        // An output is uniquely owned once the run state is gone, so `into_tensor` moves it.
        let outputs = self
            .output_names
            .iter()
            .zip(outputs)
            .map(|(name, v)| NamedTensor {
                name: name.clone(),
                tensor: v.into_tensor(),
            })
            .collect();
        Ok((outputs, profile.then(|| self.profile_of(plan, times))))
    }

    /// The profile of one run of `plan` from its node times (graph inputs and constants left
    /// out, as in [`Session::op_counts`]).
    fn profile_of(&self, plan: &Plan, times: Vec<(usize, std::time::Duration)>) -> Profile {
        let model = plan.model();
        let nodes = times.into_iter().filter_map(|(id, took)| {
            let node = model.node(id);
            let tract_op = node.op().name().to_string();
            if matches!(tract_op.as_str(), "Source" | "Const") {
                return None;
            }
            let op = self
                .kinds
                .kind_of(&node.name)
                .map_or_else(|| tract_op.clone(), str::to_string);
            Some((node.name.clone(), op, tract_op, took))
        });
        Profile::of_run(nodes, std::time::Duration::ZERO)
    }
}

fn key_str(key: &PlanKey) -> String {
    key.inputs
        .iter()
        .map(|(dt, dims)| {
            let anchor = key.anchor.as_deref().unwrap_or("?");
            let dims: Vec<String> = dims
                .iter()
                .map(|d| match d {
                    DimKey::Bound(v) => v.to_string(),
                    DimKey::Symbolic => "?".to_string(),
                    DimKey::Tied(c) => format!("{anchor}{c:+}"),
                })
                .collect();
            format!("{dt:?}[{}]", dims.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The model as tract's protobuf types, adjusted where tract reads ONNX differently from the
/// spec or from exporters (see [`forget_declared_shapes`], [`scalar_pad_values`]), and lowered
/// for speed (`crate::lower`).
fn tract_proto(model: &ModelProto, options: &SessionOptions) -> Result<tract_onnx::pb::ModelProto> {
    let opset = attnrt_onnx::opset::default_version(model).unwrap_or(1);
    let identities = crate::lower::plan_identity_removal(model, opset);
    let pows = if options.pow_as_mul {
        crate::lower::plan_pow_rewrite(model)
    } else {
        crate::lower::PowRewrite::default()
    };
    let bytes = model.encode_to_vec();
    let mut proto = tract_onnx::pb::ModelProto::decode(bytes.as_slice())?;
    drop(bytes);
    forget_declared_shapes(&mut proto);
    if let Some(g) = proto.graph.as_mut() {
        crate::lower::remove_identities(g, &identities);
        crate::lower::rewrite_pows(g, &pows);
        scalar_pad_values(g);
    }
    Ok(proto)
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_onnx::proto::TensorProto;
    use attnrt_onnx::DataType;
    use attnrt_testkit::{float_value, model, node, GraphBuilder};

    /// `Pad(x [2, 3], pads [0, 1, 0, 1], constant_value)` at opset 18.
    fn pad_model(constant_dims: Vec<i64>) -> ModelProto {
        let mut g = GraphBuilder::new("g");
        g.node(node("", "Pad", &["x", "pads", "value"], &["y"]));
        // `int64_data`/`float_data` rather than `raw_data`: the typed fields are read too.
        g.initializer(TensorProto {
            name: "pads".into(),
            dims: vec![4],
            data_type: DataType::Int64 as i32,
            int64_data: vec![0, 1, 0, 1],
            ..Default::default()
        });
        g.initializer(TensorProto {
            name: "value".into(),
            dims: constant_dims,
            data_type: DataType::Float as i32,
            float_data: vec![7.0],
            ..Default::default()
        });
        g.input(float_value("x", &[2, 3]));
        g.output(float_value("y", &[2, 5]));
        ModelProto {
            ir_version: 10,
            ..model(g.finish(), 18)
        }
    }

    #[test]
    fn pad_constant_value_may_be_a_one_element_tensor() {
        let x = Tensor::from_shape(&[2, 3], &[1f32, 2., 3., 4., 5., 6.]).unwrap();
        let inputs = vec![NamedTensor {
            name: "x".into(),
            tensor: x,
        }];
        let threads = Threads::new(Some(1)).unwrap();
        // The ONNX text's scalar, and the 1-element 1-D tensor of ONNX's function bodies.
        for dims in [vec![], vec![1]] {
            let s = Session::build(&pad_model(dims.clone()), &inputs, &threads, "pad").unwrap();
            let y = s.run(&inputs).unwrap();
            let y = y[0].tensor.to_plain_array_view::<f32>().unwrap();
            assert_eq!(
                y.iter().copied().collect::<Vec<_>>(),
                [7., 1., 2., 3., 7., 7., 4., 5., 6., 7.],
                "constant_value dims {dims:?}"
            );
        }
    }
}

/// What a planned graph runs, by implementation (see [`Session::op_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpCounts {
    /// Attention operations on attnrt's kernel.
    pub attention: usize,
    /// Constant-weight projections on attnrt's op (its panel kernel or `gemm`).
    pub projection: usize,
    /// Every other operation (tract's).
    pub tract: usize,
}

impl std::fmt::Display for OpCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let isa = crate::kernel_isa().unwrap_or_else(|| "no usable path".into());
        write!(
            f,
            "{} attention on attnrt's kernel ({isa}), {} projection(s) on {}, {} other op(s) on tract",
            self.attention,
            self.projection,
            crate::projection::kernel_in_use(),
            self.tract
        )
    }
}
