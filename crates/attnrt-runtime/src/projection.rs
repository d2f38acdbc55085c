//! `MatMul` by a constant weight matrix (the Q/K/V/output and feed-forward projections of every
//! transformer export) on attnrt's panel kernel or the `gemm` crate instead of tract's matmul,
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
//! `SessionOptions::attnrt_ops` off keeps tract's matmul everywhere: the peer baseline of the
//! benches.

use attnrt_kernels::act::{apply_rows, apply_rows_raw, Activation};
use attnrt_kernels::panel::{panel_product_raw, Onto, PanelProduct};
use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;
use tract_onnx::tract_hir::ops::matmul::MatMulInference;

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
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq)]
struct ProjectionMatMul {
    node: String,
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
            if let Some(op) = ProjectionOp::for_facts(&self.node, a, b, false) {
                return model.wire_node(prefix, op, &inputs[..1]);
            }
        }
        TRACT_MATMUL.wire(prefix, model, inputs)
    }
}

/// The parsed `Gemm`: `Y = alpha·A'·B' + beta·C` (`A' = Aᵀ` if `trans_a`, `B' = Bᵀ` if `trans_b`).
#[derive(Debug, Clone, PartialEq)]
struct ProjectionGemm {
    node: String,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
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
        if let Some(mut c) = c {
            while model.outlet_fact(c)?.rank() < 2 {
                let r = model.outlet_fact(c)?.rank();
                c = model.wire_node(format!("{prefix}.c_axis{r}"), AxisOp::Add(0), &[c])?[0];
            }
            if self.beta != 1.0 {
                let beta = tensor0(self.beta).cast_to_dt(dt)?.into_owned();
                let beta =
                    model.add_const(format!("{prefix}.beta"), beta.broadcast_into_rank(2)?)?;
                c = model.wire_node(
                    format!("{prefix}.beta_c"),
                    tract_onnx::tract_hir::ops::math::mul(),
                    &[c, beta],
                )?[0];
            }
            y = model.wire_node(prefix, tract_onnx::tract_hir::ops::math::add(), &[y, c])?[0];
        }
        Ok(tvec!(y))
    }
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
}

