//! Plans: tract's optimized, runnable form of a model for one family of input shapes.
//!
//! A [`PlanKey`] says, for every dimension of every input, whether the plan binds it to a
//! value or keeps it symbolic. A plan with symbolic dimensions serves every shape those
//! dimensions can take (one plan for every sequence or cache length); tract's symbolic shape
//! reasoning is not always right, so such a plan runs *checked*: every node's outputs are
//! compared with the shapes tract planned for them, and a mismatch is an error the session
//! answers by planning that shape concretely ([`crate::Session`]). A plan with every dimension
//! bound serves exactly one shape and needs no check.

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::{Context, Result};
use attnrt_onnx::MemoryBudget;
use tract_linalg::multithread::Executor;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::plan::{eval as eval_node, EvalContext};
use tract_onnx::tract_core::runtime::RunOptions;
use tract_onnx::tract_hir::infer::{Factoid, InferenceFact};

use crate::kv_store::KvStore;
use crate::memory::{MemoryEstimate, PlanSizes};
use crate::options::SessionOptions;
use crate::shape_check::PlannedShapes;
use crate::threads::Threads;

/// How a plan treats one input dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DimKey {
    /// Bound to this size.
    Bound(usize),
    /// Kept symbolic, as the model declares it (its `dim_param`, or a fresh symbol).
    Symbolic,
    /// Kept symbolic as the session's anchor symbol plus this offset: a decoder's
    /// `total_sequence` is `past_sequence + 1` in every decode step, which tract could not
    /// know from two unrelated names.
    Tied(i64),
}

/// One input's part of a [`PlanKey`]: its element type and how each axis is planned.
pub type InputKey = (DatumType, Vec<DimKey>);

/// Which shapes a plan serves (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    /// Per input, in declaration order.
    pub inputs: Vec<InputKey>,
    /// The symbol [`DimKey::Tied`] dimensions are expressed in.
    pub anchor: Option<String>,
    /// The value of the input that chooses the graph's branch, for a model that has one
    /// (optimum's merged decoders): each value has its own graph, so its own plans.
    pub branch: Option<bool>,
}

impl PlanKey {
    /// Whether the plan keeps any dimension symbolic (and so must run checked).
    pub fn is_symbolic(&self) -> bool {
        self.inputs
            .iter()
            .any(|(_, dims)| dims.iter().any(|d| !matches!(d, DimKey::Bound(_))))
    }

    /// The fully bound key for these exact shapes.
    pub fn concrete(shapes: &[(DatumType, Vec<usize>)]) -> PlanKey {
        PlanKey {
            inputs: shapes
                .iter()
                .map(|(dt, s)| (*dt, s.iter().map(|&v| DimKey::Bound(v)).collect()))
                .collect(),
            anchor: None,
            branch: None,
        }
    }

    /// This key for the graph of branch `branch`.
    pub fn with_branch(mut self, branch: Option<bool>) -> PlanKey {
        self.branch = branch;
        self
    }
}

/// What [`Plan::run`] calls after every node it times: the node and how long it took.
pub type NodeObserver<'a> = &'a mut (dyn FnMut(&TypedNode, std::time::Duration) + Send);

/// A runnable plan and whether it must run checked.
#[derive(Clone)]
pub struct Plan {
    runnable: Arc<TypedRunnableModel>,
    /// The shapes a symbolic plan's runs are checked against (none for a concrete plan).
    checked: Option<Arc<PlannedShapes>>,
    /// The sizes of its values, for the memory check of every run.
    sizes: Arc<PlanSizes>,
}

