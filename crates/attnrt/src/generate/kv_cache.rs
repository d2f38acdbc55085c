//! The in-place key/value cache of a generation (`attnrt_runtime::kv_store`): which decoders
//! can use it, and the decoder graph that does.
//!
//! It is used only where it is exact: every self-attention cache slot is f32, each pair of
//! past inputs is read by one fused `Attention` node as its `past_key`/`past_value` and each
//! present output is that node's `present_key`/`present_value`, read by no other node (but
//! `Shape`s that take the batch, heads or length only: the stand-ins' last axis is 0).
//! Those nodes are put in store mode; the presents' declared shapes are cleared (the file's
//! head size would contradict the stand-ins'). Before the check, a decoder's readers of a
//! present's head size that are provably the current key's or value's (the SDPA TorchScript
//! exports': [`super::kv_shapes`]) are rewritten to take it from there. Anything else keeps
//! today's tensors, with the reason in the generation's report.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::Context;
use attnrt_fusion::graph::GraphIndex;
use attnrt_onnx::{GraphProto, ModelProto, NodeProto};
use attnrt_runtime::attention::semantics::KV_STORE_ATTRIBUTE;
use attnrt_runtime::{KvStore, Tensor};
use serde::Serialize;

use super::DecoderSignature;

/// How a generation keeps its key/value cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvCacheMode {
    /// Held once, appended to in place by the fused attention, where that is exact (else as
    /// [`KvCacheMode::Copy`], with the reason in [`KvCacheReport::fallback`]).
    #[default]
    InPlace,
    /// Tensors: each step's presents (past ++ current, a fresh copy) are the next step's past.
    Copy,
}

impl std::str::FromStr for KvCacheMode {
    type Err = String;

    fn from_str(s: &str) -> Result<KvCacheMode, String> {
        match s {
            "in-place" => Ok(KvCacheMode::InPlace),
            "copy" => Ok(KvCacheMode::Copy),
            _ => Err(format!("'{s}': the cache is 'in-place' or 'copy'")),
        }
    }
}

/// How a generation kept its cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvCacheReport {
    /// The mode it ran with.
    pub mode: KvCacheMode,
    /// Why the in-place cache asked for was not used.
    pub fallback: Option<String>,
}

/// The decoder graph that keeps its cache in place, and which node owns which slots.
pub struct InPlaceModel {
    /// The decoder with its cache's `Attention` nodes in store mode.
    pub model: ModelProto,
    /// The nodes of the decode steps' graph that own the cache slots.
    pub owners: Vec<Owner>,
}

/// The store-mode `Attention` node (named as the session's graph names it) that reads the
/// past key and past value inputs `key` and `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The node.
    pub node: String,
    /// Its `past_key` input.
    pub key: String,
    /// Its `past_value` input.
    pub value: String,
}

/// A generation's in-place cache: the store and the nodes that own its slots.
#[derive(Clone, Debug)]
pub struct HeldCache {
    /// The store.
    pub store: Arc<KvStore>,
    /// The nodes that own its slots, for presents made as tensors (a merged decoder's first
    /// step: its no-cache branch) to be moved in.
    pub owners: Arc<[Owner]>,
}

impl HeldCache {
    /// Moves presents made as tensors (`[B, Hkv, L, D]` each, named by the past they become)
    /// into the empty slots of their owners.
    pub fn move_in(&self, presents: Vec<(&str, Tensor)>) -> anyhow::Result<()> {
        let find = |past: &str| -> anyhow::Result<&Tensor> {
            presents
                .iter()
                .find(|(p, _)| *p == past)
                .map(|(_, t)| t)
                .with_context(|| format!("no present for '{past}' to move into the cache"))
        };
        for owner in self.owners.iter() {
            let (k, v) = (find(&owner.key)?, find(&owner.value)?);
            self.store.fill(&owner.node, k, v)?;
        }
        Ok(())
    }
}

