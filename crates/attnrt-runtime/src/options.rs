//! How a session is built and run: [`SessionOptions`], one struct with a named switch for each
//! choice the runtime makes, and `Switch`, the name by which the op registry (`registry.rs`)
//! and the graph rewrites (`lower/mod.rs`) say which of those switches turns them on.

use attnrt_onnx::MemoryBudget;

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
    /// As [`ShapePolicy::DynamicDims`] over `tied` (the anchor, then the names planned as the
    /// anchor plus an offset), and the dimensions declared with one of the `free` names
    /// symbolic too, each its own symbol: e.g. a decoder's prompt, `tied` its length and the
    /// mask's, `free` its batch (one plan for every prompt length and batch size).
    DynamicDimsFree {
        /// The anchor, then the names tied to it.
        tied: Vec<String>,
        /// Names kept symbolic on their own.
        free: Vec<String>,
    },
    /// One plan per distinct set of input shapes.
    PerShape,
}

/// Options of [`crate::Session::new`].
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// attnrt's execution ops in place of tract's for constant-weight `MatMul`/`Gemm` (the
    /// projections), `LayerNormalization` and `Gelu`. Off, those run
    /// as plain tract-onnx runs them: the peer baseline of the benches, `--matmul tract`.
    /// `Attention` runs on attnrt's kernel either way. The ops this switches are the op
    /// registry's entries under `Switch::AttnrtOps` (`registry.rs`).
    pub attnrt_ops: bool,
    /// Run `Pow` by a constant 2, 3 or 4 (float32/float64 base) as multiplications, within
    /// two roundings of tract's `powf` (the rewrite `pow-as-mul`, `lower/pow.rs`); off runs
    /// tract's `powf`.
    pub pow_as_mul: bool,
    /// Run a float16/bfloat16 graph's arithmetic in float32 (the rewrite `half-as-float`,
    /// `lower/half.rs`): half-precision weights widened once at build, the graph's inputs and
    /// outputs keeping their declared types, results more precise than the graph's and within
    /// float16 rounding of it; so attnrt's float32 projections, norms and attention apply.
    /// Off runs the half-precision arithmetic as declared (on tract's generic code).
    pub half_as_float: bool,
    /// How shapes map to plans.
    pub shapes: ShapePolicy,
    /// How many plans the session keeps (least recently used dropped first).
    pub max_plans: usize,
    /// The most memory a run may need (its inputs and the intermediates alive at once, from
    /// the plan's facts); a run over it is refused before it starts ([`crate::memory`]).
    pub max_memory: MemoryBudget,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            attnrt_ops: true,
            pow_as_mul: true,
            half_as_float: true,
            shapes: ShapePolicy::default(),
            max_plans: 8,
            max_memory: MemoryBudget::machine_default(),
        }
    }
}

impl SessionOptions {
    /// The default options with one plan per set of input shapes ([`ShapePolicy::PerShape`]):
    /// what [`crate::Session::build`] and [`crate::run_once`] use.
    pub fn per_shape() -> SessionOptions {
        SessionOptions {
            shapes: ShapePolicy::PerShape,
            ..SessionOptions::default()
        }
    }
}

/// The switch of [`SessionOptions`] that turns a registered op or a graph rewrite on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Switch {
    /// On in every session.
    Always,
    /// [`SessionOptions::attnrt_ops`].
    AttnrtOps,
    /// Not [`SessionOptions::attnrt_ops`]: what stands in for an `AttnrtOps` entry then.
    TractOps,
    /// [`SessionOptions::pow_as_mul`].
    PowAsMul,
    /// [`SessionOptions::half_as_float`].
    HalfAsFloat,
}

impl Switch {
    /// Whether `options` turn this switch on.
    pub(crate) fn is_on(self, options: &SessionOptions) -> bool {
        match self {
            Switch::Always => true,
            Switch::AttnrtOps => options.attnrt_ops,
            Switch::TractOps => !options.attnrt_ops,
            Switch::PowAsMul => options.pow_as_mul,
            Switch::HalfAsFloat => options.half_as_float,
        }
    }
}
