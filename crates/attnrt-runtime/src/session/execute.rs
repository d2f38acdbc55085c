//! Plans made, run and profiled: the cache, the fallback from a symbolic plan to a concrete one,
//! the memory check before a run.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tract_onnx::prelude::*;

use super::keys::key_str;
use super::Session;
use crate::guard::guarded;
use crate::kv_store::KvStore;
use crate::options::ShapePolicy;
use crate::plan::{NodeObserver, Plan, PlanKey};
use crate::profile::Profile;
use crate::registry::is_operation;
use crate::tensor::NamedTensor;

/// What a run gives back: its outputs, the time spent inside its nodes (the rest of its wall
/// time is the run's own cost: the plan's lookup, the memory and shape checks, tract's moves
/// between nodes), and with a profile asked for, the plan that ran and its node times, made
/// into a [`Profile`] by [`Session::profile_of`] once the run's wall time is taken (the
/// profile's own making, names looked up and copied per node, is not the run's cost).
pub(super) struct Ran {
    pub(super) outputs: Vec<NamedTensor>,
    /// With [`Timing::Nodes`] or [`Timing::Profile`].
    pub(super) nodes: Option<Duration>,
    pub(super) times: Option<(Plan, Vec<(usize, Duration)>)>,
}

/// What a run measures of its nodes: timing them reads the clock twice per node (a twentieth
/// of a step's time outside its nodes on the 125M decoder), so only when asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timing {
    /// Nothing.
    Off,
    /// The time spent inside the nodes, summed ([`Ran::nodes`]).
    Nodes,
    /// Every node's time too ([`Ran::times`], for a [`Profile`]).
    Profile,
}

impl Session {
    /// The plan serving `inputs` under `policy`: cached, or built now. A symbolic plan that
    /// tract cannot make is recorded as refused and these exact shapes are planned instead.
    pub(super) fn plan_for(
        &self,
        inputs: &[&NamedTensor],
        policy: &ShapePolicy,
    ) -> Result<(PlanKey, Plan)> {
        let key = self.key_for(inputs, policy)?;
        let shapes: Vec<(DatumType, Vec<usize>)> = inputs
            .iter()
            .map(|t| (t.tensor.datum_type(), t.tensor.shape().to_vec()))
            .collect();
        let key = {
            let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
            if plans.refusal(&key).is_some() {
                PlanKey::concrete(&shapes).with_branch(key.branch)
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
                let concrete = PlanKey::concrete(&shapes).with_branch(key.branch);
                Ok((concrete.clone(), self.build_plan(&concrete)?))
            }
            Err(e) => Err(e),
        }
    }

    /// Makes the plan `policy` keys `inputs` by, unless cached: its failure is returned, with no
    /// concrete plan in its place and nothing recorded.
    pub(super) fn plan_exactly(&self, inputs: &[&NamedTensor], policy: &ShapePolicy) -> Result<()> {
        let key = self.key_for(inputs, policy)?;
        let cached = self
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key);
        match cached {
            Some(_) => Ok(()),
            None => self.build_plan(&key).map(drop),
        }
    }

    fn build_plan(&self, key: &PlanKey) -> Result<Plan> {
        let started = std::time::Instant::now();
        let plan = self.threads.install(|| {
            guarded(&self.what, || {
                crate::kernels::planning(&self.kernels, || {
                    Plan::build(self.graph_for(key), key, &self.threads, &self.options)
                })
                .with_context(|| {
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
    pub(super) fn run_plan_shapes(
        &self,
        (key, plan): (PlanKey, Plan),
        values: TVec<TValue>,
        shapes: &[(DatumType, Vec<usize>)],
        timing: Timing,
        store: Option<&Arc<KvStore>>,
    ) -> Result<Ran> {
        self.check_memory(&plan, shapes)?;
        let retry = key.is_symbolic().then(|| values.clone());
        let lengths = store.map(|s| s.lengths());
        match self.execute(&plan, values, timing, store) {
            Ok(outputs) => Ok(outputs),
            Err(e) if retry.is_some() => {
                self.refuse(&key, format!("{e:#}"));
                // the nodes that ran before the failure appended their rows: undone
                if let (Some(store), Some(lengths)) = (store, &lengths) {
                    store.rewind(lengths);
                }
                let concrete = PlanKey::concrete(shapes).with_branch(key.branch);
                let plan = self.build_plan(&concrete)?;
                self.check_memory(&plan, shapes)?;
                self.execute(&plan, retry.unwrap_or_default(), timing, store)
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
        timing: Timing,
        store: Option<&Arc<KvStore>>,
    ) -> Result<Ran> {
        let mut times: Vec<(usize, Duration)> = Vec::new();
        let mut nodes = Duration::ZERO;
        let profile = timing == Timing::Profile;
        let mut observe = |node: &TypedNode, took: Duration| {
            nodes += took;
            if profile {
                times.push((node.id, took));
            }
        };
        let observe: Option<NodeObserver> = (timing != Timing::Off).then_some(&mut observe);
        // The caller's quantization pins go along to the thread that evaluates the plan.
        let pins = crate::quant_pins::current();
        let outputs = self.threads.install(|| {
            crate::quant_pins::scoped(pins, || {
                guarded(&self.what, || {
                    plan.run(values, store, observe)
                        .with_context(|| format!("{}: run failed", self.what))
                })
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
        Ok(Ran {
            outputs,
            nodes: (timing != Timing::Off).then_some(nodes),
            times: profile.then(|| (plan.clone(), times)),
        })
    }

    /// The profile of one run of wall time `wall` from the plan that ran and its node times
    /// ([`Ran::times`]; graph inputs and constants left out, as in [`Session::op_counts`]);
    /// without them, a profile of the wall time alone.
    pub(super) fn profile_of(
        &self,
        times: Option<(Plan, Vec<(usize, Duration)>)>,
        wall: Duration,
    ) -> Profile {
        let Some((plan, times)) = times else {
            let mut profile = Profile::default();
            profile.set_wall(wall);
            return profile;
        };
        let model = plan.model();
        let nodes = times.into_iter().filter_map(|(id, took)| {
            let node = model.node(id);
            let tract_op = node.op().name().to_string();
            if !is_operation(&tract_op) {
                return None;
            }
            let op = self
                .kinds
                .kind_of(&node.name)
                .map_or_else(|| tract_op.clone(), str::to_string);
            Some((node.name.clone(), op, tract_op, took))
        });
        Profile::of_run(nodes, wall)
    }
}
