//! A generation's key/value cache, held once and appended to in place.
//!
//! Without it every decode step rebuilds the cache: the fused attention reads `past_*` and
//! writes a fresh `present_*` = past ++ current, which becomes the next step's past (on a 125M
//! decoder at past 1024, 25 MB written and read again per row and step besides the
//! attention's own reads). With a [`KvStore`] given to a run ([`crate::Session::run_owned_in`]),
//! every `Attention` node in *store mode* (the `attnrt_kv_store` attribute, set by the
//! generation on the nodes it proved own the cache) appends its step's keys and values to its
//! slot here and attends over the slot's rows through strided views; its `past_*` inputs and
//! `present_*` outputs are zero-byte stand-ins `[batch, kv_heads, length, 0]` that carry the
//! length for the graph's own shape logic (masks, positions).
//!
//! A slot is one node's K and V, each laid out `[batch, kv_heads, capacity, head]` (f32), with
//! its valid length. A step whose past length differs from the slot's is refused (a stale
//! store), never served from the wrong rows. Slots grow by reallocation when the capacity given
//! at creation is exceeded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use attnrt_kernels::{append_rows, append_rows_here, ThreadPolicy, View4};
use tract_onnx::prelude::Tensor;

/// What a store refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvStoreError {
    /// The step's past length is not the number of positions the slot holds.
    Stale {
        /// The node whose slot it is.
        node: String,
        /// Positions the slot holds.
        holds: usize,
        /// The step's past length.
        past: usize,
    },
    /// The step's keys or values do not have the slot's batch, heads or head size.
    Geometry {
        /// The node whose slot it is.
        node: String,
        /// `[batch, kv_heads, head, v_head]` of the slot.
        slot: [usize; 4],
        /// The same of the step.
        step: [usize; 4],
    },
}

impl std::fmt::Display for KvStoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvStoreError::Stale { node, holds, past } => write!(
                f,
                "the in-place cache of node '{node}' holds {holds} position(s) but the step's \
                 past has {past}: the cache is stale (a step skipped or run twice)"
            ),
            KvStoreError::Geometry { node, slot, step } => write!(
                f,
                "the in-place cache of node '{node}' is [batch, kv_heads, head, v_head] = \
                 {slot:?}, the step's keys and values are {step:?}"
            ),
        }
    }
}

impl std::error::Error for KvStoreError {}

/// The in-place caches of one generation, one slot per store-mode `Attention` node (see the
/// module docs). Shared by reference with the runs of the generation's steps.
#[derive(Debug)]
pub struct KvStore {
    /// Positions a new slot has room for.
    capacity: usize,
    slots: Mutex<HashMap<String, Arc<Mutex<KvSlot>>>>,
}

