//! ONNX `QuantizeLinear` with one scale and zero point (float32 to uint8 or int8) on attnrt's
//! kernel ([`attnrt_kernels::quant::quantize_linear`]): `saturate(round(x / scale) +
//! zero_point)` in one pass, 8 values at a time.
//!
//! tract's op for this case computed `round(x · (1 / scale)) as i32 + zero_point` before
//! saturating, and the integer add overflowed when `x / scale` reached 2³¹ (an infinity, a huge
//! activation, a tiny scale): a panic in a debug build, a wrapped (wrong) value in a release one.
//! ONNX saturates, and divides; so does this op. Scales per axis, other types and inputs that are
//! not constants go through tract's expansion (its float arithmetic saturates already).
//! Registered in every session, so the fused and the unfused graph quantize alike.

use attnrt_kernels::quant::{quantize_linear, requantize_linear, Quantized, Requantize};
use attnrt_kernels::KernelSet;
use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use tract_onnx::tract_core::ops::quant::DequantizeLinearF32;

use crate::projection::{replace_chain, sole_reader};
use crate::quant_projection::QuantProjectionOp;
use crate::tensor::{f32_data, f32_data_mut};
use crate::tract_parser::{OnnxParser, Wrapper};

/// The name under which [`QuantizeLinearOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtQuantizeLinear";

/// attnrt's `QuantizeLinear` parser, wrapping tract's (registered in every session).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("QuantizeLinear", parse);

fn parse(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    PARSER.wrap_expansion(ctx, node, || {
        Ok(PerTensorQuantize {
            node: node.name.clone(),
        })
    })
}

/// tract's `QuantizeLinear` (its shape rules, its expansion for what attnrt's op does not run).
#[derive(Debug, Clone)]
struct PerTensorQuantize {
    node: String,
}

impl Wrapper for PerTensorQuantize {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn wire(
        &self,
        tract: &dyn Expansion,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        match self.native(model, inputs)? {
            Some(op) => model.wire_node(prefix, op, &inputs[..1]),
            None => tract.wire(prefix, model, inputs),
        }
    }
}

impl PerTensorQuantize {
    /// attnrt's op for these inputs: float32 `x`, one constant scale, a constant zero point of
    /// one value (uint8 or int8) or none (uint8, 0); else `None`.
    fn native(
        &self,
        model: &TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<Option<QuantizeLinearOp>> {
        if model.outlet_fact(inputs[0])?.datum_type != f32::datum_type() {
            return Ok(None);
        }
        let scale = match &model.outlet_fact(inputs[1])?.konst {
            Some(s) if s.len() == 1 && s.datum_type() == f32::datum_type() => f32_data(s)?[0],
            _ => return Ok(None),
        };
        let zero_point = match inputs.get(2) {
            None => Some((Quantized::U8, 0)),
            Some(&z) => match &model.outlet_fact(z)?.konst {
                Some(z) if z.len() == 1 && z.datum_type() == u8::datum_type() => {
                    Some((Quantized::U8, i32::from(z.cast_to_scalar::<u8>()?)))
                }
                Some(z) if z.len() == 1 && z.datum_type() == i8::datum_type() => {
                    Some((Quantized::I8, i32::from(z.cast_to_scalar::<i8>()?)))
                }
                _ => None,
            },
        };
        let Some((to, zero_point)) = zero_point else {
            return Ok(None);
        };
        Ok(Some(QuantizeLinearOp {
            node: self.node.clone(),
            dequantize: false,
            scale,
            zero_point,
            to,
            kernels: crate::kernels::for_op()?,
        }))
    }
}

/// `y = saturate(round(x / scale) + zero_point)` to uint8 or int8 (see the module docs).
#[derive(Debug, Clone)]
pub struct QuantizeLinearOp {
    /// ONNX node name, for errors.
    pub node: String,
    /// The `DequantizeLinear` after it (same scale and zero point) folded in: the output is
    /// the float32 round trip (`attnrt_kernels::quant::Requantize`), not the 8-bit values.
    pub dequantize: bool,
    /// The scale.
    pub scale: f32,
    /// The zero point, in `to`'s range.
    pub zero_point: i32,
    /// The output type.
    pub to: Quantized,
    /// The session's kernels.
    pub kernels: KernelSet,
}

// tract compares ops for equality (`DynEq`); the scale by its bits, so that it is total.
impl PartialEq for QuantizeLinearOp {
    fn eq(&self, other: &Self) -> bool {
        self.node == other.node
            && self.dequantize == other.dequantize
            && self.scale.to_bits() == other.scale.to_bits()
            && self.zero_point == other.zero_point
            && self.to == other.to
            && self.kernels == other.kernels
    }
}

impl Eq for QuantizeLinearOp {}

impl QuantizeLinearOp {
    fn datum_type(&self) -> DatumType {
        match self.to {
            _ if self.dequantize => DatumType::F32,
            Quantized::U8 => DatumType::U8,
            Quantized::I8 => DatumType::I8,
        }
    }

