//! `MatMul` by a constant weight matrix (the Q/K/V/output and feed-forward projections of every
//! transformer export) on attnrt's projection kernels (its panel kernel or the `gemm` crate)
//! instead of tract's matmul,
//! with the bias `Add` after it and a `Gelu` after that folded in (the kernel adds the bias in
//! its first stores and applies the GELU in its last).
//!
//! A layer's projections cost as many flops as its attention core at L ≈ 2·d_model, and tract's
//! f32 matmul reaches about 40 % of one core's FMA peak on these shapes here, where `gemm` (with
//! its AVX-512 kernels, picked at run time) reaches about 65 % (see benches/README.md). So the
//! `MatMul` parser is replaced: a node whose second input is a constant 2-D f32 matrix and whose
//! first input is f32 of rank ≥ 2 with a known last extent becomes [`ProjectionOp`]; every other
//! `MatMul` (Q·Kᵀ of an unfused graph, non-constant or batched weights, other types) is wired as
//! tract's own. The constant-weight test is made when the graph is typed, so it sees
//! initializers, not weights computed by nodes (those stay on tract).
//!
//! `Gemm` (what `nn.Linear` on 2-D inputs and GPT-2's `Conv1D` export to) is replaced the same
//! way: `Y = alpha·A·B' + beta·C` with `transA = 0`, a constant f32 `B` (`B' = Bᵀ` when
//! `transB = 1`, transposed once when the graph is built) and `C` absent or a constant that
//! broadcasts along rows (`[]`, `[1]`, `[N]`, `[1, 1]`, `[1, N]`) runs as [`ProjectionOp`], with
//! `beta·C` added to the product as the bias is. Any other `Gemm`
//! is wired as a tract `MatMul` (with its transpose flags) followed by the `alpha` and `beta·C`
//! terms.
//!
//! The op is exact in the sense of any f32 matmul: the same products summed in another order,
//! so results differ from tract's by rounding only (the fused-vs-unfused diff of `attnrt run`
//! compares two graphs that both use it).
//!
//! The kernel work (packing, tiling into tasks, the panel kernel or `gemm` per task) is
//! `attnrt_kernels::projection`, on the session's `KernelSet`; this module is the tract op
//! around it and the folds of a bias `Add` into it.
//!
//! `SessionOptions::attnrt_ops` off keeps tract's matmul everywhere: the peer baseline of the
//! benches.

use attnrt_kernels::act::Activation;
use attnrt_kernels::projection::{project, PackedWeight, Product};
use attnrt_kernels::KernelSet;
use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;
use tract_onnx::tract_hir::ops::matmul::MatMulInference;

use crate::projection_core::{self, RowProjection};
use crate::tensor::{f32_data, f32_data_mut};
use crate::tract_parser::OnnxParser;

/// attnrt's `MatMul` parser (registered by the op registry, in place of tract's).
pub(crate) static MATMUL: OnnxParser = OnnxParser::new("MatMul", parse_matmul);

/// attnrt's `Gemm` parser (registered by the op registry, in place of tract's).
pub(crate) static GEMM: OnnxParser = OnnxParser::new("Gemm", parse_gemm);

fn parse_matmul(
    _: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    Ok((
        expand(ProjectionMatMul {
            node: node.name.clone(),
        }),
        vec![],
    ))
}

fn parse_gemm(
    _: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let flag = |name: &str| -> TractResult<bool> {
        match node.get_attr_opt::<i64>(name)?.unwrap_or(0) {
            0 => Ok(false),
            1 => Ok(true),
            v => bail!("Gemm node '{}': {name} = {v}, must be 0 or 1", node.name),
        }
    };
    Ok((
        expand(ProjectionGemm {
            node: node.name.clone(),
            alpha: node.get_attr_opt::<f32>("alpha")?.unwrap_or(1.0),
            beta: node.get_attr_opt::<f32>("beta")?.unwrap_or(1.0),
            trans_a: flag("transA")?,
            trans_b: flag("transB")?,
        }),
        vec![],
    ))
}

/// The parsed `MatMul`: shape rules are tract's; wiring picks [`ProjectionOp`] when it can.
/// (`weights.rs` replaces it by its packed form when the weight is a large initializer.)
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq)]
pub(crate) struct ProjectionMatMul {
    /// The ONNX node name.
    pub(crate) node: String,
}

const TRACT_MATMUL: MatMulInference = MatMulInference {
    a_trans: false,
    b_trans: false,
    c_trans: false,
};

