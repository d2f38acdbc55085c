//! ONNX `LayerNormalization` as one op over rows (`attnrt_kernels::norm`) instead of tract's
//! expansion into a dozen element-wise and reduce nodes, each a pass over the tensor on one
//! thread: in BERT-base at seq 512 those nodes took ≈ 5 ms of a 250 ms run, twenty-five
//! normalizations of 512 × 768 values.
//!
//! The `LayerNormalization` parser is replaced by one that keeps tract's (its shape rules, and its
//! expansion as the fallback) and, when the graph is typed, wires [`LayerNormOp`] where that is
//! exact: f32 input, scale and bias, `stash_type` f32, only the `Y` output used, the normalized
//! axes (`axis` to the last) of known extent, and a scale and bias that cover exactly those axes
//! (their shape, leading 1s aside, is the normalized shape, so they broadcast only along rows).
//! Anything else runs as tract's expansion. The result equals tract's up to the order of the
//! sums (same formula: the mean, the mean of the squared deviations, `1/√(var + ε)`).

use attnrt_kernels::norm::{layer_norm, LayerNorm};
use attnrt_kernels::KernelSet;
use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use crate::tensor::{f32_data, f32_data_mut};
use crate::tract_parser::{axis_in_rank, OnnxParser, Wrapper};

/// The name under which [`LayerNormOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtLayerNorm";

/// The name of the parsed node before wiring (`LayerNormRows`); with attnrt's ops off it is all
/// of attnrt's a session has for the op, and it is gone from planned graphs.
pub const CHECKED_NAME: &str = "AttnrtLayerNormalization";

/// attnrt's `LayerNormalization` parser, wrapping tract's (registered by the op registry).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("LayerNormalization", parse);

/// The same parser without [`LayerNormOp`]: the axis check in front of tract's expansion, for
/// sessions that run tract's ops (an axis far outside X's rank must not reach tract's rules).
pub(crate) static CHECKED_PARSER: OnnxParser = OnnxParser::new("LayerNormalization", parse_checked);

fn parse_checked(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parse_with(&CHECKED_PARSER, ctx, node, false)
}

/// tract's parse of the node, wrapped in [`LayerNormRows`], which checks the `axis` against X's
/// rank before tract's shape rules see it (they do not end for an axis far outside it);
/// [`LayerNormOp`] is wired when the node has only its `Y` output and a f32 `stash_type`.
fn parse(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parse_with(&PARSER, ctx, node, true)
}

fn parse_with(
    parser: &'static OnnxParser,
    ctx: &ParsingContext,
    node: &NodeProto,
    native: bool,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parser.wrap_expansion(ctx, node, || {
        let only_y = node.output.iter().skip(1).all(|o| o.is_empty());
        let stash = node
            .get_attr_opt::<DatumType>("stash_type")?
            .unwrap_or(DatumType::F32);
        Ok(LayerNormRows {
            node: node.name.clone(),
            axis: node.get_attr_opt("axis")?.unwrap_or(-1),
            epsilon: node.get_attr_opt("epsilon")?.unwrap_or(1e-5),
            native: native && only_y && stash == DatumType::F32,
        })
    })
}

/// The parsed `LayerNormalization`: tract's shape rules; wiring picks [`LayerNormOp`] when it
/// is exact, tract's expansion otherwise.
#[derive(Debug, Clone)]
struct LayerNormRows {
    node: String,
    axis: i64,
    epsilon: f32,
    /// Whether [`LayerNormOp`] may be wired (else tract's expansion always is).
    native: bool,
}

impl Wrapper for LayerNormRows {
    fn name(&self) -> StaticName {
        CHECKED_NAME.into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
    ) -> InferenceResult {
        if !inputs.is_empty() {
            s.given(&inputs[0].rank, move |_, rank| {
                self.axis_from_0(rank as usize).map(drop)
            })?;
        }
        Ok(())
    }

    fn wire(
        &self,
        tract: &dyn Expansion,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        if let Some(&x) = inputs.first() {
            self.axis_from_0(model.outlet_fact(x)?.rank())?;
        }
        match self.native(model, inputs)? {
            Some(op) => model.wire_node(prefix, op, inputs),
            None => tract.wire(prefix, model, inputs),
        }
    }
}