impl Plan {
    /// Optimizes `parsed` (tract's inference model, as parsed) for the shapes of `key`, puts
    /// the ops `options` switch on in tract's optimized plan (`registry.rs`'s plan ops) and
    /// plans it on `threads`; a value of known shape over `options`' memory budget is refused
    /// before tract optimizes.
    pub fn build(
        parsed: &InferenceModel,
        key: &PlanKey,
        threads: &Threads,
        options: &SessionOptions,
    ) -> Result<Plan> {
        let mut model = parsed.clone();
        let anchor: Option<TDim> = key.anchor.as_ref().map(|a| model.symbols.sym(a).into());
        for (ix, (dt, dims)) in key.inputs.iter().enumerate() {
            let declared = model.input_fact(ix)?.clone();
            let mut shape: TVec<TDim> = tvec![];
            for (axis, d) in dims.iter().enumerate() {
                shape.push(match d {
                    DimKey::Bound(v) => v.to_dim(),
                    DimKey::Symbolic => declared_dim(&declared, axis).unwrap_or_else(|| {
                        model.symbols.sym(&format!("attnrt_in{ix}_{axis}")).into()
                    }),
                    DimKey::Tied(offset) => {
                        anchor
                            .clone()
                            .context("a tied dimension without an anchor symbol")?
                            + TDim::Val(*offset)
                    }
                });
            }
            model.set_input_fact(ix, InferenceFact::dt_shape(*dt, shape))?;
        }
        let typed = model
            .into_typed()
            .context("tract cannot infer the graph's types and shapes")?;
        crate::memory::check_typed_outputs(&typed, &options.max_memory)?;
        let mut optimized =
            optimize(typed, key.is_symbolic()).context("tract cannot optimize the graph")?;
        crate::registry::take_over_plan(&mut optimized, options)
            .context("putting attnrt's ops in tract's optimized plan")?;
        let options = RunOptions {
            executor: Some(Executor::MultiThread(threads.pool().clone())),
            ..Default::default()
        };
        let runnable = optimized
            .into_runnable_with_options(&options)
            .context("tract cannot plan the graph")?;
        let sizes = PlanSizes::new(runnable.model(), runnable.order_without_consts());
        let checked = key.is_symbolic().then(|| {
            let order = runnable.order_without_consts();
            Arc::new(PlannedShapes::of(runnable.model(), order))
        });
        Ok(Plan {
            runnable,
            checked,
            sizes: Arc::new(sizes),
        })
    }

    /// Whether the plan keeps a dimension symbolic (and so its runs are checked).
    pub fn is_symbolic(&self) -> bool {
        self.checked.is_some()
    }

    /// The planned graph.
    pub fn model(&self) -> &TypedModel {
        self.runnable.model()
    }

    /// What a run on inputs of these shapes keeps in memory at its peak ([`crate::memory`]).
    pub fn memory(&self, inputs: &[&[usize]]) -> MemoryEstimate {
        self.sizes.estimate(self.model(), inputs)
    }

    /// Refuses a run on inputs of these shapes that needs more than `budget` (`what` names the
    /// model in the error).
    pub fn check_memory(
        &self,
        inputs: &[&[usize]],
        budget: &MemoryBudget,
        what: &str,
    ) -> Result<()> {
        self.sizes.check(self.model(), inputs, budget, what)
    }

    /// Runs the plan; `observe`, when given, is called after every node with the node and how
    /// long it took (for profiles; without it the nodes are not timed). A symbolic plan checks
    /// every node's outputs against the planned shapes.
    /// `store`: a generation's in-place cache, which the store-mode `Attention` nodes find in
    /// tract's per-run shared map (`crate::kv_store`).
    pub fn run(
        &self,
        values: TVec<TValue>,
        store: Option<&Arc<KvStore>>,
        mut observe: Option<NodeObserver<'_>>,
    ) -> Result<TVec<TValue>> {
        let mut state = self.runnable.spawn()?;
        if let Some(store) = store {
            state.turn_state.shared.insert(Arc::clone(store));
        }
        let checked = self.checked.as_deref();
        let mut run_sizes = checked.map(PlannedShapes::run_sizes);
        let outputs = state.run_plan_with_eval(
            values,
            |ctx: &EvalContext, op_state, node: &TypedNode, inputs| -> TractResult<_> {
                let started = observe.is_some().then(std::time::Instant::now);
                // A panic inside tract (an index out of range on bad input values, say) becomes
                // this node's error, so that the message names the node.
                let outputs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    eval_node(ctx, op_state, node, inputs)
                }))
                .unwrap_or_else(|p| Err(anyhow::anyhow!("tract panicked: {}", panic_message(&*p))))
                .with_context(|| format!("node '{}' ({})", node.name, node.op.name()))?;
                if let (Some(observe), Some(started)) = (observe.as_mut(), started) {
                    observe(node, started.elapsed());
                }
                if let (Some(checked), Some(sizes)) = (checked, run_sizes.as_mut()) {
                    checked.check(sizes, ctx.symbols, node, &outputs)?;
                }
                Ok(outputs)
            },
        )?;
        Ok(outputs)
    }
}

