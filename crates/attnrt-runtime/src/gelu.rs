//! ONNX `Gelu` (what attnrt's activation pass turns every exported GELU into) split over the
//! session's threads: tract runs it as one element-wise op on one thread, ≈ 1.4 ms of BERT-base's
//! 55 ms at seq 128 and 2.8 of GPT-2 small's 57 ms (the tanh form), while the projections around
//! it use both cores.
//!
//! The values are tract's: each chunk runs the formula of tract's f32 `Gelu` on tract-linalg's
//! kernels (exact: `x/2 · (1 + erf(x/√2))` with its `erf`; `tanh`: its `gelu` kernel), so the
//! result is the same whatever the split. Non-f32 inputs run as tract's op. Where
//! `ATTNRT_KERNEL_ISA` lowers the session's ISA below the CPU's best, tract-linalg (which picks
//! the CPU's best itself) would not follow: the chunks run on attnrt's activation kernel of that
//! ISA instead (`KernelSet::standalone_act`).
//!
//! A `Gelu` whose input is a projection's output and nothing else's folds into that projection
//! ([`ProjectionOp::with_activation`]) or quantized projection
//! ([`QuantProjectionOp::with_activation`]): its kernel applies the GELU as it stores each value.

use attnrt_kernels::act::{apply_rows, Activation};
use attnrt_kernels::{KernelSet, StandaloneAct};
use tract_linalg::routines::Func;
use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::nn::gelu_approximate::gelu_approximate;
use tract_onnx::tract_hir::internal::*;

use crate::projection::{sole_reader, ProjectionOp};
use crate::quant_projection::QuantProjectionOp;
use crate::tensor::f32_data_mut;
use crate::tract_parser::OnnxParser;

/// The name under which [`GeluOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtGelu";

/// attnrt's `Gelu` parser, wrapping tract's (registered by the op registry).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("Gelu", parse);

fn parse(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let tanh = match node
        .get_attr_opt::<String>("approximate")?
        .as_deref()
        .unwrap_or("none")
    {
        "none" => false,
        "tanh" => true,
        other => bail!(
            "Gelu node '{}': approximate = {other:?}, must be \"none\" or \"tanh\"",
            node.name
        ),
    };
    let (_, extra, expansion) = PARSER.parse_as_tract(ctx, node)?;
    let gelu = GeluSplit {
        node: node.name.clone(),
        tanh,
        tract_exact: expansion,
    };
    Ok((expand(gelu), extra))
}

/// The parsed `Gelu`: [`GeluOp`] for f32 inputs, tract's op otherwise.
#[derive(Debug, Clone)]
struct GeluSplit {
    node: String,
    tanh: bool,
    /// tract's expansion of the erf form
    tract_exact: Option<Box<dyn Expansion>>,
}

impl Expansion for GeluSplit {
    fn name(&self) -> StaticName {
        "AttnrtGeluSplit".into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        check_input_arity(inputs, 1)?;
        check_output_arity(outputs, 1)?;
        s.equals(&inputs[0].datum_type, &outputs[0].datum_type)?;
        s.equals(&inputs[0].shape, &outputs[0].shape)?;
        Ok(())
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        if model.outlet_fact(inputs[0])?.datum_type == DatumType::F32 {
            let op = GeluOp {
                node: self.node.clone(),
                tanh: self.tanh,
                kernels: crate::kernels::for_op()?,
            };
            return model.wire_node(prefix, op, inputs);
        }
        if self.tanh {
            return model.wire_node(prefix, gelu_approximate(false), inputs);
        }
        match &self.tract_exact {
            Some(expansion) => expansion.wire(prefix, model, inputs),
            None => bail!("Gelu node '{}': tract's expansion is missing", self.node),
        }
    }
}

/// `Y = Gelu(X)` for f32 `X`, element-wise, in chunks over the current rayon pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeluOp {
    /// ONNX node name, for errors.
    pub node: String,
    /// The tanh approximation (`approximate = "tanh"`) instead of the erf form.
    pub tanh: bool,
    /// The session's kernels.
    pub kernels: KernelSet,
}

impl GeluOp {
    /// The activation this op applies.
    fn activation(&self) -> Activation {
        if self.tanh {
            Activation::GeluTanh
        } else {
            Activation::GeluErf
        }
    }

    /// The GELU in place over one chunk, on the kernels [`KernelSet::standalone_act`] says.
    fn chunk(&self, c: &mut [f32]) -> TractResult<()> {
        match self.kernels.standalone_act() {
            StandaloneAct::Caller if self.tanh => Func::Gelu.ew_f32()?.run(c),
            StandaloneAct::Caller => gelu_erf(c),
            StandaloneAct::Kernel(act) => {
                apply_rows(act, self.activation(), c, c.len(), 1, c.len());
                Ok(())
            }
        }
    }
}

