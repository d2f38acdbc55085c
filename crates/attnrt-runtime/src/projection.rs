//! `MatMul` by a constant weight matrix (the Q/K/V/output and feed-forward projections of every
//! transformer export) on the `gemm` crate instead of tract's matmul.
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
//! The op is exact in the sense of any f32 matmul: the same products summed in another order,
//! so results differ from tract's by rounding only (the fused-vs-unfused diff of `attnrt run`
//! compares two graphs that both use it).
//!
//! [`Backend::Tract`] keeps tract's matmul everywhere: the peer baseline of the benches.

use tract_onnx::model::OnnxOpRegister;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;
use tract_onnx::tract_hir::ops::matmul::MatMulInference;

/// Which implementation runs `MatMul` nodes with a constant 2-D weight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// attnrt's [`ProjectionOp`] (the `gemm` crate).
    #[default]
    Attnrt,
    /// tract's own matmul, as plain tract-onnx runs the graph.
    Tract,
}

/// Registers attnrt's `MatMul` parser (replacing tract's) when `backend` is [`Backend::Attnrt`].
pub fn register(ops: &mut OnnxOpRegister, backend: Backend) {
    if backend == Backend::Attnrt {
        ops.insert("MatMul", |_, node| {
            Ok((
                expand(ProjectionMatMul {
                    node: node.name.clone(),
                }),
                vec![],
            ))
        });
    }
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
            if let Some(op) = ProjectionOp::for_facts(&self.node, a, b)? {
                return model.wire_node(prefix, op, &inputs[..1]);
            }
        }
        TRACT_MATMUL.wire(prefix, model, inputs)
    }
}

/// `y = x · W` for `x: [..., K]` f32 and a constant `W: [K, N]` f32, row-major: `y: [..., N]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProjectionOp {
    /// ONNX node name, for errors.
    pub node: String,
    /// The weight, `[K, N]`, contiguous f32.
    pub weight: Arc<Tensor>,
}

impl ProjectionOp {
    /// The op for a `MatMul` with input facts `a` and `b`, or `None` when the node is not a
    /// projection attnrt runs (the caller wires tract's matmul then).
    fn for_facts(node: &str, a: &TypedFact, b: &TypedFact) -> TractResult<Option<ProjectionOp>> {
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
        let k = w.shape()[0];
        match a.shape.last().and_then(|d| d.to_usize().ok()) {
            Some(ak) if ak == k => {}
            _ => return Ok(None),
        }
        Ok(Some(ProjectionOp {
            node: node.to_string(),
            weight: w.clone(),
        }))
    }

    fn k(&self) -> usize {
        self.weight.shape()[0]
    }

    fn n(&self) -> usize {
        self.weight.shape()[1]
    }
}

impl Op for ProjectionOp {
    fn name(&self) -> StaticName {
        "AttnrtProjection".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: x[..,{}] · W[{}, {}] on gemm",
            self.node,
            self.k(),
            self.k(),
            self.n()
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for ProjectionOp {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let ctx = || format!("MatMul node '{}'", self.node);
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
        let xs = x.try_as_plain_ram()?.as_slice::<f32>().with_context(ctx)?;
        let ws = self
            .weight
            .try_as_plain_ram()?
            .as_slice::<f32>()
            .with_context(ctx)?;
        // Every element is written by the gemm below (read_dst = false).
        let mut y = unsafe { Tensor::uninitialized::<f32>(&out_shape)? };
        {
            let ys = y
                .to_plain_array_view_mut::<f32>()?
                .into_slice()
                .context("an output tensor is not contiguous")?;
            project(xs, ws, ys, m, k, n);
        }
        Ok(tvec!(y.into_tvalue()))
    }
}

/// `y[m×n] = x[m×k] · w[k×n]`, all row-major and contiguous, on the threads of the current
/// rayon pool (the session's: `Session::run` runs inside it).
pub fn project(x: &[f32], w: &[f32], y: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(x.len() == m * k && w.len() == k * n && y.len() == m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        y.fill(0.0);
        return;
    }
    let threads = rayon::current_num_threads();
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the three slices have the lengths asserted above, strides describe row-major
    // m×k, k×n and m×n matrices inside them, and `y` is borrowed mutably (no aliasing).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            1,
            n as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
}

impl TypedOp for ProjectionOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let a = inputs[0];
        if a.datum_type != DatumType::F32 {
            bail!("MatMul node '{}': input A is {:?}", self.node, a.datum_type);
        }
        let mut shape: TVec<TDim> = a.shape.iter().cloned().collect();
        match shape.last_mut() {
            Some(last) => *last = self.n().into(),
            None => bail!("MatMul node '{}': input A is a scalar", self.node),
        }
        Ok(tvec!(f32::fact(shape)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

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
            for threaded in [false, true] {
                let mut y = vec![f32::NAN; m * n];
                if threaded {
                    pool.install(|| project(&x, &w, &mut y, m, k, n));
                } else {
                    project(&x, &w, &mut y, m, k, n);
                }
                for (i, (&g, &e)) in y.iter().zip(&want).enumerate() {
                    let tol = 1e-5 * (k as f64).max(1.0);
                    assert!(
                        (g as f64 - e).abs() <= tol,
                        "m{m} k{k} n{n} threaded={threaded}: y[{i}] = {g}, want {e}"
                    );
                }
            }
        }
    }
}