impl ProjectionOp {
    /// The op for a `MatMul` with input facts `a` and `b` (`b` transposed when `trans_b`), or
    /// `None` when the node is not a projection attnrt runs (the caller wires tract's matmul).
    fn for_facts(node: &str, a: &TypedFact, b: &TypedFact, trans_b: bool) -> Option<ProjectionOp> {
        let w = b.konst.as_ref()?;
        if a.datum_type != DatumType::F32
            || w.datum_type() != DatumType::F32
            || w.rank() != 2
            || a.rank() < 2
            || !w.is_plain_ram()
        {
            return None;
        }
        let k = w.shape()[usize::from(trans_b)];
        if a.shape.last().and_then(|d| d.to_usize().ok()) != Some(k) {
            return None;
        }
        let ws = w.try_as_plain_ram().ok()?.as_slice::<f32>().ok()?;
        let (rows, cols) = (w.shape()[0], w.shape()[1]);
        let weight = if trans_b {
            // `w` is `[N, K]`: element (k, j) of the product's weight is `w[j][k]`.
            PackedWeight::from_strided(ws, cols, rows, 1, cols)
        } else {
            PackedWeight::from_strided(ws, rows, cols, cols, 1)
        };
        Some(ProjectionOp {
            node: node.to_string(),
            weight: Arc::new(weight),
            alpha: 1.0,
            bias: None,
            activation: None,
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
        let Some(mut op) = Self::for_facts(&g.node, a, b, g.trans_b) else {
            return Ok(None);
        };
        op.alpha = g.alpha;
        op.bias = bias.map(|row| tensor1(&row).into_arc_tensor());
        Ok(Some(op))
    }

    /// This projection followed by `activation`, applied by the kernel to each value as it
    /// stores it instead of by a pass of its own over the output (`attnrt_kernels::act`).
    /// `None` when the op already applies one, or without AVX-512 (the epilogue's only build).
    pub fn with_activation(&self, activation: Activation) -> Option<ProjectionOp> {
        let possible = self.activation.is_none() && attnrt_kernels::Isa::Avx512.is_available();
        possible.then(|| ProjectionOp {
            activation: Some(activation),
            ..self.clone()
        })
    }

    fn k(&self) -> usize {
        self.weight.k
    }

    fn n(&self) -> usize {
        self.weight.n
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
        let ctx = || format!("node '{}'", self.node);
        let x = &inputs[0];
        let (k, n) = (self.k(), self.n());
        let shape = x.shape();
        if x.datum_type() != DatumType::F32 || shape.last() != Some(&k) {
            bail!(
                "{}: input A is {:?} {:?}, the weight needs f32 [..., {k}]",
                ctx(),
                x.datum_type(),
                shape
            );
        }
        let m: usize = shape[..shape.len() - 1].iter().product();
        let mut out_shape: TVec<usize> = shape.into();
        *out_shape.last_mut().unwrap() = n;
        let xs = f32_data(x).with_context(ctx)?;
        let bias = match &self.bias {
            Some(b) => Some(f32_data(b).with_context(ctx)?),
            None => None,
        };
        // Every element is written by `project` (the bias rows, or the product alone).
        let mut y = unsafe { Tensor::uninitialized::<f32>(&out_shape)? };
        let ys = f32_data_mut(&mut y)?;
        let product = Product {
            w: &self.weight,
            alpha: self.alpha,
            bias,
            activation: self.activation,
        };
        project_on(xs, &product, ys, m, panel_kernel_tokens());
        Ok(tvec!(y.into_tvalue()))
    }
}

/// The `n` values a constant adds to every row of an `[..., n]` output, or `None` when it is not
/// such a row: f32 in plain memory, rank ≤ `max_rank`, every extent but the last 1, the last 1
/// (one value for the whole row) or `n`. Shapes `[]`, `[1]`, `[n]`, `[1, n]`, `[1, 1, n]`, ...
/// What `Gemm`'s `C` and the bias `Add` after a projection both need.
fn bias_row(c: &Tensor, n: usize, max_rank: usize) -> Option<Vec<f32>> {
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

/// Output features per panel of a [`PackedWeight`]: attnrt's own AVX-512 micro-kernel's width
/// (`attnrt_kernels::panel`), and the height of the `gemm` crate's f32 tile with AVX-512 (4
/// vectors of 16; with AVX2 it reads half a panel per step), which serves CPUs without it.
const PANEL: usize = attnrt_kernels::panel::PANEL;

/// Up to this many tokens a task runs on attnrt's panel kernel (when the CPU has AVX-512),
/// past it on the `gemm` crate's — unless the panel kernel is the faster one for many tokens
/// too on this CPU ([`attnrt_kernels::panel::fastest_for_many_tokens`]). On the Intel VM
/// measured: one token (a decode step, where the weights stream from memory) 1.1–1.6× faster
/// on one thread, equal at 4, 2–23 % slower from 16 tokens on (`cargo bench -p attnrt-benches
/// --bench projection`).
const PANEL_KERNEL_TOKENS: usize = 4;

/// The most tokens a task of [`project_packed`] runs on the panel kernel on this CPU.
fn panel_kernel_tokens() -> usize {
    if attnrt_kernels::panel::fastest_for_many_tokens() {
        usize::MAX
    } else {
        PANEL_KERNEL_TOKENS
    }
}

/// Which kernel runs the projections' products on this CPU, for reports.
pub fn kernel_in_use() -> String {
    if !attnrt_kernels::Isa::Avx512.is_available() {
        return "gemm".into();
    }
    match panel_kernel_tokens() {
        usize::MAX => "attnrt's panel kernel".into(),
        tokens => format!("gemm (attnrt's panel kernel up to {tokens} tokens)"),
    }
}

/// Tokens per `gemm` call of [`project_packed`].
const TOKENS: usize = 256;

/// A projection weight `W: [K, N]` stored for [`project_packed`]: panels of `PANEL` output
/// features, panel `c` holding `W[kk][c·PANEL + i]` at `(c·K + kk)·PANEL + i` (zero past `N`).
/// That is the layout in which the `gemm` crate's microkernels read their left operand, so each
/// call reads the panel as it is; handed the row-major weight, the crate copies it into that
/// layout on every call — ≈ 26 % of the fused MHA layer's time at L=128 (perf), where a call has
/// few tokens to spread the copy over. Built once per op, when the session is built.
pub struct PackedWeight {
    k: usize,
    n: usize,
    panels: Vec<f32>,
}

impl PackedWeight {
    /// Packs the row-major `w: [k, n]`.
    pub fn new(w: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w.len(), k * n, "weight of {k}×{n}");
        Self::from_strided(w, k, n, n, 1)
    }

    /// Packs the `k × n` matrix whose element `(kk, j)` is `w[kk·k_stride + j·n_stride]`.
    fn from_strided(w: &[f32], k: usize, n: usize, k_stride: usize, n_stride: usize) -> Self {
        let chunks = n.div_ceil(PANEL);
        let mut panels = vec![0.0f32; chunks * k * PANEL];
        for c in 0..chunks {
            let c0 = c * PANEL;
            let width = PANEL.min(n - c0);
            for kk in 0..k {
                let dst = &mut panels[(c * k + kk) * PANEL..][..width];
                let src = kk * k_stride + c0 * n_stride;
                if n_stride == 1 {
                    dst.copy_from_slice(&w[src..src + width]);
                } else {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = w[src + i * n_stride];
                    }
                }
            }
        }
        PackedWeight { k, n, panels }
    }
}

// Compared bit for bit, so that equality is total (tract compares ops, `DynEq`).
impl PartialEq for PackedWeight {
    fn eq(&self, other: &Self) -> bool {
        self.k == other.k
            && self.n == other.n
            && self.panels.len() == other.panels.len()
            && self
                .panels
                .iter()
                .zip(&other.panels)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeight({}×{})", self.k, self.n)
    }
}

/// `y[m×n] = alpha · x[m×k] · w[k×n] (+ bias[n] on every row)`, all row-major and contiguous, on
/// the threads of the current rayon pool (the session's: `Session::run` runs inside it). Packs
/// `w` first; [`ProjectionOp`] keeps a [`PackedWeight`] and calls [`project_packed`].
#[allow(clippy::too_many_arguments)]
pub fn project(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    bias: Option<&[f32]>,
) {
    assert!(w.len() == k * n);
    project_packed(x, &PackedWeight::new(w, k, n), y, m, alpha, bias);
}

/// A raw output pointer shared by the tasks of [`project_packed`], which write disjoint blocks.
struct OutPtr(*mut f32);
// SAFETY: only used inside `project_packed`, whose tasks write disjoint elements of a buffer
// borrowed mutably for the whole call.
unsafe impl Sync for OutPtr {}

/// [`project`] with the weight already packed: `y[m×n] = alpha · x[m×k] · W (+ bias)`. The
/// product runs as tasks of up to `TOKENS` tokens × one panel of `PANEL` output features on
/// the current rayon pool, each one single-threaded call of attnrt's panel kernel or of `gemm`
/// (whichever is faster for its tokens on this CPU) that writes its own block of `y`.
pub fn project_packed(
    x: &[f32],
    w: &PackedWeight,
    y: &mut [f32],
    m: usize,
    alpha: f32,
    bias: Option<&[f32]>,
) {
    let product = Product {
        w,
        alpha,
        bias,
        activation: None,
    };
    project_on(x, &product, y, m, panel_kernel_tokens());
}

/// What [`project_on`] computes from `x`: `act(alpha · x · W + bias)`.
struct Product<'a> {
    w: &'a PackedWeight,
    alpha: f32,
    bias: Option<&'a [f32]>,
    activation: Option<Activation>,
}