/// `model` with the `Attention` nodes that own the self-attention cache of `sig` in store mode,
/// or why the in-place cache would not be exact. A merged decoder's branches are checked each
/// (the no-cache branch, which makes the first step's presents as tensors, must read no past
/// but for its batch, heads or length).
pub fn in_place_model(model: &ModelProto, sig: &DecoderSignature) -> Result<InPlaceModel, String> {
    if sig.cache.is_empty() {
        return Err("the decoder has no self-attention cache".into());
    }
    if let Some(slot) = sig.cache.iter().find(|s| s.elem_type != 1) {
        return Err(format!(
            "cache '{}' is {}: the in-place cache holds float32 only",
            slot.past,
            attnrt_onnx::tensor::type_name(slot.elem_type)
        ));
    }
    let branch = |m: &ModelProto, v: bool| -> Result<ModelProto, String> {
        let input = sig.cache_branch.as_deref().unwrap_or_default();
        attnrt_onnx::branch::choose_branch(m, input, v).map_err(|e| format!("{e:#}"))
    };
    let mut model = model.clone();
    if sig.cache_branch.is_some() {
        owners(graph_of(&branch(&model, false)?)?, sig)?;
    } else {
        let graph = model.graph.as_mut().ok_or("the model has no graph")?;
        super::kv_shapes::rewrite(graph, sig);
    }
    // The owners of the decode steps' graph (a merged decoder's cache branch); marking them
    // (an attribute on `Attention` nodes, the presents' declared shapes cleared) changes
    // nothing `owners` reads, so they are found once, on the marked model.
    let pasts: HashSet<&str> = sig.cache.iter().map(|s| s.past.as_str()).collect();
    let presents: HashSet<&str> = sig.cache.iter().map(|s| s.present.as_str()).collect();
    let graph = model.graph.as_mut().ok_or("the model has no graph")?;
    mark(graph, &pasts, &presents);
    let owners = match sig.cache_branch {
        Some(_) => owners(graph_of(&branch(&model, true)?)?, sig)?,
        None => owners(graph_of(&model)?, sig)?,
    };
    Ok(InPlaceModel { model, owners })
}

fn graph_of(model: &ModelProto) -> Result<&GraphProto, String> {
    model
        .graph
        .as_ref()
        .ok_or_else(|| "the model has no graph".into())
}

/// Puts the `Attention` nodes of `graph` and its subgraphs that read a past of `pasts` in store
/// mode, and clears the declared shapes of `presents` (the file's head size would contradict
/// the stand-ins').
fn mark(graph: &mut GraphProto, pasts: &HashSet<&str>, presents: &HashSet<&str>) {
    for v in graph.output.iter_mut().chain(graph.value_info.iter_mut()) {
        if presents.contains(v.name.as_str()) {
            clear_shape(v);
        }
    }
    for n in graph.node.iter_mut() {
        let reads_past = n.input.get(4).is_some_and(|i| pasts.contains(i.as_str()));
        if n.op_type == "Attention" && reads_past {
            n.attribute
                .push(attnrt_onnx::attr::make_int(KV_STORE_ATTRIBUTE, 1));
        }
        for a in n.attribute.iter_mut() {
            a.g.iter_mut()
                .chain(a.graphs.iter_mut())
                .for_each(|g| mark(g, pasts, presents));
        }
    }
}

