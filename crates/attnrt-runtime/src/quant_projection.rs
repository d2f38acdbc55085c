//! The projections of dynamically quantized models (ONNX Runtime's `quantize_dynamic`) as one
//! op on attnrt's exact integer kernels (`attnrt_kernels::quant`), in place of tract's generic
//! `DynamicQuantizeLinear → MatMulInteger → Cast → Mul (→ Add)`.
//!
//! The graph rewrite `dynamic-quantize-matmul` (`lower/quant.rs`) replaces each such chain by one
//! `DynamicQuantizeMatMul` node: ONNX Runtime's contrib op of that name (domain
//! `com.microsoft`), whose definition is the chain's: `Y = (A quantized dynamically to uint8,
//! per tensor) · (B − b_zero_point) · (a_scale · b_scale) + bias`, `B` int8 or uint8, `b_scale`
//! and `b_zero_point` per tensor or per column. This module parses that op type (so a file ONNX
//! Runtime's optimizer wrote with it runs too) into [`QuantProjectionOp`] when `B`, its scales,
//! zero points and bias are constants, and refuses it otherwise (tract has no such op to fall
//! back on).
//!
//! **The graph's own numbers.** The activations are quantized as `DynamicQuantizeLinear` defines
//! it (and as tract computes it), the integer sums are exact, and the epilogue rounds as the
//! `Cast`, the two `Mul`s and the `Add` do: `f32(sum) · f32(a_scale · b_scale[j]) + bias[j]`.
//! So the op's output is bit for bit the unfused graph's on tract (the tests compare them),
//! unless a `Gelu` after it is folded in ([`QuantProjectionOp::with_activation`]), computed by
//! attnrt's activation kernel: within float32 rounding of tract's.
//!
//! The weight is packed once when the graph is built (its only copy; `attnrt_kernels::quant`
//! describes the layout: i16, zero point subtracted).
//!
//! The same op runs ONNX Runtime's contrib op `MatMulIntegerToFloat` (`Y = (A − a_zero_point) ·
//! (B − b_zero_point) · (a_scale · b_scale) + bias`, `A` already quantized, uint8 or int8, per
//! tensor), which the rewrite `qdq-matmul` (`lower/qdq.rs`) writes for the projections of QDQ
//! models: there the activations are quantized by the graph's own `QuantizeLinear` and the op
//! takes them as they are ([`QuantInput::Quantized`]).

use attnrt_kernels::act::Activation;
use attnrt_kernels::quant::{
    quant_matmul, QuantOutput, QuantizedRows, QuantizedWeight, Requantize,
};
use attnrt_kernels::KernelSet;
use tract_onnx::model::{optional_inputs, ParsingContext};
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use crate::projection::fold_bias_add;
use crate::projection_core::{self, RowProjection};
use crate::tensor::{f32_data, f32_data_mut};
use crate::tract_parser::OnnxParser;

/// The name under which [`QuantProjectionOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtQuantProjection";

/// The op type the rewrite writes (ONNX Runtime's contrib op, see the module docs).
pub(crate) const OP_TYPE: &str = "DynamicQuantizeMatMul";

/// attnrt's `DynamicQuantizeMatMul` parser (registered by the op registry; tract has none).
pub(crate) static PARSER: OnnxParser = OnnxParser::new(OP_TYPE, parse);

fn parse(_: &ParsingContext, node: &NodeProto) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let mut inputs = optional_inputs(node);
    let (a, b, b_scale) = (
        inputs.next().flatten(),
        inputs.next().flatten(),
        inputs.next().flatten(),
    );
    if a.is_none() || b.is_none() || b_scale.is_none() {
        bail!(
            "{OP_TYPE} node '{}' needs inputs A, B and b_scale",
            node.name
        );
    }
    Ok((
        expand(DynamicQuantizeMatMul {
            node: node.name.clone(),
            b_zero_point: inputs.next().flatten(),
            bias: inputs.next().flatten(),
        }),
        vec![],
    ))
}

/// The parsed node: where its optional inputs are.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct DynamicQuantizeMatMul {
    node: String,
    b_zero_point: Option<usize>,
    bias: Option<usize>,
}

