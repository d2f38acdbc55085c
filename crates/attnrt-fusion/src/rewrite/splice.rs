//! Putting the fused node in the matched nodes' place: the matched nodes go, with every node
//! left without a reader (the head split's shape computations, scale chains, `repeat_kv`);
//! the inserted nodes stand where the last matched node stood; initializers and `value_info`
//! of what is gone go too; the fused node's proven input shapes are declared; the graph is put
//! back in topological order.

use std::collections::{BTreeSet, HashSet};

use anyhow::{Context, Result};
use attnrt_onnx::{node_label, validate::topo_order, GraphProto, NodeProto, ValueInfoProto};

use super::inserted::Inserted;
use crate::graph::{Dim, GraphIndex};
use crate::rules::AttentionMatch;

/// Replaces `m`'s nodes in `graph` by `new` (the block of fused node `name`); returns the
/// labels of the nodes removed, in graph order.
pub(super) fn splice(
    graph: &mut GraphProto,
    m: &AttentionMatch,
    new: Inserted,
    name: &str,
) -> Result<Vec<String>> {
    graph.initializer.extend(new.inits);
    declare_inputs(graph, m);
    replace_nodes(graph, &m.placed.core.nodes, new.nodes)
        .with_context(|| format!("after fusing {name}"))
}

/// Replaces the nodes `core` of `graph` by `inserted` (placed where the last of them stood),
/// removes what only they read (nodes left without a reader, initializers, `value_info` of
/// gone tensors) and puts the graph back in topological order; returns the labels of the
/// nodes removed, in graph order.
pub fn replace_nodes(
    graph: &mut GraphProto,
    core: &BTreeSet<usize>,
    inserted: Vec<NodeProto>,
) -> Result<Vec<String>> {
    let last = *core.iter().max().context("empty match")?;
    let removed_idx = with_dead_code(graph, core, &inserted);
    let removed: Vec<String> = removed_idx
        .iter()
        .map(|&i| node_label(&graph.node[i]))
        .collect();
    let removed_outputs: HashSet<String> = removed_idx
        .iter()
        .flat_map(|&i| graph.node[i].output.clone())
        .collect();
    let old_inputs: HashSet<String> = removed_idx
        .iter()
        .flat_map(|&i| graph.node[i].input.clone())
        .collect();
    let mut new_nodes = inserted;
    let mut nodes = Vec::with_capacity(graph.node.len());
    for (i, n) in std::mem::take(&mut graph.node).into_iter().enumerate() {
        if i == last {
            nodes.append(&mut new_nodes);
        }
        if !removed_idx.contains(&i) {
            nodes.push(n);
        }
    }
    graph.node = nodes;
    tidy(graph, &old_inputs, &removed_outputs);
    let order = topo_order(graph).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut slots: Vec<Option<NodeProto>> = std::mem::take(&mut graph.node)
        .into_iter()
        .map(Some)
        .collect();
    graph.node = order.into_iter().filter_map(|i| slots[i].take()).collect();
    Ok(removed)
}

/// `core` and the nodes whose outputs lose their last reader once it is gone (and `inserted`
/// reads what it reads), found by walking up from the removed nodes' inputs. A subgraph's node
/// reading an output by name is a reader that stays ([`GraphIndex::with_subgraphs`]).
fn with_dead_code(
    graph: &GraphProto,
    core: &BTreeSet<usize>,
    inserted: &[NodeProto],
) -> BTreeSet<usize> {
    let index = GraphIndex::with_subgraphs(graph);
    let read_by_inserted: HashSet<&str> = inserted.iter().flat_map(named_inputs).collect();
    let mut removed = core.clone();
    let mut pending: Vec<&str> = core
        .iter()
        .flat_map(|&i| named_inputs(&graph.node[i]))
        .collect();
    while let Some(t) = pending.pop() {
        let Some(p) = index.producer(t).filter(|p| !removed.contains(p)) else {
            continue;
        };
        let pn = index.node(p);
        let dead = pn.output.iter().all(|o| {
            o.is_empty()
                || !(index.is_graph_output(o)
                    || read_by_inserted.contains(o.as_str())
                    || index.consumers(o).iter().any(|c| !removed.contains(c)))
        });
        if dead {
            removed.insert(p);
            pending.extend(named_inputs(pn));
        }
    }
    removed
}

/// The names `n` reads (its omitted optional inputs, the empty name, left out).
fn named_inputs(n: &NodeProto) -> impl Iterator<Item = &str> {
    n.input.iter().map(String::as_str).filter(|i| !i.is_empty())
}

/// Initializers that only the removed nodes read go (one a subgraph reads by name stays);
/// `value_info` of gone tensors too (declared types of tensors that no longer exist would
/// confuse readers and checkers).
fn tidy(graph: &mut GraphProto, old_inputs: &HashSet<String>, removed_outputs: &HashSet<String>) {
    let unread: HashSet<String> = {
        let index = GraphIndex::with_subgraphs(graph);
        old_inputs
            .iter()
            .filter(|t| index.consumers(t).is_empty() && !index.is_graph_output(t))
            .cloned()
            .collect()
    };
    graph.initializer.retain(|t| !unread.contains(&t.name));
    let produced: HashSet<&str> = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter().map(String::as_str))
        .collect();
    graph
        .value_info
        .retain(|vi| !removed_outputs.contains(&vi.name) || produced.contains(vi.name.as_str()));
}

/// Declares the fused node's input shapes proven by the match where the graph does not: ONNX
/// shape inference of Attention needs the hidden sizes of 3-D inputs.
fn declare_inputs(graph: &mut GraphProto, m: &AttentionMatch) {
    let inits: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let declared: HashSet<&str> = graph
        .value_info
        .iter()
        .chain(graph.input.iter())
        .chain(graph.output.iter())
        .map(|v| v.name.as_str())
        .collect();
    let missing: Vec<ValueInfoProto> = m
        .input_shapes
        .iter()
        .filter(|(t, _, _)| !declared.contains(t.as_str()) && !inits.contains(t.as_str()))
        .map(|(t, ty, dims)| value_info(t, *ty, dims))
        .collect();
    for vi in missing {
        // The same tensor may be Q, K and V at once: declare it once.
        if !graph.value_info.iter().any(|v| v.name == vi.name) {
            graph.value_info.push(vi);
        }
    }
}

fn value_info(name: &str, elem_type: i32, dims: &[Dim]) -> ValueInfoProto {
    use attnrt_onnx::proto::tensor_shape_proto::{dimension, Dimension};
    use attnrt_onnx::proto::{type_proto, TensorShapeProto, TypeProto};
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: match (d.as_known(), d.as_symbol()) {
                (Some(v), _) => Some(dimension::Value::DimValue(v)),
                (None, Some(s)) => Some(dimension::Value::DimParam(s.to_string())),
                _ => None,
            },
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}