/// tract's optimization of `typed` (declutter, then codegen), as `into_optimized` does it;
/// without tract's `FoldUniformMask` for a `symbolic` plan. That pass splits an op fed a boolean
/// mask into the regions where the mask is known true or false; on a decoder's causal mask with
/// the query length symbolic (a prompt's plan), tract 0.23.9 leaves a constant of two rows in
/// its place (LLaMA's `And_1` gave `[1, 1, 2, 5]` for a 5-token prompt planned
/// `[1, 1, sequence, sequence]`), which the run's shape check refused.
fn optimize(mut typed: TypedModel, symbolic: bool) -> TractResult<TypedModel> {
    let mut declutter = tract_onnx::tract_core::optim::Optimizer::declutter();
    if symbolic {
        declutter
            .passes
            .retain(|p| !format!("{p:?}").starts_with("FoldUniformMask"));
    }
    declutter.session().optimize(&mut typed)?;
    typed.optimize()?;
    Ok(typed)
}

/// The message of a caught panic (`panic!` with a format string or a literal).
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| p.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

/// The declared size of `axis` of an input as tract parsed it (a number, or an expression of
/// the model's `dim_param` symbols), `None` when the file leaves it unknown.
fn declared_dim(fact: &InferenceFact, axis: usize) -> Option<TDim> {
    fact.shape.dim(axis).and_then(|d| d.concretize())
}

/// Whether the input's declared `axis` is a size fixed by the file.
pub fn declared_static(fact: &InferenceFact, axis: usize) -> Option<usize> {
    declared_dim(fact, axis)
        .and_then(|d| d.to_i64().ok())
        .and_then(|v| usize::try_from(v).ok())
}

/// The symbols of the input's declared `axis` (empty when static or unknown).
pub fn declared_symbols(fact: &InferenceFact, axis: usize) -> Vec<String> {
    declared_dim(fact, axis)
        .map(|d| d.symbols().into_iter().map(|s| s.to_string()).collect())
        .unwrap_or_default()
}

/// The plans a session has built, most recently used first, at most `capacity` of them.
pub struct PlanCache {
    capacity: usize,
    plans: VecDeque<(PlanKey, Plan)>,
    /// Keys whose symbolic plan failed (to build or a check), with why: their shapes get
    /// concrete plans.
    refused: Vec<(PlanKey, String)>,
    built: usize,
    build_ms: f64,
}

impl PlanCache {
    /// An empty cache holding up to `capacity` plans (at least one).
    pub fn new(capacity: usize) -> PlanCache {
        PlanCache {
            capacity: capacity.max(1),
            plans: VecDeque::new(),
            refused: Vec::new(),
            built: 0,
            build_ms: 0.0,
        }
    }

    /// The plan for `key`, moved to the front.
    pub fn get(&mut self, key: &PlanKey) -> Option<Plan> {
        let at = self.plans.iter().position(|(k, _)| k == key)?;
        let entry = self.plans.remove(at)?;
        let plan = entry.1.clone();
        self.plans.push_front(entry);
        Some(plan)
    }

    /// The most recently used plan.
    pub fn latest(&self) -> Option<&Plan> {
        self.plans.front().map(|(_, p)| p)
    }

    /// Adds a freshly built plan (that took `ms` to make), dropping the least recently used
    /// beyond capacity.
    pub fn insert(&mut self, key: PlanKey, plan: Plan, ms: f64) {
        self.built += 1;
        self.build_ms += ms;
        self.plans.retain(|(k, _)| k != &key);
        self.plans.push_front((key, plan));
        self.plans.truncate(self.capacity);
    }

    /// Records that the symbolic plan of `key` cannot be used, and drops it.
    pub fn refuse(&mut self, key: &PlanKey, why: String) {
        self.plans.retain(|(k, _)| k != key);
        if !self.refused.iter().any(|(k, _)| k == key) {
            self.refused.push((key.clone(), why));
        }
    }