impl Expansion for DynamicQuantizeMatMul {
    fn name(&self) -> StaticName {
        OP_TYPE.into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        let arity = 3 + usize::from(self.b_zero_point.is_some()) + usize::from(self.bias.is_some());
        check_input_arity(inputs, arity)?;
        check_output_arity(outputs, 1)?;
        s.equals(&inputs[0].datum_type, f32::datum_type())?;
        s.equals(&outputs[0].datum_type, f32::datum_type())?;
        s.equals(&inputs[2].datum_type, f32::datum_type())?;
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
        let scale = konst(Some(2), "b_scale")?.unwrap();
        let zero_point = konst(self.b_zero_point, "b_zero_point")?;
        let bias = konst(self.bias, "bias")?;
        let op = QuantProjectionOp::new(
            &self.node,
            &weight,
            &scale,
            zero_point.as_deref(),
            bias.as_deref(),
        )?;
        model.wire_node(prefix, op, &inputs[..1])
    }
}

/// The constant at input `at` of node `node` (an `op_type`) when `at` is given; an error naming
/// `what` when it is not a constant.
pub(crate) fn constant_input(
    model: &TypedModel,
    inputs: &[OutletId],
    at: Option<usize>,
    op_type: &str,
    node: &str,
    what: &str,
) -> TractResult<Option<Arc<Tensor>>> {
    let Some(at) = at else { return Ok(None) };
    match &model.outlet_fact(inputs[at])?.konst {
        Some(t) => Ok(Some(t.clone())),
        None => bail!(
            "{op_type} node '{node}': {what} is not a constant (attnrt runs this op on constant \
             weights only)"
        ),
    }
}

/// The shapes of a projection of `a: [..., K]` by `b: [K, N]` into `y: [..., N]`.
pub(crate) fn projection_rules<'r, 'p: 'r>(
    s: &mut Solver<'r>,
    a: &'p TensorProxy,
    b: &'p TensorProxy,
    y: &'p TensorProxy,
) -> InferenceResult {
    s.equals(&b.rank, 2)?;
    projection_core::rules(s, a, y, &b.shape[0], &b.shape[1])
}

/// How the activations reach a [`QuantProjectionOp`].
#[derive(Debug, Clone, Copy)]
pub enum QuantInput {
    /// float32, quantized by the op as `DynamicQuantizeLinear` defines it (`DynamicQuantizeMatMul`)
    Dynamic,
    /// already quantized with this scale and zero point, int8 (`signed`) or uint8
    /// (`MatMulIntegerToFloat`)
    Quantized {
        /// the activations' scale
        scale: f32,
        /// their zero point, in their type's range
        zero_point: i32,
        /// int8 rather than uint8
        signed: bool,
    },
}

impl QuantInput {
    /// The element type the op's input has.
    fn datum_type(&self) -> DatumType {
        match self {
            QuantInput::Dynamic => DatumType::F32,
            QuantInput::Quantized { signed: true, .. } => DatumType::I8,
            QuantInput::Quantized { signed: false, .. } => DatumType::U8,
        }
    }

    /// A total order's worth of identity: the scale by its bits.
    fn key(&self) -> Option<(u32, i32, bool)> {
        match *self {
            QuantInput::Dynamic => None,
            QuantInput::Quantized {
                scale,
                zero_point,
                signed,
            } => Some((scale.to_bits(), zero_point, signed)),
        }
    }
}

/// `y = act((x quantized) · W · (x_scale · w_scale) + bias)` for `x: [..., K]` (f32, or already
/// quantized: [`QuantInput`]) and a constant int8/uint8 `W: [K, N]` (see the module docs).
#[derive(Debug, Clone)]
pub struct QuantProjectionOp {
    /// ONNX node name, for errors.
    pub node: String,
    /// What the first input holds.
    pub input: QuantInput,
    /// The weight minus its zero points, packed (the op's only copy of it).
    pub weight: Arc<QuantizedWeight>,
    /// The weight's scale per column, `[N]`.
    pub w_scale: Arc<Vec<f32>>,
    /// The round trip of each product through the graph's `QuantizeLinear` and
    /// `DequantizeLinear` after it (a QDQ model's output quantization, folded in by
    /// `quantize_linear.rs`), before the bias.
    pub requantize: Option<Requantize>,
    /// Added to every output row, `[N]` (after `requantize`).
    pub bias: Option<Arc<Vec<f32>>>,
    /// Applied after the bias, as the values are stored (a folded `Gelu`).
    pub activation: Option<Activation>,
    /// The session's kernels.
    pub kernels: KernelSet,
}