/// The `Attention` nodes that own every cache slot read in `graph` (see the module docs).
fn owners(graph: &GraphProto, sig: &DecoderSignature) -> Result<Vec<Owner>, String> {
    let index = GraphIndex::with_subgraphs(graph);
    let readers = |t: &str| index.consumers(t).iter().map(|&r| index.node(r));
    let present_of: HashMap<&str, &str> = sig
        .cache
        .iter()
        .map(|s| (s.past.as_str(), s.present.as_str()))
        .collect();
    let mut owners: Vec<Owner> = Vec::new();
    for slot in &sig.cache {
        for n in readers(&slot.past) {
            if shape_without_head(n, &index) {
                continue;
            }
            owner(n, &slot.past, &present_of)?;
            if !owners.iter().any(|o| o.node == n.name) {
                owners.push(Owner {
                    node: n.name.clone(),
                    key: n.input[4].clone(),
                    value: n.input[5].clone(),
                });
            }
        }
        // (a present made as a tensor, by a merged decoder's no-cache branch, is read as one)
        if !owners
            .iter()
            .any(|o| o.key == slot.past || o.value == slot.past)
        {
            continue;
        }
        let mut others = readers(&slot.present).filter(|n| !shape_without_head(n, &index));
        if let Some(n) = others.next() {
            return Err(format!(
                "present '{}' is also read by node '{}' ({})",
                slot.present, n.name, n.op_type
            ));
        }
    }
    Ok(owners)
}

/// Checks that `n` reads `past` as a fused `Attention`'s past and makes the matching presents.
fn owner(n: &NodeProto, past: &str, present_of: &HashMap<&str, &str>) -> Result<(), String> {
    let is_attention = n.op_type == "Attention" && !n.name.is_empty();
    let pasts = [n.input.get(4), n.input.get(5)];
    let wired = pasts
        .iter()
        .zip([n.output.get(1), n.output.get(2)])
        .all(|(p, o)| {
            let p = p.map(String::as_str);
            p.and_then(|p| present_of.get(p)).copied() == o.map(String::as_str)
        });
    let slot_read = pasts
        .iter()
        .filter(|p| p.map(String::as_str) == Some(past))
        .count()
        == 1
        && n.input.iter().filter(|i| *i == past).count() == 1;
    if is_attention && wired && slot_read {
        return Ok(());
    }
    Err(format!(
        "past '{past}' is read by node '{}' ({}) other than as a fused attention's cache",
        n.name, n.op_type
    ))
}

/// Whether `n` is a `Shape` of a past or present that reads none of its head size: its `end` stops before the last
/// axis, or every reader of the full shape gathers a constant axis other than the last.
fn shape_without_head(n: &NodeProto, index: &GraphIndex) -> bool {
    if n.op_type != "Shape" {
        return false;
    }
    let int = |name| attnrt_onnx::attr::int(n, name).ok().flatten();
    let (start, end) = (int("start"), int("end"));
    if matches!(end, Some(1..=3 | -3..=-1)) {
        return true;
    }
    // else the whole shape: its readers must not take the head size
    if !matches!(start, None | Some(0 | -4)) || !matches!(end, None | Some(4..)) {
        return false;
    }
    n.output
        .first()
        .is_none_or(|out| head_unread(out, index, 0))
}

/// Whether no reader of `shape` (a past's or present's shape, or a sum of it) takes its head
/// size: each gathers a constant axis other than the last, or adds to it element by element
/// (optimum's fusion sizes present so) with the sum's readers so.
fn head_unread(shape: &str, index: &GraphIndex, depth: usize) -> bool {
    index.consumers(shape).iter().all(|&r| {
        let r = index.node(r);
        let ix = r.input.get(1).and_then(|i| index.small_ints(i));
        let gathers = r.op_type == "Gather"
            && r.input.first().map(String::as_str) == Some(shape)
            && matches!(attnrt_onnx::attr::int(r, "axis"), Ok(None | Some(0)))
            && ix.is_some_and(|(_, ix)| ix.iter().all(|i| matches!(i, 0..=2 | -4..=-2)));
        let adds = matches!(r.op_type.as_str(), "Add" | "Sub") && depth < 4;
        gathers
            || (adds
                && r.output
                    .first()
                    .is_some_and(|o| head_unread(o, index, depth + 1)))
    })
}

/// Drops the declared shape of `v` (its element type stays).
fn clear_shape(v: &mut attnrt_onnx::ValueInfoProto) {
    use attnrt_onnx::proto::type_proto::Value;
    if let Some(Value::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) {
        t.shape = None;
    }
}