/// `y[m×n] = product(x[m×k])` with tasks of up to `panel_tokens` tokens on the panel kernel (when
/// the CPU has AVX-512) and larger ones on `gemm`.
fn project_on(x: &[f32], product: &Product, y: &mut [f32], m: usize, panel_tokens: usize) {
    let Product {
        w,
        alpha,
        bias,
        activation,
    } = *product;
    let (k, n) = (w.k, w.n);
    assert!(x.len() == m * k && y.len() == m * n);
    assert!(bias.is_none_or(|b| b.len() == n));
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        match bias {
            Some(b) => y.chunks_exact_mut(n).for_each(|row| row.copy_from_slice(b)),
            None => y.fill(0.0),
        }
        if let Some(act) = activation {
            assert!(
                apply_rows(act, y, n, m, n),
                "an activation epilogue without AVX-512"
            );
        }
        return;
    }
    let chunks = n.div_ceil(PANEL);
    let blocks = m.div_ceil(TOKENS);
    let out = OutPtr(y.as_mut_ptr());
    let out = &out;
    let task = |t: usize| {
        // Token-block major: consecutive tasks (one thread's share) reuse the same rows of x.
        let (tb, c) = (t / chunks, t % chunks);
        let t0 = tb * TOKENS;
        let tokens = TOKENS.min(m - t0);
        let c0 = c * PANEL;
        let features = PANEL.min(n - c0);
        let panel = &w.panels[c * k * PANEL..(c + 1) * k * PANEL];
        let bias = bias.map(|b| &b[c0..c0 + features]);
        let block_product = PanelProduct {
            x: &x[t0 * k..(t0 + tokens) * k],
            x_stride: k,
            tokens,
            k,
            panel,
            width: features,
            alpha,
            onto: bias.map_or(Onto::Zero, Onto::Row),
            activation,
        };
        // SAFETY: the block y[t0.., c0..c0 + features] (row stride n) is inside `y` and written
        // by this task only.
        let block = unsafe { out.0.add(t0 * n + c0) };
        if tokens <= panel_tokens && unsafe { panel_product_raw(&block_product, block, n) } {
            return;
        }
        // SAFETY: as above.
        unsafe { gemm_block(&block_product, block, n) };
    };
    let tasks = blocks * chunks;
    if rayon::current_num_threads() > 1 && tasks > 1 {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Runs `p` on the `gemm` crate into `block` (row stride `n`): the product added onto what
/// `p.onto` says (a bias row is copied into the block first), then its activation over the rows.
///
/// # Safety
/// `block.add(t·n + i)` for `t < p.tokens`, `i < p.width` must be valid for reads and writes and
/// not accessed by anything else during the call.
unsafe fn gemm_block(p: &PanelProduct, block: *mut f32, n: usize) {
    if let Onto::Row(row) = p.onto {
        for t in 0..p.tokens {
            // SAFETY: row t of the block, as the caller vouches.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), block.add(t * n), p.width) };
        }
    }
    // SAFETY: the gemm computes the `width × tokens` block yᵀ = panelᵀ · xᵀ: the panel holds `k`
    // columns of PANEL contiguous floats, x's rows are `k` contiguous floats `x_stride` apart,
    // and the block (column stride n, row stride 1) is the caller's. With `read_dst` the gemm
    // computes `1·y + alpha·product`, and y holds the bias or its own values then.
    unsafe {
        gemm::gemm(
            p.width,
            p.tokens,
            p.k,
            block,
            n as isize,
            1,
            !matches!(p.onto, Onto::Zero),
            p.panel.as_ptr(),
            PANEL as isize,
            1,
            p.x.as_ptr(),
            p.x_stride as isize,
            1,
            1.0f32,
            p.alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    if let Some(act) = p.activation {
        // SAFETY: the caller's block.
        let applied = unsafe { apply_rows_raw(act, block, n, p.tokens, p.width) };
        assert!(applied, "an activation epilogue without AVX-512");
    }
}

impl TypedOp for ProjectionOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let a = inputs[0];
        if a.datum_type != DatumType::F32 {
            bail!("node '{}': input A is {:?}", self.node, a.datum_type);
        }
        let mut shape: TVec<TDim> = a.shape.iter().cloned().collect();
        match shape.last_mut() {
            Some(last) => *last = self.n().into(),
            None => bail!("node '{}': input A is a scalar", self.node),
        }
        Ok(tvec!(f32::fact(shape)))
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
        if self.bias.is_some() || self.activation.is_some() || node.outputs[0].successors.len() != 1
        {
            return Ok(None);
        }
        let here = OutletId::new(node.id, 0);
        if model.output_outlets()?.contains(&here) {
            return Ok(None);
        }
        let next = model.node(node.outputs[0].successors[0].node);
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
        let Some(row) = bias_row(b, self.n(), y_fact.rank()) else {
            return Ok(None);
        };
        let op = ProjectionOp {
            bias: Some(tensor1(&row).into_arc_tensor()),
            ..self.clone()
        };
        let mut patch = TypedModelPatch::default();
        let x = patch.tap_model(model, node.inputs[0])?;
        let y = patch.wire_node(&next.name, op, &[x])?[0];
        patch.shunt_outside(model, OutletId::new(next.id, 0), y)?;
        Ok(Some(patch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_testkit::seeded_values as values;

    fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut y = vec![0f64; m * n];
        for i in 0..m {
            for p in 0..k {
                let a = x[i * k + p] as f64;
                for j in 0..n {
                    y[i * n + j] += a * w[p * n + j] as f64;
                }
            }
        }
        y
    }

    #[test]
    fn project_matches_a_naive_product_on_odd_and_threaded_shapes() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 5, 7),
            (17, 64, 33),
            (130, 96, 80),
            (257, 768, 129),
            (5, 0, 4),
        ] {
            let x = values(m * k, 1);
            let w = values(k * n, 2);
            let want = naive(&x, &w, m, k, n);
            let packed = PackedWeight::new(&w, k, n);
            let bias = values(n, 3);
            // gemm past 4 tokens, the panel kernel for every task (where the CPU has AVX-512),
            // each with and without a bias, and `project` with this CPU's choice
            let mut outputs = Vec::new();
            for (threaded, panel_tokens, biased) in [
                (false, 4, false),
                (true, 4, false),
                (false, usize::MAX, false),
                (true, usize::MAX, false),
                (true, 4, true),
                (true, usize::MAX, true),
            ] {
                let mut y = vec![f32::NAN; m * n];
                let product = Product {
                    w: &packed,
                    alpha: 1.0,
                    bias: biased.then_some(&bias[..]),
                    activation: None,
                };
                let run = |y: &mut [f32]| project_on(&x, &product, y, m, panel_tokens);
                if threaded {
                    pool.install(|| run(&mut y));
                } else {
                    run(&mut y);
                }
                outputs.push((
                    format!("threaded={threaded} panel_tokens={panel_tokens} bias={biased}"),
                    y,
                    biased,
                ));
            }
            let mut y = vec![f32::NAN; m * n];
            project(&x, &w, &mut y, m, k, n, 1.0, None);
            outputs.push(("project".to_string(), y, false));
            for (label, y, biased) in &outputs {
                for (i, (&g, &e)) in y.iter().zip(&want).enumerate() {
                    let e = if *biased { e + bias[i % n] as f64 } else { e };
                    let tol = 1e-5 * (k as f64).max(1.0);
                    assert!(
                        (g as f64 - e).abs() <= tol,
                        "m{m} k{k} n{n} {label}: y[{i}] = {g}, want {e}"
                    );
                }
            }
        }
    }
}