// tract compares ops for equality (`DynEq`); scales and biases are compared by their bits so
// that equality is total.
impl PartialEq for QuantProjectionOp {
    fn eq(&self, other: &Self) -> bool {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        self.node == other.node
            && self.input.key() == other.input.key()
            && self.weight == other.weight
            && bits(&self.w_scale) == bits(&other.w_scale)
            && self.requantize == other.requantize
            && self.bias.as_deref().map(|b| bits(b)) == other.bias.as_deref().map(|b| bits(b))
            && self.activation == other.activation
            && self.kernels == other.kernels
    }
}

impl Eq for QuantProjectionOp {}

impl QuantProjectionOp {
    /// The op for weight `w` (`[K, N]` int8 or uint8), its scale and zero point (`[]`, `[1]` or
    /// `[N]`; the zero point of `w`'s type) and a bias (`[N]` f32); errors name the node.
    pub(crate) fn new(
        node: &str,
        w: &Tensor,
        scale: &Tensor,
        zero_point: Option<&Tensor>,
        bias: Option<&Tensor>,
    ) -> TractResult<QuantProjectionOp> {
        let ctx = || format!("{OP_TYPE} node '{node}'");
        let &[k, n] = w.shape() else {
            bail!("{}: B is {:?}, needs [K, N]", ctx(), w.shape());
        };
        let per_column = |t: &Tensor, what: &str| -> TractResult<()> {
            match t.shape() {
                [] | [1] => Ok(()),
                [c] if *c == n => Ok(()),
                s => bail!("{}: {what} is {s:?}, needs [], [1] or [{n}]", ctx()),
            }
        };
        per_column(scale, "b_scale")?;
        if let Some(z) = zero_point {
            per_column(z, "b_zero_point")?;
        }
        let kernels = crate::kernels::for_op()?;
        let weight = pack_weight(&kernels, w, zero_point, k, n).with_context(ctx)?;
        let scales = f32_data(scale).with_context(ctx)?;
        let w_scale = (0..n)
            .map(|j| scales[if scales.len() == n { j } else { 0 }])
            .collect();
        let bias = match bias {
            Some(b) if b.shape() == [n] => Some(Arc::new(f32_data(b).with_context(ctx)?.to_vec())),
            Some(b) => bail!("{}: bias is {:?}, needs [{n}]", ctx(), b.shape()),
            None => None,
        };
        Ok(QuantProjectionOp {
            node: node.to_string(),
            input: QuantInput::Dynamic,
            weight: Arc::new(weight),
            w_scale: Arc::new(w_scale),
            requantize: None,
            bias,
            activation: None,
            kernels,
        })
    }

    /// This projection followed by the round trip `requantize` (`None` when it already has a
    /// bias, an activation or a round trip, which come before it).
    pub fn with_requantize(&self, requantize: Requantize) -> Option<QuantProjectionOp> {
        let bare = self.bias.is_none() && self.activation.is_none() && self.requantize.is_none();
        bare.then(|| QuantProjectionOp {
            requantize: Some(requantize),
            ..self.clone()
        })
    }

    /// This projection followed by `activation`, applied as the values are stored (every build
    /// of the integer kernels can); `None` when it already applies one.
    pub fn with_activation(&self, activation: Activation) -> Option<QuantProjectionOp> {
        self.activation.is_none().then(|| QuantProjectionOp {
            activation: Some(activation),
            ..self.clone()
        })
    }
}

/// `w: [k, n]` int8 or uint8 minus its zero point (`[]`, `[1]` or `[n]` of the same type; 0 when
/// absent), packed for `kernels`' integer product.
pub(crate) fn pack_weight(
    kernels: &KernelSet,
    w: &Tensor,
    zero_point: Option<&Tensor>,
    k: usize,
    n: usize,
) -> TractResult<QuantizedWeight> {
    if zero_point.is_some_and(|z| z.datum_type() != w.datum_type()) {
        bail!("b_zero_point is not of B's type {:?}", w.datum_type());
    }
    let values = w.try_as_plain_ram()?;
    match w.datum_type() {
        DatumType::I8 => {
            let z = match zero_point {
                Some(z) => z.try_as_plain_ram()?.as_slice::<i8>()?.to_vec(),
                None => vec![0],
            };
            Ok(QuantizedWeight::from_i8(
                kernels.quant(),
                values.as_slice::<i8>()?,
                k,
                n,
                &z,
            ))
        }
        DatumType::U8 => {
            let z = match zero_point {
                Some(z) => z.try_as_plain_ram()?.as_slice::<u8>()?.to_vec(),
                None => vec![0],
            };
            Ok(QuantizedWeight::from_u8(
                kernels.quant(),
                values.as_slice::<u8>()?,
                k,
                n,
                &z,
            ))
        }
        dt => bail!("B is {dt:?}, needs int8 or uint8"),
    }
}

