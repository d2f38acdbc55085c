//! ONNX Runtime's contrib op `MatMulIntegerToFloat` (domain `com.microsoft`) on attnrt's integer
//! kernels: `Y = (A − a_zero_point) · (B − b_zero_point) · (a_scale · b_scale) + bias`, with `A`
//! quantized already (uint8 or int8, one scale and zero point), `B` a constant int8/uint8
//! `[K, N]` with scales and zero points per tensor or per column, `bias` `[N]`.
//!
//! The rewrite `qdq-matmul` (`lower/qdq.rs`) writes it for the projections of QDQ models, and
//! ONNX Runtime's optimizer writes it too. It runs as a [`QuantProjectionOp`] whose input is
//! [`QuantInput::Quantized`]: the integer sums are exact and the epilogue rounds once for the
//! scale product, once for the product by it and once for the bias (see `quant_projection.rs`).

use tract_onnx::model::{optional_inputs, ParsingContext};
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use crate::quant_projection::{constant_input, projection_rules, QuantInput, QuantProjectionOp};
use crate::tensor::f32_data;
use crate::tract_parser::OnnxParser;

/// The op type (see the module docs).
pub(crate) const OP_TYPE: &str = "MatMulIntegerToFloat";

/// attnrt's `MatMulIntegerToFloat` parser (registered by the op registry; tract has none).
pub(crate) static PARSER: OnnxParser = OnnxParser::new(OP_TYPE, parse);

fn parse(_: &ParsingContext, node: &NodeProto) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let at: Vec<Option<usize>> = optional_inputs(node).take(7).collect();
    if node.input.len() > 7 || at[..4].iter().any(Option::is_none) {
        bail!(
            "{OP_TYPE} node '{}' needs inputs A, B, a_scale and b_scale (and at most \
             a_zero_point, b_zero_point and bias after them)",
            node.name
        );
    }
    Ok((
        expand(MatMulIntegerToFloat {
            node: node.name.clone(),
            a_zero_point: at[4],
            b_zero_point: at[5],
            bias: at[6],
        }),
        vec![],
    ))
}

/// The parsed node: where its optional inputs are.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct MatMulIntegerToFloat {
    node: String,
    a_zero_point: Option<usize>,
    b_zero_point: Option<usize>,
    bias: Option<usize>,
}

impl Expansion for MatMulIntegerToFloat {
    fn name(&self) -> StaticName {
        OP_TYPE.into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        let optional = [self.a_zero_point, self.b_zero_point, self.bias];
        check_input_arity(inputs, 4 + optional.iter().flatten().count())?;
        check_output_arity(outputs, 1)?;
        s.equals(&outputs[0].datum_type, f32::datum_type())?;
        s.equals(&inputs[2].datum_type, f32::datum_type())?;
        s.equals(&inputs[3].datum_type, f32::datum_type())?;
        if let Some(z) = self.a_zero_point {
            s.equals(&inputs[z].datum_type, &inputs[0].datum_type)?;
        }
        projection_rules(s, &inputs[0], &inputs[1], &outputs[0])
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let konst = |at, what| constant_input(model, inputs, at, OP_TYPE, &self.node, what);
        let weight = konst(Some(1), "B")?.unwrap();
        let b_scale = konst(Some(3), "b_scale")?.unwrap();
        let b_zero_point = konst(self.b_zero_point, "b_zero_point")?;
        let bias = konst(self.bias, "bias")?;
        let input = self.input(
            model.outlet_fact(inputs[0])?.datum_type,
            &konst(Some(2), "a_scale")?.unwrap(),
            konst(self.a_zero_point, "a_zero_point")?.as_deref(),
        )?;
        let mut op = QuantProjectionOp::new(
            &self.node,
            &weight,
            &b_scale,
            b_zero_point.as_deref(),
            bias.as_deref(),
        )?;
        op.input = input;
        model.wire_node(prefix, op, &inputs[..1])
    }
}

impl MatMulIntegerToFloat {
    /// `A`'s quantization: its type `a` (int8 or uint8), one scale, one zero point of its type.
    fn input(
        &self,
        a: DatumType,
        scale: &Tensor,
        zero_point: Option<&Tensor>,
    ) -> TractResult<QuantInput> {
        let ctx = || format!("{OP_TYPE} node '{}'", self.node);
        let signed = match a {
            DatumType::I8 => true,
            DatumType::U8 => false,
            dt => bail!("{}: A is {dt:?}, needs int8 or uint8", ctx()),
        };
        let &[scale] = f32_data(scale).with_context(ctx)? else {
            bail!("{}: a_scale is {:?}, needs one value", ctx(), scale.shape());
        };
        let zero_point = match zero_point {
            None => 0,
            Some(z) if z.len() != 1 => {
                bail!(
                    "{}: a_zero_point is {:?}, needs one value",
                    ctx(),
                    z.shape()
                )
            }
            Some(z) if signed => i32::from(z.try_as_plain_ram()?.as_slice::<i8>()?[0]),
            Some(z) => i32::from(z.try_as_plain_ram()?.as_slice::<u8>()?[0]),
        };
        Ok(QuantInput::Quantized {
            scale,
            zero_point,
            signed,
        })
    }
}