impl Expansion for ProjectionMatMul {
    fn name(&self) -> StaticName {
        "AttnrtMatMul".into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        // A `const` lives for 'static, which outlives 's.
        const INNER: &MatMulInference = &TRACT_MATMUL;
        INNER.rules(s, inputs, outputs)
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        if inputs.len() == 2 {
            let a = model.outlet_fact(inputs[0])?;
            let b = model.outlet_fact(inputs[1])?;
            if let Some(op) = ProjectionOp::for_facts(&self.node, a, b, false)? {
                return model.wire_node(prefix, op, &inputs[..1]);
            }
        }
        TRACT_MATMUL.wire(prefix, model, inputs)
    }
}

/// The parsed `Gemm`: `Y = alpha·A'·B' + beta·C` (`A' = Aᵀ` if `trans_a`, `B' = Bᵀ` if `trans_b`).
/// (`weights.rs` replaces it by its packed form when `B` is a large initializer.)
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProjectionGemm {
    pub(crate) node: String,
    pub(crate) alpha: f32,
    pub(crate) beta: f32,
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
}

impl Expansion for ProjectionGemm {
    fn name(&self) -> StaticName {
        "AttnrtGemm".into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        if !(2..=3).contains(&inputs.len()) {
            bail!(
                "Gemm node '{}' has {} inputs, needs A, B and an optional C",
                self.node,
                inputs.len()
            );
        }
        check_output_arity(outputs, 1)?;
        // A [M, K] (or [K, M]), B [K, N] (or [N, K]), Y [M, N]; C broadcasts to Y (checked by
        // the `Add` it becomes, or by `ProjectionOp::for_gemm`).
        let (m_axis, k_axis) = if self.trans_a { (1, 0) } else { (0, 1) };
        let (kb_axis, n_axis) = if self.trans_b { (1, 0) } else { (0, 1) };
        s.equals(&inputs[0].rank, 2)?;
        s.equals(&inputs[1].rank, 2)?;
        s.equals(&outputs[0].rank, 2)?;
        s.equals(&inputs[0].datum_type, &outputs[0].datum_type)?;
        s.equals(&inputs[1].datum_type, &outputs[0].datum_type)?;
        s.equals(&inputs[0].shape[m_axis], &outputs[0].shape[0])?;
        s.equals(&inputs[0].shape[k_axis], &inputs[1].shape[kb_axis])?;
        s.equals(&inputs[1].shape[n_axis], &outputs[0].shape[1])?;
        if inputs.len() == 3 {
            s.equals(&inputs[2].datum_type, &outputs[0].datum_type)?;
        }
        Ok(())
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let c = if self.beta == 0.0 {
            None
        } else {
            inputs.get(2).copied()
        };
        if !self.trans_a {
            let a = model.outlet_fact(inputs[0])?;
            let b = model.outlet_fact(inputs[1])?;
            let c_fact = c.map(|c| model.outlet_fact(c)).transpose()?;
            if let Some(op) = ProjectionOp::for_gemm(self, a, b, c_fact)? {
                return model.wire_node(prefix, op, &inputs[..1]);
            }
        }
        // tract's matmul, then `alpha·` and `+ beta·C` as element-wise nodes.
        let matmul = MatMulInference {
            a_trans: self.trans_a,
            b_trans: self.trans_b,
            c_trans: false,
        };
        let mut y = matmul.wire(&format!("{prefix}.ab"), model, &inputs[..2])?[0];
        let dt = model.outlet_fact(y)?.datum_type;
        if self.alpha != 1.0 {
            let alpha = tensor0(self.alpha).cast_to_dt(dt)?.into_owned();
            let alpha =
                model.add_const(format!("{prefix}.alpha"), alpha.broadcast_into_rank(2)?)?;
            y = model.wire_node(
                format!("{prefix}.alpha_ab"),
                tract_onnx::tract_hir::ops::math::mul(),
                &[y, alpha],
            )?[0];
        }
        if let Some(c) = c {
            y = add_beta_c(prefix, model, y, c, self.beta)?;
        }
        Ok(tvec!(y))
    }
}

