//! Batched 3-D attention, as `nn.MultiheadAttention` exports it: the packed projection split
//! and reshaped seq-first to `(B·h, L, d)`, then
//!
//! ```text
//! MatMul(Softmax(MatMul(Q3, Kᵀ3) · s), V3)          Q3, K3, V3: (N, L, d), N = B·h
//! ```
//!
//! Heads are independent, so the rewrite runs it as 4-D attention with batch 1 and N heads
//! (`Unsqueeze` before, `Squeeze` after); the projections around it stay as they are.

use attnrt_onnx::node_label;

use super::core::Core;
use super::k_transpose::KInput;
use super::placed::{Layout, Placed, Shapes};
use crate::graph::{shape_str, GraphView};
use crate::mismatch::{Check, Mismatch};

/// Places a rank-3 core: Q, K and V must share their first dim.
pub fn place(view: &GraphView, mut core: Core, k: KInput, s: &Shapes) -> Result<Placed, Mismatch> {
    let k_shape = s.k();
    if !(s.q[0] == k_shape[0] && s.q[0] == s.v[0]) {
        return Err(Mismatch::new(
            node_label(view.node(core.qk)),
            Check::Batch,
            "one batch (first) dim of Q, K and V",
            format!(
                "batched Q {}, K {}, V {}: first dims not provably equal",
                shape_str(&s.q),
                shape_str(&k_shape),
                shape_str(&s.v)
            ),
        ));
    }
    core.tags.push("batched-3d".into());
    Ok(Placed {
        q: core.q.clone(),
        k,
        v: core.v.clone(),
        output: core.output.clone(),
        layout: Layout::Batched,
        heads: (None, None),
        core,
        kv: None,
    })
}
