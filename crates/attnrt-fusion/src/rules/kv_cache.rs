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
    /// `Shape` nodes whose result the block's inputs are computed from (a causal mask sliced
    /// to the key length), reading a join or a tensor computed from one: the rewrite computes
    /// them from the past's and this step's shapes instead, as the fused node's outputs cannot
    /// feed its own inputs.
    pub shape_readers: Vec<ShapeReader>,
}

/// A `Shape` node the rewrite recomputes without the joins, element by element.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeReader {
    /// The `Shape` node.
    pub node: usize,
    /// Whether its sizes of the joins are the keys' join's (else the values').
    pub of_key: bool,
    /// Its output's elements.
    pub dims: Vec<ShapeDim>,
}

/// One element of a recomputed `Shape`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ShapeDim {
    /// A size known before run time.
    Known(i64),
    /// Axis `a` of the join (`[B, Hkv, P + L, D]`).
    Axis(usize),
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
    /// It can; these `Shape` nodes are recomputed by the rewrite.
    Producible {
        /// The `Shape` nodes, sorted by node.
        shape_readers: Vec<ShapeReader>,
    },
    /// It cannot: the joins stay outside.
    Kept(Kept),
}

/// Whether the fused node can produce the joins of `cache`: none of its `inputs` (Q, this
/// step's K and V, the mask tensors it reads) may be computed from them (that would be a cycle),
/// except through a `Shape` whose every element is a known size or a size of a join
/// (a [`ShapeReader`]: a `Shape` of the join itself, or of a tensor computed from it such as
/// LLaMA's head repeat). `at` labels the block (its QK MatMul).
pub fn takeover(view: &GraphView, cache: &KvCache, inputs: Vec<&str>, at: &str) -> Takeover {
    let presents = [cache.present_key.as_str(), cache.present_value.as_str()];
    let from_joins = computed_from(view, &presents);
    let mut pending = inputs;
    let mut seen: HashSet<&str> = HashSet::new();
    let mut shape_readers = Vec::new();
    while let Some(t) = pending.pop() {
        if !from_joins.contains(t) || !seen.insert(t) {
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
        if n.op_type == "Shape" {
            if let Some(r) = shape_reader(view, cache, q) {
                shape_readers.push(r);
                continue;
            }
        }
        pending.extend(n.input.iter().filter(|i| !i.is_empty()).map(String::as_str));
    }
    shape_readers.sort_unstable_by_key(|r| r.node);
    shape_readers.dedup_by_key(|r| r.node);
    Takeover::Producible { shape_readers }
}

/// The tensors computed from `presents` (them included).
fn computed_from<'a>(view: &'a GraphView, presents: &[&'a str]) -> HashSet<&'a str> {
    let mut found: HashSet<&str> = HashSet::new();
    let mut pending = presents.to_vec();
    while let Some(t) = pending.pop() {
        if !found.insert(t) {
            continue;
        }
        for &c in view.consumers(t) {
            pending.extend(view.node(c).output.iter().map(String::as_str));
        }
    }
    found
}

/// The `Shape` node `n` as the rewrite recomputes it, when each element it outputs is a known
/// size or (symbolically) a size of one of the joins, the same join for all.
fn shape_reader(view: &GraphView, cache: &KvCache, n: usize) -> Option<ShapeReader> {
    let node = view.node(n);
    let input = node.input.first()?;
    let shape = view.shape(input)?;
    let (start, end) = shape_range(node, shape.len())?;
    let dims = &shape[start..end];
    let read = |present: &str, of_key: bool| {
        if input == present {
            let dims = (start..end).map(ShapeDim::Axis).collect();
            return Some(ShapeReader {
                node: n,
                of_key,
                dims,
            });
        }
        let join = view.shape(present)?;
        let dims = dims
            .iter()
            .map(|d| match d.as_known() {
                Some(v) => Some(ShapeDim::Known(v)),
                None => join.iter().position(|j| j == d).map(ShapeDim::Axis),
            })
            .collect::<Option<_>>()?;
        Some(ShapeReader {
            node: n,
            of_key,
            dims,
        })
    };
    read(&cache.present_key, true).or_else(|| read(&cache.present_value, false))
}

/// `Shape`'s `start`/`end` on an input of `rank`, clamped as the spec says.
fn shape_range(n: &attnrt_onnx::NodeProto, rank: usize) -> Option<(usize, usize)> {
    let rank = rank as i64;
    let norm = |v: i64| (if v < 0 { v.saturating_add(rank) } else { v }).clamp(0, rank) as usize;
    let start = norm(attr::int(n, "start").ok()?.unwrap_or(0));
    let end = norm(attr::int(n, "end").ok()?.unwrap_or(rank));
    Some((start, end.max(start)))
}
