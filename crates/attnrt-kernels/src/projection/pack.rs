//! A projection weight packed once, in the layout both product kernels read in place.

use crate::panel::PANEL;

/// A projection weight `W: [K, N]` stored for [`super::project`]: panels of `PANEL` output
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
    ///
    /// # Panics
    /// If `w` does not hold `k·n` values.
    pub fn new(w: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w.len(), k * n, "weight of {k}×{n}");
        Self::from_strided(w, k, n, n, 1)
    }

    /// Packs the `k × n` matrix whose element `(kk, j)` is `w[kk·k_stride + j·n_stride]` (a
    /// transposed weight has `k_stride = 1`).
    ///
    /// # Panics
    /// If an element lies outside `w`.
    pub fn from_strided(w: &[f32], k: usize, n: usize, k_stride: usize, n_stride: usize) -> Self {
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

    /// Input features `K`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output features `N`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Panel `c`: `K · PANEL` values.
    pub(crate) fn panel(&self, c: usize) -> &[f32] {
        &self.panels[c * self.k * PANEL..(c + 1) * self.k * PANEL]
    }
}

// Compared bit for bit, so that equality is total (a graph library may compare ops holding it).
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

impl Eq for PackedWeight {}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeight({}×{})", self.k, self.n)
    }
}
