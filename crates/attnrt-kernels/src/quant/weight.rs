//! The weight of an integer projection, packed once: each value minus its zero point, in panels
//! of [`NR`] columns whose rows are interleaved in pairs (`w[2p][j], w[2p+1][j]` side by side),
//! the layout `vpmaddwd` multiplies against a broadcast pair of activations (widened to i16 as
//! they are loaded).
//!
//! The values are kept as i8 when every one fits (int8 weights with zero points 0, what
//! `quantize_dynamic`'s symmetric `QInt8` writes), else as i16 (a difference of two int8 or
//! uint8 values lies in [−255, 255]). A decode step multiplies one row of activations by the
//! whole weight, so its time is the weight's bytes streamed from memory: i8 halves them.

use super::NR;

/// A `[K, N]` weight with its zero points subtracted, packed (see the module docs). The only
/// copy of the weight a projection keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizedWeight {
    k: usize,
    n: usize,
    /// `panels × k_pairs × NR × 2` values; past `k` and past `n`, zeros.
    data: Values,
}

/// The packed values, narrow when they all fit i8 (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Values {
    Narrow(Vec<i8>),
    Wide(Vec<i16>),
}

/// One panel's values (`k_pairs × NR × 2`), as packed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Panel<'a> {
    /// Every value fits i8.
    Narrow(&'a [i8]),
    /// Some value needs i16.
    Wide(&'a [i16]),
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
        let data = if data.iter().all(|&v| i8::try_from(v).is_ok()) {
            Values::Narrow(data.iter().map(|&v| v as i8).collect())
        } else {
            Values::Wide(data)
        };
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
    pub(crate) fn panel(&self, c: usize) -> Panel<'_> {
        let len = self.k_pairs() * NR * 2;
        let at = c * len..(c + 1) * len;
        match &self.data {
            Values::Narrow(v) => Panel::Narrow(&v[at]),
            Values::Wide(v) => Panel::Wide(&v[at]),
        }
    }

    /// Whether the values are packed as i8 (see the module docs).
    pub fn is_narrow(&self) -> bool {
        matches!(self.data, Values::Narrow(_))
    }

    /// Number of panels, `⌈n / NR⌉`.
    pub(crate) fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match &self.data {
            Values::Narrow(v) => v.len(),
            Values::Wide(v) => v.len() * 2,
        }
    }
}