    /// Why the symbolic plan of `key` was refused, if it was.
    pub fn refusal(&self, key: &PlanKey) -> Option<&str> {
        self.refused
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, why)| why.as_str())
    }

    /// Statistics for reports.
    pub fn stats(&self) -> PlanStats {
        PlanStats {
            built: self.built,
            build_ms: self.build_ms,
            cached: self.plans.len(),
            symbolic_cached: self.plans.iter().filter(|(_, p)| p.is_symbolic()).count(),
            refusals: self.refused.iter().map(|(_, w)| w.clone()).collect(),
        }
    }
}

/// How a session's plans have been used (see [`crate::Session::plan_stats`]).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PlanStats {
    /// Plans built so far (a rebuild after eviction counts again).
    pub built: usize,
    /// Time spent building them (typing, optimizing, planning), in milliseconds.
    pub build_ms: f64,
    /// Plans held now.
    pub cached: usize,
    /// Of those, plans with symbolic dimensions.
    pub symbolic_cached: usize,
    /// Why symbolic plans were given up for concrete ones.
    pub refusals: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::tract_hir::internal::*;

    /// An op whose value is one longer than the shape it declares: a symbolic plan tract got
    /// wrong, as the run sees it.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Longer;

    impl Op for Longer {
        fn name(&self) -> StaticName {
            "Longer".into()
        }

        op_as_typed_op!();
    }

    impl EvalOp for Longer {
        op_out_of_plan!();

        fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
            let n = inputs[0].len();
            Ok(tvec!(Tensor::zero::<f32>(&[n + 1])?.into_tvalue()))
        }
    }

    impl TypedOp for Longer {
        as_op!();

        fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
            Ok(tvec!(f32::fact(inputs[0].shape.clone())))
        }
    }

    /// [`Longer`] as the parsed graph holds it.
    #[derive(Debug, Clone, Hash)]
    struct ParsedLonger;

    impl Expansion for ParsedLonger {
        fn name(&self) -> StaticName {
            "Longer".into()
        }

        fn rules<'r, 'p: 'r, 's: 'r>(
            &'s self,
            s: &mut Solver<'r>,
            inputs: &'p [TensorProxy],
            outputs: &'p [TensorProxy],
        ) -> InferenceResult {
            s.equals(&outputs[0].datum_type, f32::datum_type())?;
            s.equals(&outputs[0].shape, &inputs[0].shape)?;
            Ok(())
        }

        fn wire(
            &self,
            prefix: &str,
            model: &mut TypedModel,
            inputs: &[OutletId],
        ) -> TractResult<TVec<OutletId>> {
            model.wire_node(prefix, Longer, inputs)
        }
    }

    /// `y = Longer(x)` on `x: [n]` f32.
    fn longer() -> InferenceModel {
        let mut model = InferenceModel::default();
        let n = model.symbols.sym("n");
        let fact = InferenceFact::dt_shape(f32::datum_type(), tvec![n.to_dim()]);
        let x = model.add_source("x", fact).unwrap();
        let y = model
            .wire_node("longer", expand(ParsedLonger), &[x])
            .unwrap();
        model.select_output_outlets(&y).unwrap();
        model
    }

    /// A symbolic plan's run refuses a node whose output is not the shape tract planned,
    /// naming the node; a plan of the exact shapes has nothing to check.
    #[test]
    fn a_symbolic_plan_refuses_an_output_of_another_shape() {
        let threads = Threads::new(Some(1)).unwrap();
        let options = SessionOptions::default();
        let x = || tvec![Tensor::zero::<f32>(&[3]).unwrap().into_tvalue()];
        let key = PlanKey {
            inputs: vec![(f32::datum_type(), vec![DimKey::Symbolic])],
            anchor: None,
            branch: None,
        };
        let plan = Plan::build(&longer(), &key, &threads, &options).unwrap();
        let e = plan.run(x(), None, None).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("symbolic plan: node 'longer' output 0 is F32 [4], tract planned"),
            "{msg}"
        );
        let concrete = PlanKey::concrete(&[(f32::datum_type(), vec![3])]);
        let plan = Plan::build(&longer(), &concrete, &threads, &options).unwrap();
        let y = plan.run(x(), None, None).unwrap();
        assert_eq!(y[0].shape(), &[4]);
    }
}
