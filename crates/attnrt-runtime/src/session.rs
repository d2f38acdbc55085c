//! A tract-onnx session over an in-memory ONNX model, with attnrt's `Attention` op registered
//! and one thread pool shared by tract's matmuls and attnrt's kernel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use attnrt_onnx::ModelProto;
use prost::Message;
use rayon::ThreadPool;
use tract_linalg::multithread::Executor;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::runtime::RunOptions;

use crate::io::NamedTensor;

/// The threads a session runs on: one rayon pool, used by tract's matmuls (through tract-linalg's
/// executor) and by attnrt's attention kernel (through `pool.install`).
#[derive(Clone)]
pub struct Threads {
    pool: Arc<ThreadPool>,
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Threads({})", self.count())
    }
}

impl Threads {
    /// A pool of `threads` threads; `None` means one per available core.
    pub fn new(threads: Option<usize>) -> Result<Threads> {
        let n = match threads {
            Some(0) => bail!("--threads must be at least 1"),
            Some(n) => n,
            None => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        };
        if n > 1024 {
            bail!("{n} threads is more than attnrt allows (1024)");
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("attnrt-{i}"))
            .build()
            .with_context(|| format!("cannot start a pool of {n} threads"))?;
        Ok(Threads {
            pool: Arc::new(pool),
        })
    }

    /// Number of threads in the pool.
    pub fn count(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `f` inside the pool, with tract's executor set to the same pool.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let exec = Executor::MultiThread(self.pool.clone());
        self.pool
            .install(|| tract_linalg::multithread::multithread_tract_scope(exec, f))
    }
}

/// The ONNX front-end of tract with attnrt's `Attention` parser in place of tract's.
pub fn onnx_frontend() -> tract_onnx::Onnx {
    let mut onnx = tract_onnx::onnx();
    crate::attention::register(&mut onnx.op_register);
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
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            bail!("{what}: tract failed internally ({msg})")
        }
    }
}

/// A model ready to run: parsed by tract, input shapes fixed from example inputs, optimized.
pub struct Session {
    plan: Arc<TypedRunnableModel>,
    input_names: Vec<String>,
    output_names: Vec<String>,
    input_shapes: Vec<(DatumType, Vec<usize>)>,
    threads: Threads,
    what: String,
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

impl Session {
    /// Builds a session for `model`: every graph input gets the type and shape of the tensor of
    /// the same name in `inputs` (which binds all symbolic dims), then tract optimizes the graph.
    /// `what` names the model in errors (e.g. "fused model.onnx").
    pub fn build(
        model: &ModelProto,
        inputs: &[NamedTensor],
        threads: &Threads,
        what: &str,
    ) -> Result<Session> {
        attnrt_onnx::validate_model(model).with_context(|| format!("{what}: invalid model"))?;
        let bytes = model.encode_to_vec();
        let mut proto = tract_onnx::pb::ModelProto::decode(bytes.as_slice())
            .with_context(|| format!("{what}: re-reading the model for tract"))?;
        drop(bytes);
        forget_declared_shapes(&mut proto);
        let frontend = onnx_frontend();
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
                let mut im = parsed.model;
                let input_names: Vec<String> = im
                    .input_outlets()?
                    .iter()
                    .map(|o| im.node(o.node).name.clone())
                    .collect();
                let mut input_shapes = Vec::new();
                for (ix, name) in input_names.iter().enumerate() {
                    let t = inputs
                        .iter()
                        .find(|t| &t.name == name)
                        .with_context(|| format!("{what}: no value given for input '{name}'"))?;
                    let dt = t.tensor.datum_type();
                    let shape = t.tensor.shape().to_vec();
                    im.set_input_fact(ix, InferenceFact::dt_shape(dt, shape.clone()))?;
                    input_shapes.push((dt, shape));
                }
                let output_names: Vec<String> = im
                    .output_outlets()?
                    .iter()
                    .map(|o| {
                        im.outlet_label(*o)
                            .map(str::to_string)
                            .unwrap_or_else(|| im.node(o.node).name.clone())
                    })
                    .collect();
                let typed = im.into_typed().with_context(|| {
                    format!("{what}: tract cannot infer the graph's types and shapes")
                })?;
                let optimized = typed
                    .into_optimized()
                    .with_context(|| format!("{what}: tract cannot optimize the graph"))?;
                let options = RunOptions {
                    executor: Some(Executor::MultiThread(threads.pool.clone())),
                    ..Default::default()
                };
                let plan = optimized
                    .into_runnable_with_options(&options)
                    .with_context(|| format!("{what}: tract cannot plan the graph"))?;
                Ok(Session {
                    plan,
                    input_names,
                    output_names,
                    input_shapes,
                    threads: threads.clone(),
                    what: what.to_string(),
                })
            })
        })
    }

    /// Names of the graph inputs, in order.
    pub fn input_names(&self) -> &[String] {
        &self.input_names
    }

    /// Names of the graph outputs, in order.
    pub fn output_names(&self) -> &[String] {
        &self.output_names
    }

    /// Runs the model once. `inputs` must have the names, types and shapes the session was
    /// built with (any order).
    pub fn run(&self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>> {
        let mut values = TVec::new();
        for (name, (dt, shape)) in self.input_names.iter().zip(&self.input_shapes) {
            let t = inputs
                .iter()
                .find(|t| &t.name == name)
                .with_context(|| format!("{}: no value given for input '{name}'", self.what))?;
            if t.tensor.datum_type() != *dt || t.tensor.shape() != shape.as_slice() {
                bail!(
                    "{}: input '{name}' is {:?} {:?}, the session was built for {dt:?} {shape:?}",
                    self.what,
                    t.tensor.datum_type(),
                    t.tensor.shape()
                );
            }
            values.push(t.tensor.clone().into_tvalue());
        }
        let outputs = self.threads.install(|| {
            guarded(&self.what, || {
                self.plan
                    .run(values)
                    .with_context(|| format!("{}: run failed", self.what))
            })
        })?;
        Ok(self
            .output_names
            .iter()
            .zip(outputs)
            .map(|(name, v)| NamedTensor {
                name: name.clone(),
                tensor: v.into_tensor(),
            })
            .collect())
    }
}