/// Wires `y + beta·C` (`Gemm`'s last term; `C` made rank 2 first) as tract's element-wise ops,
/// the node named `prefix`.
pub(crate) fn add_beta_c(
    prefix: &str,
    model: &mut TypedModel,
    y: OutletId,
    mut c: OutletId,
    beta: f32,
) -> TractResult<OutletId> {
    let dt = model.outlet_fact(y)?.datum_type;
    while model.outlet_fact(c)?.rank() < 2 {
        let r = model.outlet_fact(c)?.rank();
        c = model.wire_node(format!("{prefix}.c_axis{r}"), AxisOp::Add(0), &[c])?[0];
    }
    if beta != 1.0 {
        let beta = tensor0(beta).cast_to_dt(dt)?.into_owned();
        let beta = model.add_const(format!("{prefix}.beta"), beta.broadcast_into_rank(2)?)?;
        c = model.wire_node(
            format!("{prefix}.beta_c"),
            tract_onnx::tract_hir::ops::math::mul(),
            &[c, beta],
        )?[0];
    }
    Ok(model.wire_node(prefix, tract_onnx::tract_hir::ops::math::add(), &[y, c])?[0])
}

/// The name under which [`ProjectionOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtProjection";

/// `y = alpha · x · W (+ bias)` for `x: [..., K]` f32, a constant `W: [K, N]` f32 and an optional
/// bias row `[N]` (`Gemm`'s `beta·C`), row-major: `y: [..., N]`.
#[derive(Debug, Clone)]
pub struct ProjectionOp {
    /// ONNX node name, for errors.
    pub node: String,
    /// The weight `[K, N]`, packed for the product (the op's only copy of it).
    pub weight: Arc<PackedWeight>,
    /// Scale of the product (`Gemm`'s `alpha`; 1 for `MatMul`).
    pub alpha: f32,
    /// Added to every output row (`Gemm`'s `beta·C`), `[N]` f32.
    pub bias: Option<Arc<Tensor>>,
    /// Applied to the output after the bias, as it is stored: the activation that followed the
    /// projection in the graph, folded in by [`ProjectionOp::with_activation`].
    pub activation: Option<Activation>,
    /// The session's kernels.
    pub kernels: KernelSet,
}

impl ProjectionOp {
    /// The op for a `MatMul` with input facts `a` and `b` (`b` transposed when `trans_b`), or
    /// `None` when the node is not a projection attnrt runs (the caller wires tract's matmul).
    fn for_facts(
        node: &str,
        a: &TypedFact,
        b: &TypedFact,
        trans_b: bool,
    ) -> TractResult<Option<ProjectionOp>> {
        let Some(w) = b.konst.as_ref() else {
            return Ok(None);
        };
        if a.datum_type != DatumType::F32
            || w.datum_type() != DatumType::F32
            || w.rank() != 2
            || a.rank() < 2
            || !w.is_plain_ram()
        {
            return Ok(None);
        }
        let k = w.shape()[usize::from(trans_b)];
        if a.shape.last().and_then(|d| d.to_usize().ok()) != Some(k) {
            return Ok(None);
        }
        let Some(ws) = w
            .try_as_plain_ram()
            .ok()
            .and_then(|w| w.as_slice::<f32>().ok())
        else {
            return Ok(None);
        };
        let (rows, cols) = (w.shape()[0], w.shape()[1]);
        let weight = if trans_b {
            // `w` is `[N, K]`: element (k, j) of the product's weight is `w[j][k]`.
            PackedWeight::from_strided(ws, cols, rows, 1, cols)
        } else {
            PackedWeight::from_strided(ws, rows, cols, cols, 1)
        };
        Self::for_packed(node, Arc::new(weight)).map(Some)
    }

    /// The op `x · weight` for a weight packed already (by `for_facts`, or once per session by
    /// `weights.rs`).
    pub(crate) fn for_packed(node: &str, weight: Arc<PackedWeight>) -> TractResult<ProjectionOp> {
        Ok(ProjectionOp {
            node: node.to_string(),
            weight,
            alpha: 1.0,
            bias: None,
            activation: None,
            kernels: crate::kernels::for_op()?,
        })
    }

    /// The op for a `Gemm` without `transA`, or `None` (tract's path). `c` is the fact of `C`
    /// when it is present and `beta ≠ 0`. `C` is checked before `B` is transposed, so a `Gemm`
    /// refused for its `C` costs no copy of the weight.
    fn for_gemm(
        g: &ProjectionGemm,
        a: &TypedFact,
        b: &TypedFact,
        c: Option<&TypedFact>,
    ) -> TractResult<Option<ProjectionOp>> {
        let Some(w) = b.konst.as_ref() else {
            return Ok(None);
        };
        if a.rank() != 2 || w.rank() != 2 {
            return Ok(None);
        }
        let n = w.shape()[usize::from(!g.trans_b)];
        let bias = match c {
            None => None,
            Some(c) => {
                // `Gemm`'s C is unidirectionally broadcast to [M, N]: rank ≤ 2.
                let Some(row) = c.konst.as_ref().and_then(|ct| bias_row(ct, n, 2)) else {
                    return Ok(None);
                };
                Some(row.iter().map(|&v| g.beta * v).collect::<Vec<f32>>())
            }
        };
        let Some(mut op) = Self::for_facts(&g.node, a, b, g.trans_b)? else {
            return Ok(None);
        };
        op.alpha = g.alpha;
        op.bias = bias.map(|row| tensor1(&row).into_arc_tensor());
        Ok(Some(op))
    }

