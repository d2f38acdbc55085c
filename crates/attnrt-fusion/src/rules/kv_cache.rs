//! A decoder's key/value cache: the past keys and values joined to this step's on the sequence
//! axis before the products, and the joins returned as the model's `present`:
//!
//! ```text
//! K = Concat(past_key, k_new, axis = 2)      present_key   = K
//! V = Concat(past_value, v_new, axis = 2)    present_value = V
//! ```
//!
//! (4-D `[B, Hkv, L, D]`, before a grouped-query repeat.) The fused node then reads `k_new`,
//! `v_new`, `past_key`, `past_value` and produces both joins itself (ONNX `Attention` outputs 1
//! and 2, which the spec defines as exactly these concatenations), so the two `Concat`s go with
//! the block. Both K and V must have one, or neither is absorbed (the op takes past key and
//! value together). A join the fused node cannot take over is left in the graph, and the block
//! fuses reading the joined K and V, as without a cache; the report's tags say why.

use std::collections::HashSet;

use attnrt_onnx::{attr, node_label};

use super::k_transpose::KInput;
use super::placed::Placed;
use crate::graph::GraphView;
use crate::masks::MaskLayer;
use crate::mismatch::{Check, Mismatch};

/// The cache tensors of an absorbed join.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    /// The past keys `[B, Hkv, P, D]` (the join's first input).
    pub past_key: String,
    /// The past values.
    pub past_value: String,
    /// The joined keys (the join's output), which the fused node now produces.
    pub present_key: String,
    /// The joined values.
    pub present_value: String,
    /// This step's keys and values `[B, Hkv, L, D]` as the joins read them.
    pub new_key: String,
    /// This step's values.
    pub new_value: String,
    /// `Shape` nodes reading a join whose result the block's inputs are computed from (a
    /// causal mask sliced to the key length): the rewrite computes them from the past's and
    /// this step's shapes instead, as the fused node's outputs cannot feed its own inputs.
    pub shape_readers: Vec<usize>,
}

/// One join `Concat(past, new, axis = 2)` found above K or V.
struct Join {
    node: usize,
    past: String,
    new: String,
    output: String,
}

/// Absorbs the cache joins above K and V into the placed block: K and V become this step's
/// keys and values, the joins' nodes join the block. Returns a tag for the report when a
/// join exists but stays outside (and why), `None` otherwise.
pub fn absorb(view: &GraphView, p: &mut Placed) -> Option<String> {
    if p.k.perm.is_some() {
        return join_above(view, &p.k.source)
            .map(|_| "cache-concat kept (K is read transposed)".to_string());
    }
    let (kj, vj) = match (join_above(view, &p.k.source), join_above(view, &p.v)) {
        (None, None) => return None,
        (Some(k), Some(v)) => (k, v),
        _ => return Some("cache-concat kept (only one of K and V is joined)".into()),
    };
    if kj.output == vj.output {
        return Some("cache-concat kept (K and V are the same join)".into());
    }
    p.core.nodes.extend([kj.node, vj.node]);
    p.core.tags.push("kv-cache".into());
    p.k = KInput {
        source: kj.new.clone(),
        perm: None,
    };
    p.v = vj.new.clone();
    p.kv = Some(KvCache {
        past_key: kj.past,
        past_value: vj.past,
        present_key: kj.output,
        present_value: vj.output,
        new_key: kj.new,
        new_value: vj.new,
        shape_readers: Vec::new(),
    });
    None
}

/// The join `Concat(past, new, axis = 2)` of rank-4 tensors producing `t` (through
/// skip-through nodes, which then must have no other reader).
fn join_above(view: &GraphView, t: &str) -> Option<Join> {
    let (src, skipped) = view.skip_producers(t);
    if !skipped.is_empty() {
        return None;
    }
    let node = view.producer(&src)?;
    let n = view.node(node);
    if n.op_type != "Concat" || n.input.len() != 2 {
        return None;
    }
    let rank = view.rank(&src)?;
    let axis = attr::int(n, "axis").ok().flatten()?;
    if rank != 4 || !(axis == 2 || axis == -2) {
        return None;
    }
    Some(Join {
        node,
        past: n.input[0].clone(),
        new: n.input[1].clone(),
        output: src,
    })
}

/// The fused node produces the joins, so none of its inputs (Q, K, V and the tensors of the
/// `masks` it reads) may be computed from them (that would be a cycle), except through `Shape`
/// (recorded in `shape_readers` for the rewrite).
pub fn check_acyclic(
    view: &GraphView,
    p: &mut Placed,
    masks: &[MaskLayer],
) -> Result<(), Mismatch> {
    let Some(kv) = &p.kv else { return Ok(()) };
    let presents = [kv.present_key.as_str(), kv.present_value.as_str()];
    let mut pending: Vec<&str> = masks
        .iter()
        .flat_map(MaskLayer::tensors)
        .map(String::as_str)
        .collect();
    pending.extend([p.q.as_str(), p.k.source.as_str(), p.v.as_str()]);
    let mut seen: HashSet<&str> = HashSet::new();
    let mut shape_readers = Vec::new();
    while let Some(t) = pending.pop() {
        if !seen.insert(t) {
            continue;
        }
        if presents.contains(&t) {
            return Err(Mismatch::new(
                node_label(view.node(p.core.qk)),
                Check::KvCache,
                "block inputs computed without the joined cache (or only from its shape)",
                format!("an input of the block is computed from the joined cache '{t}'"),
            ));
        }
        let Some(q) = view.producer(t) else { continue };
        let n = view.node(q);
        if n.op_type == "Shape" && presents.contains(&n.input[0].as_str()) {
            shape_readers.push(q);
            continue;
        }
        pending.extend(n.input.iter().filter(|i| !i.is_empty()).map(String::as_str));
    }
    shape_readers.sort_unstable();
    shape_readers.dedup();
    // The rewrite replaces them (their outputs keep their names).
    p.core.nodes.extend(&shape_readers);
    if let Some(kv) = &mut p.kv {
        kv.shape_readers = shape_readers;
    }
    Ok(())
}