impl Op for GeluOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        let form = if self.tanh { "tanh" } else { "erf" };
        Ok(vec![format!("node {}: {form} form", self.node)])
    }

    op_as_typed_op!();
}

/// Values per call of tract-linalg's `erf` (its `GeluExact` works in chunks of the same size).
const ERF_SCRATCH: usize = 1024;

impl EvalOp for GeluOp {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, mut inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut y = inputs.remove(0).into_tensor();
        {
            let ys =
                f32_data_mut(&mut y).with_context(|| format!("Gelu node '{}': X", self.node))?;
            let threads = self.kernels.threads();
            if threads.spreads_values(ys.len()) {
                use rayon::prelude::*;
                ys.par_chunks_mut(threads.elementwise_chunk())
                    .try_for_each(|c| self.chunk(c))?;
            } else {
                self.chunk(ys)?;
            }
        }
        Ok(tvec!(y.into_tvalue()))
    }
}

/// `x/2 · (1 + erf(x/√2))` in place, as tract's f32 `GeluExact` computes it.
fn gelu_erf(xs: &mut [f32]) -> TractResult<()> {
    let erf = Func::Erf.ew_f32()?;
    let c = 2.0f32.sqrt().recip();
    let mut scratch = [0f32; ERF_SCRATCH];
    for part in xs.chunks_mut(ERF_SCRATCH) {
        let scaled = &mut scratch[..part.len()];
        scaled
            .iter_mut()
            .zip(part.iter())
            .for_each(|(s, x)| *s = *x * c);
        erf.run(scaled)?;
        part.iter_mut()
            .zip(scaled.iter())
            .for_each(|(x, e)| *x = (*x * 0.5) * (*e + 1.0));
    }
    Ok(())
}

impl TypedOp for GeluOp {
    as_op!();

    /// Folds this `Gelu` into the projection that computes its input ([`ProjectionOp`]), whose
    /// kernel then applies it to each value as it stores it, instead of this op's pass over the
    /// whole tensor. The input may come from the projection through reshapes (GPT-2's `Conv1D`
    /// runs as a 2-D `Gemm` between two `Reshape`s), which an element-wise op commutes with: they
    /// are wired again after the folded projection. Only when every output on the way feeds
    /// nothing else and is not a model output, and where the projection can
    /// ([`ProjectionOp::with_activation`]).
    fn declutter(
        &self,
        model: &TypedModel,
        node: &TypedNode,
    ) -> TractResult<Option<TypedModelPatch>> {
        let Some((producer, reshapes)) = projection_before(model, node.inputs[0])? else {
            return Ok(None);
        };
        let act = self.activation();
        let fused: Option<Box<dyn TypedOp>> = if let Some(p) = producer.op_as::<ProjectionOp>() {
            p.with_activation(act).map(|p| Box::new(p) as _)
        } else if let Some(q) = producer.op_as::<QuantProjectionOp>() {
            q.with_activation(act).map(|q| Box::new(q) as _)
        } else {
            None
        };
        let Some(fused) = fused else {
            return Ok(None);
        };
        let mut patch = TypedModelPatch::default();
        let x = patch.tap_model(model, producer.inputs[0])?;
        let mut y = patch.wire_node(&producer.name, fused, &[x])?[0];
        for reshape in reshapes.iter().rev() {
            y = patch.wire_node(&reshape.name, reshape.op.clone(), &[y])?[0];
        }
        patch.shunt_outside(model, OutletId::new(node.id, 0), y)?;
        Ok(Some(patch))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        if inputs[0].datum_type != DatumType::F32 {
            bail!("Gelu node '{}': X is {:?}", self.node, inputs[0].datum_type);
        }
        Ok(tvec!(f32::fact(inputs[0].shape.clone())))
    }
}

/// The projection node whose output reaches `outlet` through nothing but axis changes (reshapes,
/// added or removed unit axes), with those nodes from `outlet` back; `None` when another op is on
/// the way or an output on the way is used elsewhere or is a model output.
fn projection_before(
    model: &TypedModel,
    mut outlet: OutletId,
) -> TractResult<Option<(&TypedNode, Vec<&TypedNode>)>> {
    let mut reshapes = Vec::new();
    loop {
        let node = model.node(outlet.node);
        if sole_reader(model, outlet)?.is_none() {
            return Ok(None);
        }
        if node.op_is::<ProjectionOp>() || node.op_is::<QuantProjectionOp>() {
            return Ok(Some((node, reshapes)));
        }
        if !node.op_is::<AxisOp>() || node.inputs.len() != 1 {
            return Ok(None);
        }
        reshapes.push(node);
        outlet = node.inputs[0];
    }
}