    /// This projection followed by `activation`, applied by the kernel to each value as it
    /// stores it instead of by a pass of its own over the output (`attnrt_kernels::act`).
    /// `None` when the op already applies one, or its kernels take no activation
    /// (`ProjectionKernel::epilogue`).
    pub fn with_activation(&self, activation: Activation) -> Option<ProjectionOp> {
        let possible = self.activation.is_none() && self.kernels.projection().epilogue();
        possible.then(|| ProjectionOp {
            activation: Some(activation),
            ..self.clone()
        })
    }

    fn k(&self) -> usize {
        self.weight.k()
    }

    fn n(&self) -> usize {
        self.weight.n()
    }
}

// tract compares ops for equality (`DynEq`); `alpha` is compared by its bits so that equality is
// total.
impl PartialEq for ProjectionOp {
    fn eq(&self, other: &Self) -> bool {
        self.node == other.node
            && self.weight == other.weight
            && self.alpha.to_bits() == other.alpha.to_bits()
            && self.bias == other.bias
            && self.activation == other.activation
            && self.kernels == other.kernels
    }
}

impl Eq for ProjectionOp {}

impl Op for ProjectionOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: {}x[..,{}] · W[{}, {}]{}{}",
            self.node,
            if self.alpha == 1.0 {
                String::new()
            } else {
                format!("{} · ", self.alpha)
            },
            self.k(),
            self.k(),
            self.n(),
            if self.bias.is_some() { " + bias" } else { "" },
            match self.activation {
                Some(a) => format!(", then {a:?}"),
                None => String::new(),
            }
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for ProjectionOp {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        projection_core::eval(self, inputs)
    }
}

impl RowProjection for ProjectionOp {
    fn context(&self) -> String {
        format!("node '{}'", self.node)
    }

    fn dims(&self) -> (usize, usize) {
        (self.k(), self.n())
    }

    fn input_types(&self) -> TVec<DatumType> {
        tvec!(DatumType::F32)
    }

    fn output_type(&self) -> DatumType {
        DatumType::F32
    }

    fn project(&self, inputs: &[TValue], m: usize, shape: &[usize]) -> TractResult<Tensor> {
        let xs = f32_data(&inputs[0])?;
        let bias = self.bias.as_deref().map(f32_data).transpose()?;
        // Every element is written by `project` (the bias rows, or the product alone).
        let mut y = unsafe { Tensor::uninitialized::<f32>(shape)? };
        let ys = f32_data_mut(&mut y)?;
        let product = Product {
            w: &self.weight,
            alpha: self.alpha,
            bias,
            activation: self.activation,
        };
        let kernels = &self.kernels;
        project(kernels.projection(), kernels.threads(), xs, &product, ys, m);
        Ok(y)
    }
}

/// The `n` values a constant adds to every row of an `[..., n]` output, or `None` when it is not
/// such a row: f32 in plain memory, rank ≤ `max_rank`, every extent but the last 1, the last 1
/// (one value for the whole row) or `n`. Shapes `[]`, `[1]`, `[n]`, `[1, n]`, `[1, 1, n]`, ...
/// What `Gemm`'s `C` and the bias `Add` after a projection both need.
pub(crate) fn bias_row(c: &Tensor, n: usize, max_rank: usize) -> Option<Vec<f32>> {
    let dims = c.shape();
    let row_broadcast = dims.len() <= max_rank
        && dims.iter().rev().skip(1).all(|&d| d == 1)
        && dims.last().is_none_or(|&d| d == 1 || d == n);
    if c.datum_type() != DatumType::F32 || !c.is_plain_ram() || !row_broadcast {
        return None;
    }
    let vals = c.try_as_plain_ram().ok()?.as_slice::<f32>().ok()?;
    Some(if vals.len() == n {
        vals.to_vec()
    } else {
        vec![vals[0]; n]
    })
}

