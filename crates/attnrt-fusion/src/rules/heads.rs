//! 4-D attention `[B, H, L, D]`: K and V before a grouped-query repeat ([`super::gqa`]), one
//! batch for Q, K and V, and heads that match:
//!
//! ```text
//! H_q = H_kv  |  H_kv = 1  |  H_q = n · H_kv after an un-repeated GQA repeat
//! ```
//!
//! then a decoder's cache joins taken over ([`super::kv_cache`]), then the 3-D layout when
//! the head split and merge around the core can be absorbed ([`super::three_d`]).

use attnrt_onnx::node_label;

use super::core::Core;
use super::gqa;
use super::k_transpose::KInput;
use super::kv_cache;
use super::placed::{Layout, Placed, Shapes};
use super::three_d;
use crate::graph::{shape_str, GraphView};
use crate::mismatch::{Check, Mismatch};

/// Places a rank-4 core: grouped-query un-repeat, heads, the cache joins (when
/// `absorb_cache`), then the 3-D layout when possible.
pub fn place(
    view: &GraphView,
    mut core: Core,
    k: KInput,
    s: &Shapes,
    absorb_cache: bool,
) -> Result<Placed, Mismatch> {
    let at = node_label(view.node(core.qk));
    let refuse = |check, expected: &str, found: String| Mismatch::new(&at, check, expected, found);
    let (mut k, mut v) = (k, core.v.clone());
    let (mut k4, mut v4) = (s.k(), s.v.clone());
    if let Some((kv, vv)) = gqa::before_repeat(view, &k, &v) {
        let (Some(ks), Some(vs)) = (view.shape(&kv.source), view.shape(&vv)) else {
            return Err(refuse(
                Check::Shapes,
                "known shapes of K/V before the repeat",
                "shapes of K/V before the GQA repeat unknown".into(),
            ));
        };
        (k4, v4) = (ks.to_vec(), vs.to_vec());
        (k, v) = (kv, vv);
        core.tags.push("gqa".into());
    }
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
    let unrepeated = core.tags.iter().any(|t| t == "gqa");
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
    let output = core.output.clone();
    let mut placed = Placed {
        q: core.q.clone(),
        k,
        v,
        output,
        layout: Layout::FourD,
        heads,
        core,
        kv: None,
    };
    if absorb_cache {
        if let Some(kept) = kv_cache::absorb(view, &mut placed) {
            placed.core.tags.push(kept);
        }
    }
    // The joined and this step's V have the same heads and head size: the merge's check
    // holds for either.
    three_d::absorb(view, &mut placed, qs, &v4);
    Ok(placed)
}
