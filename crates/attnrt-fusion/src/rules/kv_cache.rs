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
//! fuses reading the joined K and V, as without a cache; the report's tags say why ([`Kept`]).
//!
//! Two stages of the pipeline (`rules/mod.rs`): [`joins`] finds the joins above K and V, and
//! once the block that reads this step's K and V is matched, [`takeover`] says whether the
//! fused node can produce them (no input of the block is computed from them) — the pipeline
//! then takes that block, or the one reading the joined K and V.

use std::collections::HashSet;

use attnrt_onnx::attr;

use super::k_transpose::KInput;
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

/// Why a decoder's cache joins stay outside the fused node (which then reads the joined K
/// and V).
#[derive(Clone, Debug, PartialEq)]
pub enum Kept {
    /// K is read through a transpose.
    Transposed,
    /// Only one of K and V is joined.
    OneJoined,
    /// K and V are the same join.
    SameJoin,
    /// An input of the block is computed from a join (the fused node cannot produce its own
    /// input).
    ReadByBlock(Mismatch),
}

impl Kept {
    /// The tag for the report's rule: `cache-concat kept (why)`.
    pub fn tag(&self) -> String {
        let why = match self {
            Kept::Transposed => "K is read transposed",
            Kept::OneJoined => "only one of K and V is joined",
            Kept::SameJoin => "K and V are the same join",
            Kept::ReadByBlock(m) => &m.found,
        };
        format!("cache-concat kept ({why})")
    }
}

/// The cache joins found above K and V.
#[derive(Clone, Debug)]
pub enum Joins {
    /// Neither K nor V is joined.
    Absent,
    /// Joins that the fused node cannot take over.
    Kept(Kept),
    /// Joins the fused node can take over, if nothing it reads is computed from them
    /// ([`takeover`]).
    Found(FoundJoins),
}

/// A pair of cache joins the fused node may take over.
#[derive(Clone, Debug)]
pub struct FoundJoins {
    /// The cache tensors (`shape_readers` still empty).
    pub cache: KvCache,
    /// The two `Concat` nodes, which go with the block.
    pub nodes: [usize; 2],
}

/// The joins above K and V (K read as `k`).
pub fn joins(view: &GraphView, k: &KInput, v: &str) -> Joins {
    if k.perm.is_some() {
        return match join_above(view, &k.source) {
            Some(_) => Joins::Kept(Kept::Transposed),
            None => Joins::Absent,
        };
    }
    let (kj, vj) = match (join_above(view, &k.source), join_above(view, v)) {
        (None, None) => return Joins::Absent,
        (Some(k), Some(v)) => (k, v),
        _ => return Joins::Kept(Kept::OneJoined),
    };
    if kj.output == vj.output {
        return Joins::Kept(Kept::SameJoin);
    }
    Joins::Found(FoundJoins {
        nodes: [kj.node, vj.node],
        cache: KvCache {
            past_key: kj.past,
            past_value: vj.past,
            present_key: kj.output,
            present_value: vj.output,
            new_key: kj.new,
            new_value: vj.new,
            shape_readers: Vec::new(),
        },
    })
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

/// Whether the fused node can produce a pair of joins it reads this step's K and V from.
#[derive(Clone, Debug)]
pub enum Takeover {
    /// It can; these `Shape` nodes reading a join are recomputed by the rewrite.
    Producible {
        /// The `Shape` nodes, sorted.
        shape_readers: Vec<usize>,
    },
    /// It cannot: the joins stay outside.
    Kept(Kept),
}

/// Whether the fused node can produce the joins of `cache`: none of its inputs (`q`, `k`, `v`
/// and the tensors of the `masks` it reads) may be computed from them (that would be a cycle),
/// except through `Shape`. `at` labels the block (its QK MatMul).
pub fn takeover(
    view: &GraphView,
    cache: &KvCache,
    [q, k, v]: [&str; 3],
    masks: &[MaskLayer],
    at: &str,
) -> Takeover {
    let presents = [cache.present_key.as_str(), cache.present_value.as_str()];
    let mut pending: Vec<&str> = masks
        .iter()
        .flat_map(MaskLayer::tensors)
        .map(String::as_str)
        .collect();
    pending.extend([q, k, v]);
    let mut seen: HashSet<&str> = HashSet::new();
    let mut shape_readers = Vec::new();
    while let Some(t) = pending.pop() {
        if !seen.insert(t) {
            continue;
        }
        if presents.contains(&t) {
            return Takeover::Kept(Kept::ReadByBlock(Mismatch::new(
                at,
                Check::KvCache,
                "block inputs computed without the joined cache (or only from its shape)",
                format!("an input of the block is computed from the joined cache '{t}'"),
            )));
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
    Takeover::Producible { shape_readers }
}