impl TypedOp for ProjectionOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        projection_core::output_facts(self, inputs)
    }

    /// Folds the bias `Add` that follows a projection (`x·W + b`, how `nn.Linear` exports on 3-D
    /// inputs) into the op: the bias is written into the output before the product accumulates
    /// onto it, which saves a pass over the output. Only when this op has no bias yet, the `Add`
    /// is its only consumer, and the other operand is a constant f32 that varies along the last
    /// axis alone (so the `Add` does not broadcast the output any wider).
    fn declutter(
        &self,
        model: &TypedModel,
        node: &TypedNode,
    ) -> TractResult<Option<TypedModelPatch>> {
        // After an activation an `Add` is no longer a bias.
        let bare = self.bias.is_none() && self.activation.is_none();
        fold_bias_add(model, node, self.n(), true, |row| {
            bare.then(|| ProjectionOp {
                bias: Some(tensor1(&row).into_arc_tensor()),
                ..self.clone()
            })
        })
    }
}

/// The patch that folds the bias `Add` after the projection `node` (output `[..., n]`, see
/// [`bias_add_after`]) into the op `with_bias` makes of the row it adds, when it makes one;
/// named as the `Add` (`add_name`) or as the projection.
pub(crate) fn fold_bias_add<O: TypedOp>(
    model: &TypedModel,
    node: &TypedNode,
    n: usize,
    add_name: bool,
    with_bias: impl FnOnce(Vec<f32>) -> Option<O>,
) -> TractResult<Option<TypedModelPatch>> {
    let Some((next, row)) = bias_add_after(model, node, n)? else {
        return Ok(None);
    };
    let name = if add_name { &next.name } else { &node.name };
    match with_bias(row) {
        Some(op) => Ok(Some(replace_chain(model, node.inputs[0], next, name, op)?)),
        None => Ok(None),
    }
}

/// The bias `Add` after the projection `node` (output `[..., n]`), and the row it adds: when
/// the `Add` is the projection's only consumer, the projection's output is not a model output,
/// and the `Add`'s other operand is a constant f32 that varies along the last axis alone (so
/// the `Add` does not broadcast the output any wider).
pub(crate) fn bias_add_after<'m>(
    model: &'m TypedModel,
    node: &TypedNode,
    n: usize,
) -> TractResult<Option<(&'m TypedNode, Vec<f32>)>> {
    let here = OutletId::new(node.id, 0);
    let Some(next) = sole_reader(model, here)? else {
        return Ok(None);
    };
    let is_add = next
        .op_as::<tract_onnx::tract_core::ops::binary::TypedBinOp>()
        .is_some_and(|b| b.0.is::<tract_onnx::tract_core::ops::math::Add>() && b.1.is_none());
    if !is_add || next.inputs.len() != 2 {
        return Ok(None);
    }
    let other = if next.inputs[0] == here {
        next.inputs[1]
    } else {
        next.inputs[0]
    };
    if other == here {
        return Ok(None);
    }
    let (y_fact, b_fact) = (model.outlet_fact(here)?, model.outlet_fact(other)?);
    let Some(b) = b_fact.konst.as_ref() else {
        return Ok(None);
    };
    if model.outlet_fact(OutletId::new(next.id, 0))?.shape != y_fact.shape {
        return Ok(None);
    }
    Ok(bias_row(b, n, y_fact.rank()).map(|row| (next, row)))
}

/// The node that alone reads `outlet`, when `outlet` is not a model output either: the
/// condition for folding the node that computes `outlet` into a later one (nothing else sees
/// the value the fold stops computing).
pub(crate) fn sole_reader(model: &TypedModel, outlet: OutletId) -> TractResult<Option<&TypedNode>> {
    let readers = &model.node(outlet.node).outputs[outlet.slot].successors;
    if readers.len() != 1 || model.output_outlets()?.contains(&outlet) {
        return Ok(None);
    }
    Ok(Some(model.node(readers[0].node)))
}

/// The patch that replaces the chain of nodes from the one reading `input` to `last` by `op`
/// alone, named `name`, reading `input`.
pub(crate) fn replace_chain(
    model: &TypedModel,
    input: OutletId,
    last: &TypedNode,
    name: &str,
    op: impl Into<Box<dyn TypedOp>>,
) -> TractResult<TypedModelPatch> {
    let mut patch = TypedModelPatch::default();
    let x = patch.tap_model(model, input)?;
    let y = patch.wire_node(name, op, &[x])?[0];
    patch.shunt_outside(model, OutletId::new(last.id, 0), y)?;
    Ok(patch)
}
