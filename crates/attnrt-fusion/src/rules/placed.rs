//! The values handed between the placement stages: the static shapes of Q, Kᵀ and V, and a
//! core with its operands placed in a layout.

use attnrt_onnx::node_label;

use super::core::Core;
use super::k_transpose::KInput;
use super::kv_cache::KvCache;
use crate::graph::{shape_str, Dim, GraphView};
use crate::mismatch::{Check, Mismatch};

/// The attention layout the fused node will use.
#[derive(Clone, Debug, PartialEq)]
pub enum Layout {
    /// 4-D Q/K/V `[B, H, L, D]`.
    FourD,
    /// 3-D Q/K/V `[B, L, H·D]` (head split and merge absorbed).
    ThreeD {
        /// Query heads.
        q_heads: i64,
        /// Key/value heads.
        kv_heads: i64,
    },
    /// 3-D batched `(N, L, d)` MatMuls (nn.MultiheadAttention): wrapped as 4-D with B = 1.
    Batched,
}

/// The static shapes of Q, Kᵀ and V as the products read them (all rank 3 or all rank 4).
#[derive(Clone, Debug)]
pub struct Shapes {
    /// Q.
    pub q: Vec<Dim>,
    /// Kᵀ.
    pub kt: Vec<Dim>,
    /// V.
    pub v: Vec<Dim>,
}

impl Shapes {
    /// The shapes of Q, Kᵀ and V, which must be known and all of rank 4 (or all of rank 3).
    pub fn of(view: &GraphView, core: &Core) -> Result<Shapes, Mismatch> {
        let at = node_label(view.node(core.qk));
        let (Some(q), Some(kt), Some(v)) = (
            view.shape(&core.q),
            view.shape(&core.kt),
            view.shape(&core.v),
        ) else {
            return Err(Mismatch::new(
                at,
                Check::Shapes,
                "known shapes of Q, Kᵀ and V",
                "shapes of Q, Kᵀ or V are unknown (cannot prove the layout)",
            ));
        };
        let rank = q.len();
        if !(rank == 3 || rank == 4) || kt.len() != rank || v.len() != rank {
            return Err(Mismatch::new(
                at,
                Check::Rank,
                "Q, Kᵀ and V all rank 4 (or all rank 3)",
                format!(
                    "Q {}, Kᵀ {}, V {}: expected all rank 4 (or all rank 3)",
                    shape_str(q),
                    shape_str(kt),
                    shape_str(v)
                ),
            ));
        }
        Ok(Shapes {
            q: q.to_vec(),
            kt: kt.to_vec(),
            v: v.to_vec(),
        })
    }

    /// The rank of Q, K and V.
    pub fn rank(&self) -> usize {
        self.q.len()
    }

    /// K's shape: Kᵀ's with the last two axes swapped.
    pub fn k(&self) -> Vec<Dim> {
        let mut s = self.kt.clone();
        let r = s.len();
        s.swap(r - 2, r - 1);
        s
    }
}

/// A core with its operands placed: what the fused node reads and writes, in which layout.
#[derive(Clone, Debug)]
pub struct Placed {
    /// The core (its nodes include absorbed cache joins and head merge).
    pub core: Core,
    /// Q as the fused node reads it.
    pub q: String,
    /// K as the fused node reads it.
    pub k: KInput,
    /// V as the fused node reads it.
    pub v: String,
    /// The tensor the fused node writes.
    pub output: String,
    /// The layout.
    pub layout: Layout,
    /// Heads of Q and K/V, when known.
    pub heads: (Option<i64>, Option<i64>),
    /// The cache joins the fused node takes over (K and V are then this step's).
    pub kv: Option<KvCache>,
}
