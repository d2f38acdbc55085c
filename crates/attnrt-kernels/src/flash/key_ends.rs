//! How far each query row's keys reach under its mask, so that a task never visits the key
//! blocks after the last key any of its rows can see — what the causal frontier does for
//! `is_causal`, for masks that carry the triangle themselves (a causal mask with padding, kept
//! as one additive mask because its fill is finite; see `attnrt-fusion`'s causal proof).
//!
//! Exact: a mask value at or below [`FILL`] (`−inf`, or a fill as large as transformers'
//! `finfo(float32).min`) puts the key more than 1e29 below any key whose value is above it, so
//! its weight is exactly 0 in float32 whenever the row has such a key. A row with no key above
//! [`FILL`] (a padding query of a left-padded batch) spreads its weight over its filled keys in
//! the graph: it keeps every key. A boolean row ends after its last `true` (a row of `false`
//! gives zeros, visiting nothing).

use crate::{Mask, View4};

/// Mask values at or below this remove a key from every row that has a key above it.
pub(crate) const FILL: f32 = -1.0e30;

/// Per mask row (batch, head, query; broadcast axes of extent 1), the end of its visible keys.
pub(crate) struct KeyEnds {
    ends: Vec<u32>,
    /// Extents of the mask's batch, head and query axes (1 where it broadcasts).
    extents: [usize; 3],
}

impl KeyEnds {
    /// The key ends of `mask` (effective strides `st`), or `None` when no key block could be
    /// skipped anyway: no mask, keys broadcast from one value, or at most `block` live keys.
    pub(crate) fn of(mask: &Mask, st: [isize; 4], live_keys: usize, block: usize) -> Option<Self> {
        if st[3] == 0 || live_keys <= block {
            return None;
        }
        match mask {
            Mask::None => None,
            Mask::Additive(m) => Some(Self::scan(m, st, live_keys, |x| !(*x <= FILL), live_keys)),
            Mask::Boolean(m) => Some(Self::scan(m, st, live_keys, |x| *x, 0)),
        }
    }

    /// Scans every stored row from its end for the last key `visible` accepts; a row with none
    /// ends at `none`.
    fn scan<T>(
        m: &View4<T>,
        st: [isize; 4],
        live_keys: usize,
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
                    let end = (0..keys)
                        .rev()
                        .find(|&j| visible(at(j)))
                        .map_or(none, |j| j + 1);
                    ends.push(end as u32);
                }
            }
        }
        KeyEnds { ends, extents }
    }

    /// The end of the keys that query `i` of q-head `h` of batch `b` may see.
    pub(crate) fn end(&self, b: usize, h: usize, i: usize) -> usize {
        let [nb, nh, nq] = self.extents;
        let (b, h, i) = (b.min(nb - 1), h.min(nh - 1), i.min(nq - 1));
        self.ends[(b * nh + h) * nq + i] as usize
    }
}
