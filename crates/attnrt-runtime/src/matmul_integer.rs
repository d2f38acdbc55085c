//! `MatMulInteger` by a constant weight, outside the dynamic-quantization chain that
//! `quant_projection.rs` runs whole (a graph that keeps the i32 product, or quantizes its
//! activations another way): the exact integer product of `attnrt_kernels::quant` in place of
//! tract's generic one, with the weight packed once.
//!
//! Wired as [`MatMulIntegerOp`] when `B` is a constant `[K, N]` int8/uint8, `b_zero_point` is
//! absent or a constant `[]`, `[1]` or `[N]` of its type, `A` is int8/uint8 of rank ≥ 2 with last
//! extent `K`, and `a_zero_point` is absent or a scalar (`[]` or `[1]`; it may be computed, as
//! `DynamicQuantizeLinear` computes it). Everything else (batched or computed weights, a zero
//! point per row of `A`) is tract's expansion. The result is the same i32 sums either way
//! (wrapping on overflow as the graph's i32 arithmetic does).

use attnrt_kernels::quant::{quant_matmul, QuantOutput, QuantizedRows, QuantizedWeight};
use attnrt_kernels::KernelSet;
use tract_onnx::model::{optional_inputs, ParsingContext};
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use crate::projection_core::{self, RowProjection};
use crate::quant_projection::pack_weight;
use crate::tract_parser::{OnnxParser, Wrapper};

/// The name under which [`MatMulIntegerOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtMatMulInteger";

/// attnrt's `MatMulInteger` parser, wrapping tract's (registered by the op registry).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("MatMulInteger", parse);

fn parse(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    PARSER.wrap_expansion(ctx, node, || {
        let mut zero_points = optional_inputs(node).skip(2);
        Ok(ConstantWeight {
            node: node.name.clone(),
            a_zero_point: zero_points.next().flatten(),
            b_zero_point: zero_points.next().flatten(),
        })
    })
}

/// The parsed node: tract's shape rules; wiring picks [`MatMulIntegerOp`] when it can.
#[derive(Debug, Clone)]
struct ConstantWeight {
    node: String,
    a_zero_point: Option<usize>,
    b_zero_point: Option<usize>,
}

impl Wrapper for ConstantWeight {
    fn name(&self) -> StaticName {
        "AttnrtMatMulIntegerParse".into()
    }

    fn wire(
        &self,
        tract: &dyn Expansion,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        match self.native(model, inputs)? {
            Some(op) => {
                let mut wired = vec![inputs[0]];
                wired.extend(self.a_zero_point.map(|z| inputs[z]));
                model.wire_node(prefix, op, &wired)
            }
            None => tract.wire(prefix, model, inputs),
        }
    }
}

impl ConstantWeight {
    /// The op for these inputs, or `None` (tract's expansion; see the module docs).
    fn native(
        &self,
        model: &TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<Option<MatMulIntegerOp>> {
        let (a, b) = (model.outlet_fact(inputs[0])?, model.outlet_fact(inputs[1])?);
        let Some(w) = b.konst.as_ref() else {
            return Ok(None);
        };
        let quantized = [DatumType::I8, DatumType::U8];
        let &[k, n] = w.shape() else { return Ok(None) };
        let k_of_a = a.shape.last().and_then(|d| d.to_usize().ok());
        if !quantized.contains(&a.datum_type) || a.rank() < 2 || k_of_a != Some(k) {
            return Ok(None);
        }
        if let Some(z) = self.a_zero_point {
            let scalar = model.outlet_fact(inputs[z])?.shape.volume().to_usize().ok() == Some(1);
            if !scalar || model.outlet_fact(inputs[z])?.rank() > 1 {
                return Ok(None);
            }
        }
        let zero_point = match self.b_zero_point {
            Some(z) => match model.outlet_fact(inputs[z])?.konst.clone() {
                Some(t) if matches!(t.shape(), [] | [1]) || t.shape() == [n] => Some(t),
                _ => return Ok(None),
            },
            None => None,
        };
        if !quantized.contains(&w.datum_type()) {
            return Ok(None);
        }
        let kernels = crate::kernels::for_op()?;
        let weight = pack_weight(&kernels, w, zero_point.as_deref(), k, n)
            .with_context(|| format!("MatMulInteger node '{}'", self.node))?;
        Ok(Some(MatMulIntegerOp {
            node: self.node.clone(),
            weight: Arc::new(weight),
            kernels,
        }))
    }
}

/// `y = (a − a_zero_point) · W` in i32 for `a: [..., K]` int8/uint8 (input 0), an optional
/// scalar zero point (input 1), and a constant packed weight `[K, N]` minus its zero points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatMulIntegerOp {
    /// ONNX node name, for errors.
    pub node: String,
    /// The weight minus its zero points, packed (the op's only copy of it).
    pub weight: Arc<QuantizedWeight>,
    /// The session's kernels.
    pub kernels: KernelSet,
}

impl Op for MatMulIntegerOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        let (k, n) = (self.weight.k(), self.weight.n());
        Ok(vec![format!(
            "node {}: x[..,{k}] · W[{k}, {n}] in i32 on {}",
            self.node,
            self.kernels.quant()
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for MatMulIntegerOp {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        projection_core::eval(self, inputs)
    }
}

impl RowProjection for MatMulIntegerOp {
    fn context(&self) -> String {
        format!("MatMulInteger node '{}'", self.node)
    }

    fn dims(&self) -> (usize, usize) {
        (self.weight.k(), self.weight.n())
    }

    fn input_types(&self) -> TVec<DatumType> {
        tvec!(DatumType::U8, DatumType::I8)
    }

    fn output_type(&self) -> DatumType {
        DatumType::I32
    }

    fn project(&self, inputs: &[TValue], m: usize, shape: &[usize]) -> TractResult<Tensor> {
        let a = &inputs[0];
        let k = self.weight.k();
        let za = match inputs.get(1) {
            Some(z) => z.cast_to_scalar::<i32>()?,
            None => 0,
        };
        let a_ram = a.try_as_plain_ram()?;
        let rows = match a.datum_type() {
            DatumType::U8 => QuantizedRows::from_u8(a_ram.as_slice::<u8>()?, m, k, za as u8),
            DatumType::I8 => QuantizedRows::from_i8(a_ram.as_slice::<i8>()?, m, k, za as i8),
            dt => bail!("A is {dt:?}, needs int8 or uint8"),
        };
        let mut y = Tensor::zero::<i32>(shape)?;
        let mut view = y.to_plain_array_view_mut::<i32>()?;
        let ys = view
            .as_slice_mut()
            .context("a fresh tensor is contiguous")?;
        let kernels = &self.kernels;
        quant_matmul(
            kernels.quant(),
            kernels.threads(),
            &rows,
            &self.weight,
            QuantOutput::Int(ys),
        );
        Ok(y)
    }
}

impl TypedOp for MatMulIntegerOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        projection_core::output_facts(self, inputs)
    }
}
