//! The weight of an integer projection, packed once: each value minus its zero point, in panels
//! of [`NR`] columns whose rows are interleaved in pairs (`w[2p][j], w[2p+1][j]` side by side),
//! the layout `vpmaddwd` multiplies against a broadcast pair of activations (widened to i16 as
//! they are loaded).
//!
//! The values are kept as i8 when every one fits (int8 weights with zero points 0, what
//! `quantize_dynamic`'s symmetric `QInt8` writes), else as i16 (a difference of two int8 or
//! uint8 values lies in [−255, 255]). A decode step multiplies one row of activations by the
//! whole weight, so its time is the weight's bytes streamed from memory: i8 halves them.
//!
//! For a VNNI build ([`QuantKernel::is_vnni`]) narrow values are packed in quads instead: four
//! rows of a column side by side (`w[4q..4q+4][j]`), [`NR`] columns per 64 bytes, the layout
//! `vpdpbusd` multiplies against four broadcast u8 activations; the panels are padded with
//! zeros to a multiple of [`PANELS`] (one register tile's width), and each column's sum of
//! values is kept for the zero-point correction (see the module docs of `quant`).

use super::{QuantKernel, NR, PANELS};

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
    /// Narrow, in quads for VNNI, with the column sums.
    Quads(Vec<i8>, Vec<i32>),
}

/// A weight packed in quads (see the module docs): its panels, [`PANELS`] at a time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Quads<'a> {
    /// `⌈n / (NR·PANELS)⌉·PANELS` panels of `k_quads × NR × 4` values.
    pub values: &'a [i8],
    /// Per column (panels included, zeros past `n`): `Σ_p w'[p][j]`, wrapping.
    pub sums: &'a [i32],
    /// `⌈k / 4⌉`.
    pub k_quads: usize,
}

impl Quads<'_> {
    /// Values of one panel.
    pub fn panel_len(&self) -> usize {
        self.k_quads * NR * 4
    }
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
    /// weight, or one per column (`n`), in the layout `kernel` multiplies.
    ///
    /// # Panics
    /// If `w` is not `k·n` long or `zero_points` is neither 1 nor `n` long.
    pub fn from_i8(
        kernel: &QuantKernel,
        w: &[i8],
        k: usize,
        n: usize,
        zero_points: &[i8],
    ) -> QuantizedWeight {
        Self::pack(kernel, k, n, zero_points.len(), |p, j, z| {
            i16::from(w[p * n + j]) - i16::from(zero_points[z])
        })
    }

    /// [`QuantizedWeight::from_i8`] for a uint8 weight.
    ///
    /// # Panics
    /// As [`QuantizedWeight::from_i8`].
    pub fn from_u8(
        kernel: &QuantKernel,
        w: &[u8],
        k: usize,
        n: usize,
        zero_points: &[u8],
    ) -> QuantizedWeight {
        Self::pack(kernel, k, n, zero_points.len(), |p, j, z| {
            i16::from(w[p * n + j]) - i16::from(zero_points[z])
        })
    }

    /// Packs `value(p, j, z)`, the element `(p, j)` minus zero point `z` (`0`, or `j` when there
    /// are `zero_points == n` of them), for `kernel`.
    fn pack(
        kernel: &QuantKernel,
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
        let mut values = Vec::with_capacity(k * n);
        for p in 0..k {
            values.extend((0..n).map(|j| value(p, j, if per_column { j } else { 0 })));
        }
        let narrow = values.iter().all(|&v| i8::try_from(v).is_ok());
        let data = if narrow && kernel.is_vnni() {
            quads(&values, k, n)
        } else {
            pairs(&values, k, n, narrow)
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
            Values::Quads(..) => unreachable!("a weight in quads has no pair panels"),
        }
    }

    /// The panels in quads, if the weight is packed so.
    pub(crate) fn quads(&self) -> Option<Quads<'_>> {
        match &self.data {
            Values::Quads(values, sums) => Some(Quads {
                values,
                sums,
                k_quads: self.k.div_ceil(4),
            }),
            _ => None,
        }
    }

    /// Whether the values are packed as i8 (see the module docs).
    pub fn is_narrow(&self) -> bool {
        matches!(self.data, Values::Narrow(_) | Values::Quads(..))
    }

    /// Whether the values are packed in quads for a VNNI build (see the module docs).
    pub fn is_quads(&self) -> bool {
        matches!(self.data, Values::Quads(..))
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
            Values::Quads(v, sums) => v.len() + sums.len() * 4,
        }
    }
}

/// `values: [k, n]` in row pairs (see the module docs), as i8 if `narrow`.
fn pairs(values: &[i16], k: usize, n: usize, narrow: bool) -> Values {
    let k_pairs = k.div_ceil(2);
    let mut data = vec![0i16; n.div_ceil(NR) * k_pairs * NR * 2];
    for (p, row) in values.chunks_exact(n.max(1)).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            let (c, jj) = (j / NR, j % NR);
            data[((c * k_pairs + p / 2) * NR + jj) * 2 + p % 2] = v;
        }
    }
    if narrow {
        Values::Narrow(data.iter().map(|&v| v as i8).collect())
    } else {
        Values::Wide(data)
    }
}

/// `values: [k, n]`, each fitting i8, in quads with their column sums (see the module docs).
fn quads(values: &[i16], k: usize, n: usize) -> Values {
    let k_quads = k.div_ceil(4);
    let panels = n.div_ceil(NR).next_multiple_of(PANELS);
    let mut data = vec![0i8; panels * k_quads * NR * 4];
    let mut sums = vec![0i32; panels * NR];
    for (p, row) in values.chunks_exact(n.max(1)).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            let (c, jj) = (j / NR, j % NR);
            data[((c * k_quads + p / 4) * NR + jj) * 4 + p % 4] = v as i8;
            sums[j] = sums[j].wrapping_add(i32::from(v));
        }
    }
    Values::Quads(data, sums)
}
