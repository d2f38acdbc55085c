//! What a mask does to each tile of the kernel, read once per call: how far each query row's
//! keys reach (a task never visits the key blocks after the last key any of its rows can see —
//! what the causal frontier does for `is_causal`), and which tiles the mask leaves unchanged (all
//! zeros: the mask is not read there). Together they let a mask that carries the causal triangle
//! itself (a causal mask with padding, kept as one additive mask because its fill is finite; see
//! `attnrt-fusion`'s causal proof) cost about what `is_causal` costs.
//!
//! Exact: a mask value at or below [`FILL`] (`−inf`, or a fill as large as transformers'
//! `finfo(float32).min`) puts the key more than 1e29 below any key whose value is above it, so
//! its weight is exactly 0 in float32 whenever the row has such a key. A row with no key above
//! [`FILL`] (a padding query of a left-padded batch) spreads its weight over its filled keys in
//! the graph: it keeps every key. A boolean row ends after its last `true` (a row of `false`
//! gives zeros, visiting nothing). Adding ±0 leaves a score as it is.

use crate::problem::Mask;
use crate::view::View4;

/// Mask values at or below this remove a key from every row that has a key above it.
pub(crate) const FILL: f32 = -1.0e30;

/// Per mask row (batch, head, query; broadcast axes of extent 1), the end of its visible keys,
/// and per tile of `BQ` rows × `BK` keys whether an additive mask is all zeros there.
pub(crate) struct KeyEnds {
    ends: Vec<u32>,
    /// Extents of the mask's batch, head and query axes (1 where it broadcasts).
    extents: [usize; 3],
    /// `(bq, bk)` of the tiles, and per (batch, head, query block, key block) whether the mask
    /// is all zeros there (empty when not computed).
    tile: (usize, usize),
    zero: Vec<bool>,
    key_blocks: usize,
}

impl KeyEnds {
    /// The key ends (and zero tiles) of `mask` (effective strides `st`) for tiles of `bq`
    /// queries × `bk` keys, or `None` when nothing could be skipped anyway: no mask, keys
    /// broadcast from one value, or at most `bk` live keys.
    pub(crate) fn of(
        mask: &Mask,
        st: [isize; 4],
        live_keys: usize,
        (bq, bk): (usize, usize),
    ) -> Option<Self> {
        if st[3] == 0 || live_keys <= bk {
            return None;
        }
        // `!(x <= FILL)`, not `x > FILL`: a NaN in the mask is a live key (its row must turn NaN).
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let mut ends = match mask {
            Mask::None => return None,
            Mask::Additive(m) => Self::scan(m, st, live_keys, bk, |x| !(*x <= FILL), live_keys),
            Mask::Boolean(m) => Self::scan(m, st, live_keys, bk, |x| *x, 0),
        };
        if let Mask::Additive(m) = mask {
            if st[2] != 0 && st[3] == 1 {
                ends.zero_tiles(m, st, live_keys, (bq, bk));
            }
        }
        Some(ends)
    }

    /// Scans every stored row, a key block at a time, for the last block holding a key that
    /// `visible` accepts; a row with none ends at `none`. Ends are rounded up to whole blocks
    /// (the rest of a block is filled keys, which weigh 0 next to a visible one).
    fn scan<T>(
        m: &View4<T>,
        st: [isize; 4],
        live_keys: usize,
        bk: usize,
        visible: impl Fn(&T) -> bool,
        none: usize,
    ) -> Self {
        let extent = |a: usize| if st[a] == 0 { 1 } else { m.dims[a] };
        let extents = [extent(0), extent(1), extent(2)];
        let keys = m.dims[3].min(live_keys);
        let mut ends = Vec::with_capacity(extents.iter().product());
        for b in 0..extents[0] {
            for h in 0..extents[1] {
                for i in 0..extents[2] {
                    let row = b as isize * st[0] + h as isize * st[1] + i as isize * st[2];
                    // Offsets are in bounds: the view was validated against its buffer.
                    let at = |j: usize| &m.data[(row + j as isize * st[3]) as usize];
                    let block_visible = |kb: usize| {
                        let (j0, j1) = (kb * bk, ((kb + 1) * bk).min(keys));
                        if st[3] == 1 {
                            // Contiguous: a branch-free OR over the block's slice (vectorized).
                            let run = &m.data[row as usize + j0..row as usize + j1];
                            run.iter().fold(false, |a, x| a | visible(x))
                        } else {
                            (j0..j1).fold(false, |a, j| a | visible(at(j)))
                        }
                    };
                    let last = (0..keys.div_ceil(bk)).rev().find(|&kb| block_visible(kb));
                    let end = last.map_or(none, |kb| ((kb + 1) * bk).min(live_keys));
                    ends.push(end as u32);
                }
            }
        }
        KeyEnds {
            ends,
            extents,
            tile: (1, bk),
            zero: Vec::new(),
            key_blocks: 0,
        }
    }

    /// Marks the tiles where an additive mask with contiguous rows is ±0 everywhere.
    fn zero_tiles(
        &mut self,
        m: &View4<f32>,
        st: [isize; 4],
        live_keys: usize,
        tile: (usize, usize),
    ) {
        let (bq, bk) = tile;
        let [nb, nh, nq] = self.extents;
        let keys = m.dims[3].min(live_keys);
        let (qblocks, kblocks) = (nq.div_ceil(bq), keys.div_ceil(bk));
        let mut zero = vec![true; nb * nh * qblocks * kblocks];
        for b in 0..nb {
            for h in 0..nh {
                for i in 0..nq {
                    let row =
                        (b as isize * st[0] + h as isize * st[1] + i as isize * st[2]) as usize;
                    let data = &m.data[row..row + keys];
                    let base = ((b * nh + h) * qblocks + i / bq) * kblocks;
                    for (kb, chunk) in data.chunks(bk).enumerate() {
                        // An OR of the bits without the sign: 0 exactly for a run of ±0.
                        let bits = chunk
                            .iter()
                            .fold(0u32, |a, x| a | (x.to_bits() & 0x7fff_ffff));
                        zero[base + kb] &= bits == 0;
                    }
                }
            }
        }
        self.tile = tile;
        self.zero = zero;
        self.key_blocks = kblocks;
    }

    /// The end of the keys that query `i` of q-head `h` of batch `b` may see.
    pub(crate) fn end(&self, b: usize, h: usize, i: usize) -> usize {
        let [nb, nh, nq] = self.extents;
        let (b, h, i) = (b.min(nb - 1), h.min(nh - 1), i.min(nq - 1));
        self.ends[(b * nh + h) * nq + i] as usize
    }

    /// Whether the mask is all zeros on the tile of queries from `i0` (a multiple of the tile's
    /// `bq`) and keys from `j0` (a multiple of its `bk`), so that adding it changes nothing.
    pub(crate) fn zero_tile(&self, b: usize, h: usize, i0: usize, j0: usize) -> bool {
        if self.zero.is_empty() {
            return false;
        }
        let [nb, nh, nq] = self.extents;
        let (bq, bk) = self.tile;
        let qblocks = nq.div_ceil(bq);
        let (b, h) = (b.min(nb - 1), h.min(nh - 1));
        let (qb, kb) = (i0 / bq, j0 / bk);
        qb < qblocks
            && kb < self.key_blocks
            && self.zero[((b * nh + h) * qblocks + qb) * self.key_blocks + kb]
    }
}
