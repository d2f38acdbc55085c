//! Projections, `y = act(alpha · x · W + bias)` against a weight packed once
//! ([`PackedWeight`]): the Q/K/V/output and feed-forward matmuls of a transformer. The product
//! runs as tasks of up to 256 tokens × one panel of `PANEL` output features (`tile.rs`), each a
//! call of attnrt's panel kernel ([`crate::panel`]) or of the `gemm` crate (`gemm.rs`), as the
//! [`ProjectionKernel`] of the session's [`crate::KernelSet`] says for its number of tokens.

mod gemm;
mod pack;
mod tile;

pub use pack::PackedWeight;
pub use tile::project;

use crate::act::{ActKernel, Activation};
use crate::isa::Isa;
use crate::panel::PanelKernel;

/// The projections' part of a [`crate::KernelSet`]: which kernel runs a task of a given number of
/// tokens, and whether an activation can be applied as the product is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProjectionKernel {
    /// The panel kernel and the most tokens a task runs on it (tasks with more run on `gemm`);
    /// `None`: every task on `gemm`.
    panel: Option<(PanelKernel, usize)>,
    /// The activation build a projection applies its activation with (in the panel kernel's
    /// stores, or over a `gemm` block after it); `None`: projections take no activation.
    epilogue: Option<ActKernel>,
}

impl ProjectionKernel {
    /// Tasks of up to `panel.1` tokens on the panel kernel `panel.0`, larger ones (all with
    /// `None`) on `gemm`; activations applied with `epilogue`.
    pub(crate) fn new(panel: Option<(PanelKernel, usize)>, epilogue: Option<ActKernel>) -> Self {
        ProjectionKernel { panel, epilogue }
    }

    /// The panel kernel and the most tokens a task runs on it; `None`: every task on `gemm`.
    pub fn panel(&self) -> Option<(PanelKernel, usize)> {
        self.panel
    }

    /// This kernel with every task on `gemm` (benchmarks compare it with the panel kernel in
    /// one run); an epilogue stays, `gemm` blocks take it too.
    pub fn gemm_only(self) -> Self {
        ProjectionKernel {
            panel: None,
            ..self
        }
    }

    /// Whether a projection can apply an activation as it stores its output (a `Gelu` after it
    /// folds in).
    pub fn epilogue(&self) -> bool {
        self.epilogue.is_some()
    }
}

/// Names the kernels, for reports: `gemm`, `attnrt's panel kernel`, or both with the panel
/// kernel's limit (`gemm (attnrt's panel kernel up to 4 tokens)`); a panel build other than
/// AVX-512 is named after its ISA.
impl std::fmt::Display for ProjectionKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some((panel, most)) = self.panel else {
            return f.write_str("gemm");
        };
        let build = match panel.isa() {
            Isa::Avx512 => String::new(),
            isa => format!(" ({isa})"),
        };
        match most {
            usize::MAX => write!(f, "attnrt's panel kernel{build}"),
            tokens => write!(
                f,
                "gemm (attnrt's panel kernel{build} up to {tokens} tokens)"
            ),
        }
    }
}

/// What [`project`] computes from `x`: `act(alpha · x · W + bias)`.
#[derive(Clone, Copy, Debug)]
pub struct Product<'a> {
    /// `W: [K, N]`, packed
    pub w: &'a PackedWeight,
    /// scale of the product
    pub alpha: f32,
    /// `[N]`, added to every row
    pub bias: Option<&'a [f32]>,
    /// applied to every output value, after the bias
    pub activation: Option<Activation>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{pool, ramp};
    use crate::threads::ThreadPolicy;

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

    /// Every way a product can run here: `gemm` alone, and each ISA's panel kernel up to 4
    /// tokens (then `gemm`) and for every task; activations with the panel's ISA.
    fn kernels() -> Vec<ProjectionKernel> {
        let mut all = vec![ProjectionKernel::new(None, None)];
        for isa in Isa::available() {
            for most in [4, usize::MAX] {
                let epilogue = Some(ActKernel::new(isa));
                all.push(ProjectionKernel::new(
                    Some((PanelKernel::new(isa), most)),
                    epilogue,
                ));
            }
        }
        all
    }

    #[test]
    fn project_matches_a_naive_product_on_every_kernel_odd_and_threaded_shapes() {
        let pool = pool(2);
        let threads = ThreadPolicy::default();
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 5, 7),
            (17, 64, 33),
            (130, 96, 80),
            (257, 768, 129),
            (5, 0, 4),
        ] {
            let (x, w, bias) = (ramp(m * k, 1.0), ramp(k * n, 2.0), ramp(n, 3.0));
            let want = naive(&x, &w, m, k, n);
            let packed = PackedWeight::new(&w, k, n);
            for (kernel, threaded, biased) in kernels()
                .into_iter()
                .flat_map(|kn| [(kn, false, false), (kn, true, false), (kn, true, true)])
            {
                let mut y = vec![f32::NAN; m * n];
                let product = Product {
                    w: &packed,
                    alpha: 1.0,
                    bias: biased.then_some(&bias[..]),
                    activation: None,
                };
                let run = |y: &mut [f32]| project(&kernel, &threads, &x, &product, y, m);
                if threaded {
                    pool.install(|| run(&mut y));
                } else {
                    run(&mut y);
                }
                for (i, (&g, &e)) in y.iter().zip(&want).enumerate() {
                    let e = if biased { e + bias[i % n] as f64 } else { e };
                    let tol = 1e-5 * (k as f64).max(1.0);
                    assert!(
                        (g as f64 - e).abs() <= tol,
                        "m{m} k{k} n{n} {kernel} threaded={threaded} bias={biased}: y[{i}] = \
                         {g}, want {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_activation_runs_on_the_panel_kernel_and_after_gemm_alike() {
        let (m, k, n) = (9, 40, 70);
        let (x, w, bias) = (ramp(m * k, 4.0), ramp(k * n, 5.0), ramp(n, 6.0));
        let packed = PackedWeight::new(&w, k, n);
        let want = naive(&x, &w, m, k, n);
        let threads = ThreadPolicy::default();
        for kernel in kernels().into_iter().filter(|kn| kn.epilogue()) {
            for act in [Activation::GeluErf, Activation::GeluTanh] {
                let product = Product {
                    w: &packed,
                    alpha: 0.5,
                    bias: Some(&bias),
                    activation: Some(act),
                };
                let mut y = vec![f32::NAN; m * n];
                project(&kernel, &threads, &x, &product, &mut y, m);
                for (i, (&g, &e)) in y.iter().zip(&want).enumerate() {
                    let sum = 0.5 * e + bias[i % n] as f64;
                    let e = act.reference(sum);
                    assert!(
                        (g as f64 - e).abs() <= 1e-5 * (1.0 + sum.abs()),
                        "{kernel} {act:?}: y[{i}] = {g}, want {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn reports_name_the_kernels() {
        let avx512 = PanelKernel::new(Isa::Avx512);
        let scalar = PanelKernel::new(Isa::Scalar);
        let name = |panel| ProjectionKernel::new(panel, None).to_string();
        assert_eq!(name(None), "gemm");
        assert_eq!(name(Some((avx512, usize::MAX))), "attnrt's panel kernel");
        assert_eq!(
            name(Some((avx512, 4))),
            "gemm (attnrt's panel kernel up to 4 tokens)"
        );
        assert_eq!(
            name(Some((scalar, usize::MAX))),
            "attnrt's panel kernel (scalar)"
        );
    }
}
