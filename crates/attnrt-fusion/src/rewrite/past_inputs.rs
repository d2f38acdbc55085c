//! An `Attention` node already in the graph (an opset-23 export) that reads its cache joins
//! `Concat(past, new, axis = 2)` as K and V (through a grouped-query repeat or not) takes them
//! over: it reads this step's K and V and the past (inputs 1, 2, 4, 5) and outputs the joins
//! (outputs 1 and 2, which the spec defines as exactly these concatenations). The joins go,
//! and with them what only they fed (the repeat); `Shape` readers are recomputed as for a
//! fused block (`cache_shape`).

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use attnrt_onnx::GraphProto;

use super::cache_shape;
use super::inserted::{Inserted, Names};
use super::splice::replace_nodes;
use crate::rules::kv_cache::KvCache;

/// Gives the `Attention` node `at` of `graph` the cache of `kv`, whose joins are the nodes
/// `joins`; returns the labels of the nodes removed.
pub fn give_cache(
    graph: &mut GraphProto,
    at: usize,
    joins: [usize; 2],
    kv: &KvCache,
) -> Result<Vec<String>> {
    let mut node = graph.node[at].clone();
    let names = Names::new(graph, &format!("{}/cache", node.name));
    let mut new = Inserted::default();
    cache_shape::replace_readers(graph, kv, &names, &mut new)?;
    node.input.resize(node.input.len().max(6), String::new());
    node.input[1] = kv.new_key.clone();
    node.input[2] = kv.new_value.clone();
    node.input[4] = kv.past_key.clone();
    node.input[5] = kv.past_value.clone();
    node.output.resize(node.output.len().max(3), String::new());
    node.output[1] = kv.present_key.clone();
    node.output[2] = kv.present_value.clone();
    new.nodes.push(node);
    let mut core: BTreeSet<usize> = joins.into_iter().collect();
    core.insert(at);
    core.extend(kv.shape_readers.iter().map(|r| r.node));
    graph.initializer.extend(new.inits);
    replace_nodes(graph, &core, new.nodes).context("after giving an Attention node its cache")
}