impl LayerNormRows {
    /// The axis counted from 0 when inside `[-rank, rank)` of X, else the error ONNX's
    /// inference gives.
    fn axis_from_0(&self, rank: usize) -> TractResult<usize> {
        axis_in_rank("LayerNormalization", &self.node, self.axis, rank, "X")
    }

    /// [`LayerNormOp`] for these inputs, or `None` when it would not be exact.
    fn native(&self, model: &TypedModel, inputs: &[OutletId]) -> TractResult<Option<LayerNormOp>> {
        if !self.native || !(2..=3).contains(&inputs.len()) {
            return Ok(None);
        }
        let facts = inputs
            .iter()
            .map(|&i| model.outlet_fact(i))
            .collect::<TractResult<Vec<_>>>()?;
        if facts.iter().any(|f| f.datum_type != DatumType::F32) {
            return Ok(None);
        }
        let x = &facts[0];
        let axis = self.axis_from_0(x.rank())?;
        let Some(normalized) = concrete(&x.shape.dims()[axis..]) else {
            return Ok(None);
        };
        let covers = |f: &TypedFact| {
            concrete(f.shape.dims())
                .is_some_and(|s| without_leading_ones(&s) == without_leading_ones(&normalized))
        };
        if !facts[1..].iter().all(|f| covers(f)) {
            return Ok(None);
        }
        Ok(Some(LayerNormOp {
            node: self.node.clone(),
            epsilon: self.epsilon,
            cols: normalized.iter().product(),
            kernels: crate::kernels::for_op()?,
        }))
    }
}

/// The extents of `dims` when all are known.
fn concrete(dims: &[TDim]) -> Option<Vec<usize>> {
    dims.iter().map(|d| d.to_usize().ok()).collect()
}

fn without_leading_ones(dims: &[usize]) -> &[usize] {
    let first = dims.iter().position(|&d| d != 1).unwrap_or(dims.len());
    &dims[first..]
}

/// `Y = LayerNormalization(X, scale, bias)` over rows of `cols` values: inputs `X` (f32, any
/// shape whose trailing extents multiply to `cols`), `scale` and an optional `bias` (f32, `cols`
/// values each).
#[derive(Debug, Clone)]
pub struct LayerNormOp {
    /// ONNX node name, for errors.
    pub node: String,
    /// Added to the variance.
    pub epsilon: f32,
    /// Values per normalized row.
    pub cols: usize,
    /// The session's kernels.
    pub kernels: KernelSet,
}

impl PartialEq for LayerNormOp {
    fn eq(&self, other: &Self) -> bool {
        self.node == other.node
            && self.epsilon.to_bits() == other.epsilon.to_bits()
            && self.cols == other.cols
            && self.kernels == other.kernels
    }
}

impl Eq for LayerNormOp {}

impl Op for LayerNormOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: rows of {}, epsilon {}",
            self.node, self.cols, self.epsilon
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for LayerNormOp {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let ctx = || format!("LayerNormalization node '{}'", self.node);
        let x = f32_data(&inputs[0]).with_context(|| format!("{}: X", ctx()))?;
        let scale = f32_data(&inputs[1]).with_context(|| format!("{}: scale", ctx()))?;
        let bias = match inputs.get(2) {
            Some(b) => Some(f32_data(b).with_context(|| format!("{}: bias", ctx()))?),
            None => None,
        };
        if scale.len() != self.cols || bias.is_some_and(|b| b.len() != self.cols) {
            bail!(
                "{}: scale or bias does not hold {} values",
                ctx(),
                self.cols
            );
        }
        if self.cols == 0 || x.len() % self.cols != 0 {
            bail!(
                "{}: X of {} values is not rows of {}",
                ctx(),
                x.len(),
                self.cols
            );
        }
        let norm = LayerNorm {
            scale,
            bias,
            epsilon: self.epsilon,
        };
        // Every element is written by `layer_norm`.
        let mut y = unsafe { Tensor::uninitialized::<f32>(inputs[0].shape())? };
        let kernels = &self.kernels;
        layer_norm(
            kernels.norm(),
            kernels.threads(),
            &norm,
            x,
            f32_data_mut(&mut y)?,
        );
        Ok(tvec!(y.into_tvalue()))
    }
}

impl TypedOp for LayerNormOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        if inputs[0].datum_type != DatumType::F32 {
            bail!(
                "LayerNormalization node '{}': X is {:?}",
                self.node,
                inputs[0].datum_type
            );
        }
        Ok(tvec!(f32::fact(inputs[0].shape.clone())))
    }
}
