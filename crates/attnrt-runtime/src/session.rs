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
use crate::projection::Backend;

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

/// The ONNX front-end of tract with attnrt's `Attention` parser in place of tract's, and
/// constant-weight `MatMul`s on attnrt's projection op ([`Backend::Attnrt`]).
pub fn onnx_frontend() -> tract_onnx::Onnx {
    onnx_frontend_with(Backend::default())
}

/// [`onnx_frontend`] with the projections on `backend`.
pub fn onnx_frontend_with(backend: Backend) -> tract_onnx::Onnx {
    let mut onnx = tract_onnx::onnx();
    crate::attention::register(&mut onnx.op_register);
    crate::projection::register(&mut onnx.op_register, backend);
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
    /// Builds a session for `model`: every graph input gets the type and shape of the tensor of
    /// the same name in `inputs` (which binds all symbolic dims), then tract optimizes the graph.
    /// `what` names the model in errors (e.g. "fused model.onnx").
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
        attnrt_onnx::validate_model(model).with_context(|| format!("{what}: invalid model"))?;
        let bytes = model.encode_to_vec();
        let mut proto = tract_onnx::pb::ModelProto::decode(bytes.as_slice())
            .with_context(|| format!("{what}: re-reading the model for tract"))?;
        drop(bytes);
        forget_declared_shapes(&mut proto);
        if let Some(g) = proto.graph.as_mut() {
            scalar_pad_values(g);
        }
        let frontend = onnx_frontend_with(backend);
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

    /// Op names of the optimized graph's nodes, in plan order (e.g. `AttnrtAttention`,
    /// `AttnrtProjection`): what actually runs.
    pub fn op_names(&self) -> Vec<String> {
        self.plan
            .model()
            .nodes()
            .iter()
            .map(|n| n.op().name().to_string())
            .collect()
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
    ///
    /// tract takes its inputs by value, so this copies every input tensor once (tract's tensors
    /// have no shared storage); [`Session::run_owned`] hands them over without a copy.
    pub fn run(&self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>> {
        let mut values = TVec::new();
        for (name, (dt, shape)) in self.input_names.iter().zip(&self.input_shapes) {
            let t = self.find_input(inputs, name)?;
            self.check_input(t, *dt, shape)?;
            values.push(t.tensor.clone().into_tvalue());
        }
        self.run_values(values)
    }

    /// Runs the model once, consuming `inputs` (same rules as [`Session::run`]): the tensors
    /// move into tract without a copy, so the run's extra memory is the graph's intermediates
    /// and outputs only. Inputs the graph does not use are dropped.
    pub fn run_owned(&self, mut inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>> {
        let mut values = TVec::new();
        for (name, (dt, shape)) in self.input_names.iter().zip(&self.input_shapes) {
            let at = inputs
                .iter()
                .position(|t| &t.name == name)
                .with_context(|| format!("{}: no value given for input '{name}'", self.what))?;
            self.check_input(&inputs[at], *dt, shape)?;
            values.push(inputs.swap_remove(at).tensor.into_tvalue());
        }
        drop(inputs);
        self.run_values(values)
    }

    fn find_input<'a>(&self, inputs: &'a [NamedTensor], name: &str) -> Result<&'a NamedTensor> {
        inputs
            .iter()
            .find(|t| t.name == name)
            .with_context(|| format!("{}: no value given for input '{name}'", self.what))
    }

    /// Refuses an input whose type or shape differs from what the session was built for.
    fn check_input(&self, t: &NamedTensor, dt: DatumType, shape: &[usize]) -> Result<()> {
        if t.tensor.datum_type() != dt || t.tensor.shape() != shape {
            bail!(
                "{}: input '{}' is {:?} {:?}, the session was built for {dt:?} {shape:?}",
                self.what,
                t.name,
                t.tensor.datum_type(),
                t.tensor.shape()
            );
        }
        Ok(())
    }

    fn run_values(&self, values: TVec<TValue>) -> Result<Vec<NamedTensor>> {
        let outputs = self.threads.install(|| {
            guarded(&self.what, || {
                self.plan
                    .run(values)
                    .with_context(|| format!("{}: run failed", self.what))
            })
        })?;
        // An output is uniquely owned once the run state is gone, so `into_tensor` moves it.
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Attention operations on attnrt's kernel.
    pub attention: usize,
    /// Constant-weight projections on attnrt's `gemm`-backed op.
    pub projection: usize,
    /// Every other operation (tract's).
    pub tract: usize,
}

impl std::fmt::Display for OpCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let isa = crate::kernel_isa().unwrap_or_else(|| "no usable path".into());
        write!(
            f,
            "{} attention on attnrt's kernel ({isa}), {} projection(s) on gemm, {} other op(s) on tract",
            self.attention, self.projection, self.tract
        )
    }
}
