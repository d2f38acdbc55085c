//! 4-D attention `[B, H, L, D]`: K and V as the fused node reads them (before a grouped-query
//! repeat when [`super::gqa`] found one), one batch for Q, K and V, and heads that match:
//!
//! ```text
//! H_q = H_kv  |  H_kv = 1  |  H_q = n · H_kv after an un-repeated GQA repeat
//! ```

use attnrt_onnx::node_label;

use super::core::Core;
use super::gqa::BeforeRepeat;
use super::k_transpose::KInput;
use super::placed::Shapes;
use crate::graph::{shape_str, Dim, GraphView};
use crate::mismatch::{Check, Mismatch};

/// K and V of a 4-D block as the fused node reads them, with their proven heads.
#[derive(Clone, Debug)]
pub struct KvOperands {
    /// K (before the repeat, when un-repeated).
    pub k: KInput,
    /// V (before the repeat, when un-repeated).
    pub v: String,
    /// V's shape `[B, Hkv, L, Dv]`.
    pub v_shape: Vec<Dim>,
    /// Heads of Q and K/V, when known.
    pub heads: (Option<i64>, Option<i64>),
    /// Whether K and V are read before a grouped-query repeat.
    pub unrepeated: bool,
}

/// Checks batch and heads of a rank-4 core whose K is `k` (as [`super::k_transpose`] found
/// it), reading K and V before their repeat when `repeat` is given.
pub fn check(
    view: &GraphView,
    core: &Core,
    k: KInput,
    s: &Shapes,
    repeat: Option<BeforeRepeat>,
) -> Result<KvOperands, Mismatch> {
    let at = node_label(view.node(core.qk));
    let refuse = |check, expected: &str, found: String| Mismatch::new(&at, check, expected, found);
    let unrepeated = repeat.is_some();
    let (k, v, k4, v4) = match repeat {
        None => (k, core.v.clone(), s.k(), s.v.clone()),
        Some(r) => {
            let (Some(ks), Some(vs)) = (view.shape(&r.k.source), view.shape(&r.v)) else {
                return Err(refuse(
                    Check::Shapes,
                    "known shapes of K/V before the repeat",
                    "shapes of K/V before the GQA repeat unknown".into(),
                ));
            };
            (r.k, r.v, ks.to_vec(), vs.to_vec())
        }
    };
    let qs = &s.q;
    if !(qs[0] == k4[0] && qs[0] == v4[0]) {
        return Err(refuse(
            Check::Batch,
            "one batch size",
            format!(
                "batch of Q {}, K {}, V {} not provably equal",
                shape_str(qs),
                shape_str(&k4),
                shape_str(&v4)
            ),
        ));
    }
    if k4[1] != v4[1] {
        return Err(refuse(
            Check::Heads,
            "K and V with the same heads",
            format!(
                "K {} and V {} have different heads",
                shape_str(&k4),
                shape_str(&v4)
            ),
        ));
    }
    let heads = (qs[1].as_known(), k4[1].as_known());
    // Without a recognised repeat, MatMul broadcasting allows only equal heads or one K/V
    // head; after un-repeating, the Q heads are a multiple of the K/V heads.
    let heads_ok = qs[1] == k4[1]
        || k4[1].is(1)
        || (unrepeated && matches!(heads, (Some(a), Some(b)) if b > 0 && a % b == 0));
    if !heads_ok {
        return Err(refuse(
            Check::Heads,
            "equal heads, one K/V head, or Q heads a multiple of the K/V heads after a repeat",
            format!(
                "heads of Q {} and K {} do not match (nor divide for GQA)",
                shape_str(qs),
                shape_str(&k4)
            ),
        ));
    }
    Ok(KvOperands {
        k,
        v,
        v_shape: v4,
        heads,
        unrepeated,
    })
}