impl Op for QuantProjectionOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: quantize(x[..,{}]) · W[{}, {}] int8{}{}{} on {}",
            self.node,
            self.weight.k(),
            self.weight.k(),
            self.weight.n(),
            match self.requantize {
                Some(r) => format!(
                    ", requantized ({} + {} as {:?})",
                    r.scale, r.zero_point, r.to
                ),
                None => String::new(),
            },
            if self.bias.is_some() { " + bias" } else { "" },
            match self.activation {
                Some(a) => format!(", then {a:?}"),
                None => String::new(),
            },
            self.kernels.quant()
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for QuantProjectionOp {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        projection_core::eval(self, inputs)
    }
}

impl RowProjection for QuantProjectionOp {
    fn context(&self) -> String {
        format!("{OP_TYPE} node '{}'", self.node)
    }

    fn dims(&self) -> (usize, usize) {
        (self.weight.k(), self.weight.n())
    }

    fn input_types(&self) -> TVec<DatumType> {
        tvec!(self.input.datum_type())
    }

    fn output_type(&self) -> DatumType {
        DatumType::F32
    }

    fn project(&self, inputs: &[TValue], m: usize, shape: &[usize]) -> TractResult<Tensor> {
        let (rows, x_scale) = self.rows(&inputs[0], m)?;
        let (kernel, threads) = (self.kernels.quant(), self.kernels.threads());
        // The graph's `Mul(x_scale, w_scale)`, one rounding per column.
        let scale: Vec<f32> = self.w_scale.iter().map(|&s| x_scale * s).collect();
        // Every element is written by `quant_matmul`.
        let mut y = unsafe { Tensor::uninitialized::<f32>(shape)? };
        let out = QuantOutput::Float {
            y: f32_data_mut(&mut y)?,
            scale: &scale,
            requantize: self.requantize,
            bias: self.bias.as_deref().map(Vec::as_slice),
            activation: self.activation.map(|a| (self.kernels.act(), a)),
        };
        quant_matmul(kernel, threads, &rows, &self.weight, out);
        Ok(y)
    }
}

impl QuantProjectionOp {
    /// The activations `x` (`m` rows) as the kernel takes them, and their scale.
    fn rows(&self, x: &Tensor, m: usize) -> TractResult<(QuantizedRows, f32)> {
        let k = self.weight.k();
        Ok(match self.input {
            QuantInput::Dynamic => {
                let (kernel, threads) = (self.kernels.quant(), self.kernels.threads());
                let xs = f32_data(x)?;
                // A comparison may pin this quantization to another run's (`quant_pins.rs`).
                let rows = crate::quant_pins::quantize(&self.node, xs, || {
                    QuantizedRows::quantize_dynamic(kernel, threads, xs, m, k)
                });
                let scale = rows.scale();
                (rows, scale)
            }
            QuantInput::Quantized {
                scale,
                zero_point,
                signed,
            } => {
                let x = x.try_as_plain_ram()?;
                let rows = if signed {
                    QuantizedRows::from_i8(x.as_slice::<i8>()?, m, k, zero_point as i8)
                } else {
                    QuantizedRows::from_u8(x.as_slice::<u8>()?, m, k, zero_point as u8)
                };
                (rows, scale)
            }
        })
    }
}

impl TypedOp for QuantProjectionOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        projection_core::output_facts(self, inputs)
    }

    /// Folds the bias `Add` that follows the projection into it (the QDQ form adds the bias
    /// after its output's `DequantizeLinear`, which `quantize_linear.rs` folds in first): the
    /// epilogue adds it as the `Add` does, one rounding. Only when this op has no bias nor
    /// activation yet (`projection::bias_add_after` says which `Add`s are biases).
    fn declutter(
        &self,
        model: &TypedModel,
        node: &TypedNode,
    ) -> TractResult<Option<TypedModelPatch>> {
        let bare = self.bias.is_none() && self.activation.is_none();
        // Named as the projection, whose `MatMul` the profile then counts it as.
        fold_bias_add(model, node, self.weight.n(), false, |row| {
            bare.then(|| QuantProjectionOp {
                bias: Some(Arc::new(row)),
                ..self.clone()
            })
        })
    }
}
