//! A projection weight packed once, in the layout both product kernels read in place.

use std::mem::MaybeUninit;

use rayon::prelude::*;

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
        Self::pack(&Floats(w), k, n, k_stride, n_stride)
    }

    /// [`PackedWeight::from_strided`] of the float32 values stored little-endian in `bytes`, at
    /// any alignment (ONNX's `raw_data`, a slice of a mapped file): each value is read once,
    /// straight into its panel, with no aligned copy of the weight first.
    ///
    /// # Panics
    /// If an element lies outside `bytes`.
    pub fn from_le_bytes(
        bytes: &[u8],
        k: usize,
        n: usize,
        k_stride: usize,
        n_stride: usize,
    ) -> Self {
        Self::pack(&LeBytes(bytes), k, n, k_stride, n_stride)
    }

    /// Packs the panels in parallel on the current rayon pool, one panel per task, writing each
    /// value of the result once: the buffer is not zeroed first (fresh pages come zeroed from
    /// the system, and zeroing them again is a second pass over gigabytes for a large model).
    fn pack(w: &impl Values, k: usize, n: usize, k_stride: usize, n_stride: usize) -> Self {
        if k > 0 && n > 0 {
            let last = (k - 1) * k_stride + (n - 1) * n_stride;
            assert!(last < w.len(), "weight element {last} of {}", w.len());
        }
        let len = n.div_ceil(PANEL) * k * PANEL;
        let mut panels: Vec<f32> = Vec::with_capacity(len);
        if len > 0 {
            let spare = &mut panels.spare_capacity_mut()[..len];
            spare
                .par_chunks_mut(k * PANEL)
                .enumerate()
                .for_each(|(c, panel)| {
                    let c0 = c * PANEL;
                    let width = PANEL.min(n - c0);
                    for (kk, row) in panel.chunks_exact_mut(PANEL).enumerate() {
                        let (values, padding) = row.split_at_mut(width);
                        w.read(kk * k_stride + c0 * n_stride, n_stride, values);
                        padding.fill(MaybeUninit::new(0.0));
                    }
                });
        }
        // Safety: the loop above wrote all `len` values (each panel's rows: `width` read, the
        // rest zero), and `len` is within the capacity.
        unsafe { panels.set_len(len) };
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

/// Where packing reads a weight's values.
trait Values: Sync {
    /// How many values there are.
    fn len(&self) -> usize;

    /// Writes into `dst` the values at `at`, `at + stride`, ... (all within [`Values::len`]).
    fn read(&self, at: usize, stride: usize, dst: &mut [MaybeUninit<f32>]);
}

/// Values in memory as `f32`.
struct Floats<'a>(&'a [f32]);

impl Values for Floats<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn read(&self, at: usize, stride: usize, dst: &mut [MaybeUninit<f32>]) {
        if stride == 1 {
            let src = &self.0[at..at + dst.len()];
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = MaybeUninit::new(v);
            }
        } else {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = MaybeUninit::new(self.0[at + i * stride]);
            }
        }
    }
}

/// Float32 values stored little-endian, at any alignment.
struct LeBytes<'a>(&'a [u8]);

impl Values for LeBytes<'_> {
    fn len(&self) -> usize {
        self.0.len() / 4
    }

    fn read(&self, at: usize, stride: usize, dst: &mut [MaybeUninit<f32>]) {
        let value = |i: usize| {
            let b = &self.0[i * 4..i * 4 + 4];
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        if stride == 1 && cfg!(target_endian = "little") {
            let src = &self.0[at * 4..(at + dst.len()) * 4];
            // Safety: `dst` is `dst.len()` f32 slots, as many bytes as `src` holds; on a
            // little-endian target the bytes are the values, and a byte copy needs no alignment.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    dst.as_mut_ptr().cast::<u8>(),
                    src.len(),
                );
            }
        } else {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = MaybeUninit::new(value(at + i * stride));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of the type's documentation, element by element.
    fn naive(w: &[f32], k: usize, n: usize, k_stride: usize, n_stride: usize) -> Vec<f32> {
        let chunks = n.div_ceil(PANEL);
        let mut out = vec![0.0; chunks * k * PANEL];
        for kk in 0..k {
            for j in 0..n {
                let (c, i) = (j / PANEL, j % PANEL);
                out[(c * k + kk) * PANEL + i] = w[kk * k_stride + j * n_stride];
            }
        }
        out
    }

    fn values(len: usize) -> Vec<f32> {
        (0..len).map(|i| i as f32 * 0.5 - 3.0).collect()
    }

    /// `w` stored little-endian `offset` bytes into a buffer (so at every alignment).
    fn bytes_at(w: &[f32], offset: usize) -> Vec<u8> {
        let mut b = vec![0xAB; offset];
        b.extend(w.iter().flat_map(|v| v.to_le_bytes()));
        b
    }

    #[test]
    fn panels_match_the_layout_from_floats_and_from_bytes_at_any_alignment() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for &(k, n) in &[
            (1, 1),
            (3, 64),
            (5, 65),
            (17, 130),
            (2, 200),
            (0, 7),
            (7, 0),
        ] {
            let w = values(k * n);
            // Row-major `[k, n]`, and its transpose `[n, k]` read with `k_stride = 1`.
            let t: Vec<f32> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
            for (src, k_stride, n_stride) in [(&w, n, 1), (&t, 1, k)] {
                let want = naive(src, k, n, k_stride, n_stride);
                let got =
                    pool.install(|| PackedWeight::from_strided(src, k, n, k_stride, n_stride));
                assert_eq!((got.k(), got.n()), (k, n));
                assert_eq!(
                    got.panels, want,
                    "floats {k}×{n} strides {k_stride}, {n_stride}"
                );
                for offset in 0..4 {
                    let bytes = bytes_at(src, offset);
                    let got =
                        PackedWeight::from_le_bytes(&bytes[offset..], k, n, k_stride, n_stride);
                    assert_eq!(got.panels, want, "bytes at +{offset}, {k}×{n}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "weight element")]
    fn a_weight_too_short_for_its_shape_panics_before_packing() {
        let bytes = bytes_at(&values(11), 1);
        PackedWeight::from_le_bytes(&bytes[1..], 3, 4, 4, 1);
    }
}
