//! The weight of an integer projection, packed once: each value minus its zero point, as i16,
//! in panels of [`NR`] columns whose rows are interleaved in pairs (`w[2p][j], w[2p+1][j]` side
//! by side), the layout `vpmaddwd` multiplies against a broadcast pair of activations.

use super::NR;

/// A `[K, N]` weight with its zero points subtracted, packed (see the module docs). The only
/// copy of the weight a projection keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizedWeight {
    k: usize,
    n: usize,
    /// `panels × k_pairs × NR × 2` values; past `k` and past `n`, zeros.
    data: Vec<i16>,
}

impl QuantizedWeight {
    /// Packs `w: [k, n]` (row-major) int8 with zero points `zero_points`: one for the whole
    /// weight, or one per column (`n`).
    ///
    /// # Panics
    /// If `w` is not `k·n` long or `zero_points` is neither 1 nor `n` long.
    pub fn from_i8(w: &[i8], k: usize, n: usize, zero_points: &[i8]) -> QuantizedWeight {
        Self::pack(k, n, zero_points.len(), |p, j, z| {
            i16::from(w[p * n + j]) - i16::from(zero_points[z])
        })
    }

    /// [`QuantizedWeight::from_i8`] for a uint8 weight.
    ///
    /// # Panics
    /// As [`QuantizedWeight::from_i8`].
    pub fn from_u8(w: &[u8], k: usize, n: usize, zero_points: &[u8]) -> QuantizedWeight {
        Self::pack(k, n, zero_points.len(), |p, j, z| {
            i16::from(w[p * n + j]) - i16::from(zero_points[z])
        })
    }

    /// Packs `value(p, j, z)`, the element `(p, j)` minus zero point `z` (`0`, or `j` when there
    /// are `zero_points == n` of them).
    fn pack(
        k: usize,
        n: usize,
        zero_points: usize,
        value: impl Fn(usize, usize, usize) -> i16,
    ) -> QuantizedWeight {
        assert!(
            zero_points == 1 || zero_points == n,
            "{zero_points} zero points for {n} columns"
        );
        let per_column = zero_points == n && n != 1;
        let k_pairs = k.div_ceil(2);
        let panels = n.div_ceil(NR);
        let mut data = vec![0i16; panels * k_pairs * NR * 2];
        for p in 0..k {
            for j in 0..n {
                let (c, jj) = (j / NR, j % NR);
                let at = ((c * k_pairs + p / 2) * NR + jj) * 2 + p % 2;
                data[at] = value(p, j, if per_column { j } else { 0 });
            }
        }
        QuantizedWeight { k, n, data }
    }

    /// Rows (the reduced dimension).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns (output features).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Pairs of rows, `⌈k / 2⌉`.
    pub(crate) fn k_pairs(&self) -> usize {
        self.k.div_ceil(2)
    }

    /// Panel `c` (columns `c·NR..`): `k_pairs × NR × 2` values.
    pub(crate) fn panel(&self, c: usize) -> &[i16] {
        let len = self.k_pairs() * NR * 2;
        &self.data[c * len..(c + 1) * len]
    }

    /// Number of panels, `⌈n / NR⌉`.
    pub(crate) fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }
}