/// One node's keys and values (see the module docs).
#[derive(Debug, Default)]
pub struct KvSlot {
    /// `[batch, kv_heads, head, v_head]`.
    geometry: [usize; 4],
    capacity: usize,
    len: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KvStore {
    /// An empty store whose slots are made with room for `capacity` positions (the longest
    /// prompt plus the tokens to generate).
    pub fn new(capacity: usize) -> KvStore {
        KvStore {
            capacity: capacity.max(1),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The slot of `node`, made empty on first use.
    pub fn slot(&self, node: &str) -> Arc<Mutex<KvSlot>> {
        let mut slots = lock(&self.slots);
        // (found without making the name a `String`: every step of every store-mode node asks)
        if let Some(slot) = slots.get(node) {
            return Arc::clone(slot);
        }
        Arc::clone(slots.entry(node.to_string()).or_default())
    }

    /// Fills the empty slot of `node` with a first step's keys `[B, Hkv, L, D]` and values
    /// `[B, Hkv, L, Dv]` made as tensors (a merged decoder's no-cache branch makes them without
    /// the fused attention).
    pub fn fill(&self, node: &str, key: &Tensor, value: &Tensor) -> anyhow::Result<()> {
        let (k, v) = (key.cast_to::<f32>()?, value.cast_to::<f32>()?);
        let slot = self.slot(node);
        let mut slot = lock(&slot);
        slot.append(
            node,
            0,
            self.capacity,
            &tensor_view(&k)?,
            &tensor_view(&v)?,
            None,
        )?;
        Ok(())
    }

    /// Each slot's valid length, to [`KvStore::rewind`] to after a run that failed part way.
    pub fn lengths(&self) -> Vec<(String, usize)> {
        lock(&self.slots)
            .iter()
            .map(|(node, s)| (node.clone(), lock(s).len))
            .collect()
    }

    /// Sets the slots' lengths back to `lengths` (from [`KvStore::lengths`]); slots made since
    /// are emptied. The rows beyond are ignored, then overwritten.
    pub fn rewind(&self, lengths: &[(String, usize)]) {
        for (node, slot) in lock(&self.slots).iter() {
            let len = lengths.iter().find(|(n, _)| n == node).map_or(0, |l| l.1);
            let mut slot = lock(slot);
            slot.len = slot.len.min(len);
        }
    }

    /// The bytes the slots hold (their capacity).
    pub fn bytes(&self) -> usize {
        lock(&self.slots)
            .values()
            .map(|s| {
                let s = lock(s);
                (s.k.len() + s.v.len()) * std::mem::size_of::<f32>()
            })
            .sum()
    }

    /// Positions a new slot has room for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl KvSlot {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no position.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a step's keys `[B, Hkv, L, D]` and values `[B, Hkv, L, Dv]` at positions
    /// `past..past + L` of `node`'s slot: `past` must be the length held. A slot holding
    /// nothing takes the step's geometry, with room for `capacity` positions (or `past + L`).
    /// The rows are copied on the current pool by `threads`, or on the calling thread alone
    /// without (a caller outside the session's pool).
    pub fn append(
        &mut self,
        node: &str,
        past: usize,
        capacity: usize,
        k: &View4<f32>,
        v: &View4<f32>,
        threads: Option<&ThreadPolicy>,
    ) -> Result<(), KvStoreError> {
        if self.len != past {
            return Err(KvStoreError::Stale {
                node: node.to_string(),
                holds: self.len,
                past,
            });
        }
        let [batch, heads, rows, head] = k.dims;
        let step = [batch, heads, head, v.dims[3]];
        if v.dims[..3] != k.dims[..3] || (self.capacity > 0 && step != self.geometry) {
            let slot = if self.capacity > 0 {
                self.geometry
            } else {
                step
            };
            return Err(KvStoreError::Geometry {
                node: node.to_string(),
                slot,
                step: [v.dims[0], v.dims[1], head, v.dims[3]],
            });
        }
        if self.capacity == 0 {
            self.geometry = step;
        }
        self.reserve((past + rows).max(capacity));
        for (buffer, rows) in [(&mut self.k, k), (&mut self.v, v)] {
            match threads {
                Some(threads) => append_rows(threads, rows, buffer, self.capacity, past),
                None => append_rows_here(rows, buffer, self.capacity, past),
            }
        }
        self.len = past + rows;
        Ok(())
    }

    /// Room for `positions` positions, the rows held copied into the larger buffers.
    fn reserve(&mut self, positions: usize) {
        if positions <= self.capacity {
            return;
        }
        let [batch, heads, head, v_head] = self.geometry;
        let grow = |old: &[f32], d: usize| -> Vec<f32> {
            let mut new = vec![0.0; batch * heads * positions * d];
            if self.len > 0 {
                for bh in 0..batch * heads {
                    let from = &old[bh * self.capacity * d..][..self.len * d];
                    new[bh * positions * d..][..self.len * d].copy_from_slice(from);
                }
            }
            new
        };
        self.k = grow(&self.k, head);
        self.v = grow(&self.v, v_head);
        self.capacity = positions;
    }

    /// The keys and values held, `[B, Hkv, len, D]` and `[B, Hkv, len, Dv]` (strided: a head
    /// is `capacity` rows apart).
    pub fn views(&self) -> Result<(View4<'_, f32>, View4<'_, f32>), attnrt_kernels::KernelError> {
        let [_, _, head, v_head] = self.geometry;
        Ok((self.view(&self.k, head)?, self.view(&self.v, v_head)?))
    }

    fn view<'s>(
        &self,
        data: &'s [f32],
        d: usize,
    ) -> Result<View4<'s, f32>, attnrt_kernels::KernelError> {
        let [batch, heads, _, _] = self.geometry;
        let dims = [batch, heads, self.len, d];
        let (cap, d) = (self.capacity as isize, d as isize);
        View4::new(data, dims, [heads as isize * cap * d, cap * d, d, 1])
    }
}

/// A 4-D f32 tensor as a view.
fn tensor_view(t: &Tensor) -> anyhow::Result<View4<'_, f32>> {
    let shape = t.shape();
    let dims = shape
        .try_into()
        .map_err(|_| anyhow::anyhow!("a present {shape:?} is not 4-D"))?;
    Ok(View4::contiguous(
        t.try_as_plain_ram()?.as_slice::<f32>()?,
        dims,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(batch: usize, heads: usize, len: usize, d: usize, from: f32) -> Vec<f32> {
        (0..batch * heads * len * d)
            .map(|i| from + i as f32)
            .collect()
    }

    #[test]
    fn appended_rows_are_read_back_in_order_across_a_growth() {
        let store = KvStore::new(2);
        let slot = store.slot("n");
        let mut slot = lock(&slot);
        let (a, b) = (rows(2, 3, 2, 4, 0.0), rows(2, 3, 1, 4, 1000.0));
        let va = View4::contiguous(&a[..], [2, 3, 2, 4]).unwrap();
        let vb = View4::contiguous(&b[..], [2, 3, 1, 4]).unwrap();
        slot.append("n", 0, 2, &va, &va, None).unwrap();
        slot.append("n", 2, 2, &vb, &vb, None).unwrap(); // beyond the capacity: grows
        let (k, _) = slot.views().unwrap();
        assert_eq!(k.dims, [2, 3, 3, 4]);
        for bh in 0..6 {
            for t in 0..3 {
                for i in 0..4 {
                    let at = (bh as isize / 3) * k.strides[0]
                        + (bh as isize % 3) * k.strides[1]
                        + t as isize * k.strides[2]
                        + i as isize;
                    let want = if t < 2 {
                        a[(bh * 2 + t) * 4 + i]
                    } else {
                        b[bh * 4 + i]
                    };
                    assert_eq!(k.data[at as usize], want, "bh {bh} t {t} i {i}");
                }
            }
        }
    }

    #[test]
    fn a_stale_past_or_another_geometry_is_refused_and_rewind_undoes_a_step() {
        let store = KvStore::new(8);
        let a = rows(1, 2, 3, 4, 0.0);
        let va = View4::contiguous(&a[..], [1, 2, 3, 4]).unwrap();
        let slot = store.slot("n");
        lock(&slot).append("n", 0, 8, &va, &va, None).unwrap();
        let before = store.lengths();
        let err = lock(&slot).append("n", 2, 8, &va, &va, None).unwrap_err();
        assert_eq!(
            err,
            KvStoreError::Stale {
                node: "n".into(),
                holds: 3,
                past: 2
            }
        );
        assert!(err.to_string().contains("node 'n' holds 3 position(s)"));
        let wide = View4::contiguous(&a[..], [1, 1, 3, 8]).unwrap();
        assert!(matches!(
            lock(&slot).append("n", 3, 8, &wide, &wide, None),
            Err(KvStoreError::Geometry { .. })
        ));
        lock(&slot).append("n", 3, 8, &va, &va, None).unwrap();
        assert_eq!(lock(&slot).len(), 6);
        store.rewind(&before);
        assert_eq!(lock(&slot).len(), 3);
        assert_eq!(store.bytes(), 2 * 2 * 8 * 4 * 4);
    }
}
