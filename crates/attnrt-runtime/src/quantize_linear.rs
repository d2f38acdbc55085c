//! ONNX `QuantizeLinear` with its input bounded first. tract's op for one scale and zero point
//! computes `round(x · (1 / scale)) as i32 + zero_point` before saturating, and the integer
//! add overflows when `x / scale` reaches 2³¹ (an infinity, a huge activation, a tiny scale):
//! a panic in a debug build, a wrapped (wrong) value in a release one. ONNX saturates.
//!
//! attnrt's parser wires tract's op behind a clamp of `x` to `±2³⁰ · |scale|`: every value
//! that clamp moves saturates to the type's bound anyway (`|x / scale| ≥ 2³⁰` is far outside
//! any 8-bit range), so the result is tract's wherever tract's is defined, and ONNX's
//! saturated bound where tract's overflowed. NaN passes through (tract quantizes it to the
//! zero point). Scales per axis go through tract's float arithmetic, which saturates already.

use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::math::{max, min};
use tract_onnx::tract_hir::internal::*;

use crate::tract_parser::OnnxParser;

/// The name of the parsed (not planned) op: the plan holds tract's `max`, `min` and
/// `QuantizeLinear` ops.
pub(crate) const OP_NAME: &str = "AttnrtQuantizeLinear";

/// attnrt's `QuantizeLinear` parser, wrapping tract's (registered in every session).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("QuantizeLinear", parse);

/// `|x / scale|` at or above this saturates every 8-bit type, and stays far from `i32`'s end.
const BOUND: f32 = (1u32 << 30) as f32;

fn parse(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    PARSER.wrap_expansion(ctx, node, |tract| Ok(expand(BoundedQuantize { tract })))
}

/// tract's `QuantizeLinear`, its input clamped first when it has one scale (see the module
/// docs).
#[derive(Debug, Clone)]
struct BoundedQuantize {
    tract: Box<dyn Expansion>,
}

impl Expansion for BoundedQuantize {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        Expansion::rules(&*self.tract, s, inputs, outputs)
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let x = model.outlet_fact(inputs[0])?.clone();
        let scale = model.outlet_fact(inputs[1])?.konst.clone();
        let Some(scale) = scale.filter(|s| s.len() == 1 && x.datum_type == f32::datum_type())
        else {
            return Expansion::wire(&*self.tract, prefix, model, inputs);
        };
        let bound = BOUND * scale.cast_to_scalar::<f32>()?.abs();
        let rank = x.rank();
        let lo = tensor0(-bound).broadcast_into_rank(rank)?;
        let hi = tensor0(bound).broadcast_into_rank(rank)?;
        let lo = model.add_const(format!("{prefix}.lo"), lo)?;
        let hi = model.add_const(format!("{prefix}.hi"), hi)?;
        let clamped = model.wire_node(format!("{prefix}.above"), max(), &[inputs[0], lo])?;
        let clamped = model.wire_node(format!("{prefix}.below"), min(), &[clamped[0], hi])?;
        let mut wired: TVec<OutletId> = inputs.into();
        wired[0] = clamped[0];
        Expansion::wire(&*self.tract, prefix, model, &wired)
    }
}