    fn requantize(&self) -> Requantize {
        Requantize {
            scale: self.scale,
            zero_point: self.zero_point,
            to: self.to,
        }
    }
}

impl Op for QuantizeLinearOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: x / {} + {} to {:?}{}",
            self.node,
            self.scale,
            self.zero_point,
            self.to,
            if self.dequantize {
                ", and back to float32"
            } else {
                ""
            }
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for QuantizeLinearOp {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let x = &inputs[0];
        let xs = f32_data(x).with_context(|| format!("QuantizeLinear node '{}'", self.node))?;
        // Every byte is written by `quantize_linear`.
        let mut y = unsafe { Tensor::uninitialized_dt(self.datum_type(), x.shape())? };
        let (kernel, threads) = (self.kernels.quant(), self.kernels.threads());
        if self.dequantize {
            let out = f32_data_mut(&mut y)?;
            requantize_linear(kernel, threads, xs, self.requantize(), out);
            return Ok(tvec!(y.into_tvalue()));
        }
        let out = y.as_bytes_mut();
        quantize_linear(
            kernel,
            threads,
            xs,
            self.scale,
            self.zero_point,
            self.to,
            out,
        );
        Ok(tvec!(y.into_tvalue()))
    }
}

impl TypedOp for QuantizeLinearOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        Ok(tvec!(self.datum_type().fact(inputs[0].shape.clone())))
    }

    /// Folds the `DequantizeLinear` after this op (same scale and zero point, its only reader:
    /// a QDQ model's round trip of an activation) into a one-pass round trip: into the
    /// projection that computes the input when there is one (`QuantProjectionOp → this →
    /// DequantizeLinear` becomes the projection with the round trip in its epilogue,
    /// [`QuantProjectionOp::with_requantize`]), else into this op (`dequantize`). The same
    /// arithmetic value by value, without the passes over the 8-bit values. Only when each
    /// output on the way feeds the next node alone and is not a model output.
    fn declutter(
        &self,
        model: &TypedModel,
        node: &TypedNode,
    ) -> TractResult<Option<TypedModelPatch>> {
        if self.dequantize {
            return Ok(None);
        }
        let Some(dq) = sole_reader(model, OutletId::new(node.id, 0))? else {
            return Ok(None);
        };
        let same = dq.op_as::<DequantizeLinearF32>().is_some_and(|d| {
            d.scale.to_bits() == self.scale.to_bits() && d.zero_point == self.zero_point
        });
        if !same {
            return Ok(None);
        }
        let producer = model.node(node.inputs[0].node);
        let projection = match producer.op_as::<QuantProjectionOp>() {
            Some(p) if sole_reader(model, node.inputs[0])?.is_some() => {
                p.with_requantize(self.requantize())
            }
            _ => None,
        };
        let patch = match projection {
            Some(op) => replace_chain(model, producer.inputs[0], dq, &producer.name, op)?,
            None => {
                let op = QuantizeLinearOp {
                    dequantize: true,
                    ..self.clone()
                };
                replace_chain(model, node.inputs[0], dq, &node.name, op)?
            }
        };
        Ok(Some(patch))
    }
}
