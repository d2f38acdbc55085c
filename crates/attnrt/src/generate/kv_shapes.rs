//! The shape readers of a store-mode cache that take its head size (the SDPA TorchScript
//! exports do), rewritten so they no longer read a stand-in's last axis (issue 26).
//!
//! A fused `Attention` node's `present_key` is `Concat(past_key, key, axis 2)` (and the same
//! for values): its axes other than 2 are the current key's. In store mode the present is a
//! stand-in `[batch, kv_heads, length, 0]` whose first three axes are the true ones. So, where
//! the node takes 4-D keys and values (it has no `kv_num_heads`: 3-D inputs need it):
//!
//! - a `Shape` of the whole present becomes `Concat(Shape(present, end=3), Shape(current,
//!   start=3))`, the true shape;
//! - a `Gather` of one axis `c` of a `Reshape(x, s)` (allowzero 0) whose `s` is a `Concat` of
//!   one-element pieces, the `c`-th the head size taken from such a rewritten shape, becomes
//!   that head size: a positive entry of a reshape's shape is the output's axis (the GQA
//!   `repeat_kv` of the values, which the exports only read through its shape);
//!
//! and the nodes no output needs any more are dropped. Anything else is left as it is (and
//! refused by the caller, with its reason).

use std::collections::{HashMap, HashSet};

use attnrt_fusion::graph::GraphIndex;
use attnrt_onnx::attr::{int, make_int};
use attnrt_onnx::{GraphProto, NodeProto};

use super::DecoderSignature;

/// Rewrites the head-size readers of the presents of `sig` in `graph` (top level only).
pub fn rewrite(graph: &mut GraphProto, sig: &DecoderSignature) {
    let currents = present_currents(graph, sig);
    if currents.is_empty() {
        return;
    }
    let shapes = rewrite_shapes(graph, &currents);
    // (a positive entry of a reshape's shape is its output's axis: head sizes of 0 are not)
    if shapes.is_empty() || sig.cache.iter().any(|s| s.head_size == 0) {
        return;
    }
    rewire_reshape_heads(graph, &shapes);
    drop_dead(graph);
}

/// Each present of `sig` made by a fused 4-D `Attention` node, with the current key or value
/// it is joined from.
fn present_currents(graph: &GraphProto, sig: &DecoderSignature) -> HashMap<String, String> {
    let pasts: HashSet<&str> = sig.cache.iter().map(|s| s.past.as_str()).collect();
    let presents: HashSet<&str> = sig.cache.iter().map(|s| s.present.as_str()).collect();
    let mut currents = HashMap::new();
    for n in &graph.node {
        let four_d = attnrt_onnx::attr::find(n, "kv_num_heads").is_none();
        if n.op_type != "Attention" || !four_d {
            continue;
        }
        for (past, present, current) in [(4, 1, 1), (5, 2, 2)] {
            let (Some(p), Some(o), Some(c)) = (
                n.input.get(past),
                n.output.get(present),
                n.input.get(current),
            ) else {
                continue;
            };
            if pasts.contains(p.as_str()) && presents.contains(o.as_str()) && !c.is_empty() {
                currents.insert(o.clone(), c.clone());
            }
        }
    }
    currents
}

/// Rewrites each whole-shape `Shape` of a present in `currents` into the true shape (see the
/// module docs); returns the rewritten shapes' outputs (their names are kept).
fn rewrite_shapes(graph: &mut GraphProto, currents: &HashMap<String, String>) -> HashSet<String> {
    let mut rewritten = HashSet::new();
    let mut nodes = Vec::with_capacity(graph.node.len());
    for n in std::mem::take(&mut graph.node) {
        let current = n.input.first().and_then(|i| currents.get(i));
        let whole = n.op_type == "Shape"
            && matches!(int(&n, "start"), Ok(None | Some(0)))
            && matches!(int(&n, "end"), Ok(None));
        let (Some(current), true, Some(out)) = (current, whole, n.output.first().cloned()) else {
            nodes.push(n);
            continue;
        };
        let rows = format!("{out}/rows");
        let head = format!("{out}/head");
        nodes.push(node(
            "Shape",
            &format!("{}/rows", n.name),
            &[&n.input[0]],
            &rows,
            make_int("end", 3),
        ));
        nodes.push(node(
            "Shape",
            &format!("{}/head", n.name),
            &[current],
            &head,
            make_int("start", 3),
        ));
        nodes.push(node(
            "Concat",
            &n.name,
            &[&rows, &head],
            &out,
            make_int("axis", 0),
        ));
        rewritten.insert(out);
    }
    graph.node = nodes;
    rewritten
}

fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    output: &str,
    attribute: attnrt_onnx::AttributeProto,
) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|i| i.to_string()).collect(),
        output: vec![output.into()],
        attribute: vec![attribute],
        ..Default::default()
    }
}

/// Points the readers of `Gather(Shape(Reshape(x, s)), c)` at the head size `s` takes at `c`,
/// where that is a head size of a rewritten shape (`shapes`).
fn rewire_reshape_heads(graph: &mut GraphProto, shapes: &HashSet<String>) {
    let index = GraphIndex::new(graph);
    let replace: HashMap<String, String> = graph
        .node
        .iter()
        .filter(|n| n.op_type == "Gather")
        .filter_map(|g| Some((g.output[0].clone(), reshaped_head(g, &index, shapes)?)))
        .collect();
    for n in graph.node.iter_mut() {
        for i in n.input.iter_mut() {
            if let Some(to) = replace.get(i.as_str()) {
                *i = to.clone();
            }
        }
    }
}

/// The head size that `g` (a scalar `Gather` of one axis of a reshape's shape) equals, if
/// proven: the reshape's shape is a `Concat` of one-element pieces whose piece at that axis is
/// the head size of a rewritten shape (`shapes`), and a positive entry is the output's axis.
fn reshaped_head(g: &NodeProto, index: &GraphIndex, shapes: &HashSet<String>) -> Option<String> {
    let by = |i: Option<&String>| i.and_then(|i| index.producer_node(i));
    let scalar = |i: Option<&String>| match i.and_then(|i| index.small_ints(i)) {
        Some(([], v)) => v.first().copied(),
        _ => None,
    };
    let axis = usize::try_from(scalar(g.input.get(1))?).ok()?;
    let shape = by(g.input.first()).filter(|n| n.op_type == "Shape" && n.attribute.is_empty())?;
    let reshape = by(shape.input.first()).filter(|n| n.op_type == "Reshape")?;
    let concat = by(reshape.input.get(1)).filter(|n| n.op_type == "Concat")?;
    let axis_0 = |n: &NodeProto, name| matches!(int(n, name), Ok(None | Some(0)));
    if !axis_0(g, "axis")
        || !axis_0(reshape, "allowzero")
        || !matches!(int(concat, "axis"), Ok(Some(0)))
    {
        return None;
    }
    let pieces: Vec<&NodeProto> = concat
        .input
        .iter()
        .map(|i| by(Some(i)))
        .collect::<Option<_>>()?;
    let to_axis = pieces.get(..=axis)?;
    if !to_axis.iter().all(|n| one_element(n, index)) {
        return None;
    }
    let unsqueeze = pieces[axis];
    let head = by(unsqueeze.input.first()).filter(|n| n.op_type == "Gather")?;
    let of_rewritten = head.input.first().is_some_and(|i| shapes.contains(i));
    let last = matches!(scalar(head.input.get(1)), Some(3 | -1));
    (unsqueeze.op_type == "Unsqueeze" && of_rewritten && last).then(|| head.output[0].clone())
}

/// Whether `n` makes a one-element tensor: an `Unsqueeze` at axis 0 of a scalar `Gather` of a
/// shape, or a one-element constant.
fn one_element(n: &NodeProto, index: &GraphIndex) -> bool {
    let constant = |i: Option<&String>| i.and_then(|i| index.small_ints(i));
    match n.op_type.as_str() {
        "Constant" => constant(n.output.first()).is_some_and(|(dims, _)| dims == [1]),
        "Unsqueeze" => {
            let axes = constant(n.input.get(1));
            let data = n.input.first().and_then(|i| index.producer_node(i));
            axes.is_some_and(|(dims, v)| dims == [1] && v == [0])
                && data.is_some_and(|g| scalar(g, index, 0))
        }
        _ => false,
    }
}

/// Whether `n` makes a scalar: a `Gather` of one axis of a shape (a `Shape`, or a rewritten one:
/// a `Concat` of shapes) by a scalar constant, a scalar constant, or arithmetic of scalars.
fn scalar(n: &NodeProto, index: &GraphIndex, depth: usize) -> bool {
    let scalar_constant = |i: &String| index.small_ints(i).is_some_and(|(dims, _)| dims.is_empty());
    if n.output.first().is_some_and(scalar_constant) {
        return true;
    }
    if matches!(n.op_type.as_str(), "Add" | "Sub" | "Mul" | "Div") {
        let made = |i: &String| index.producer_node(i);
        return depth < 4
            && n.input.len() == 2
            && n.input.iter().all(|i| {
                scalar_constant(i) || made(i).is_some_and(|p| scalar(p, index, depth + 1))
            });
    }
    let by_constant = n.input.get(1).is_some_and(scalar_constant);
    let data = n.input.first().and_then(|i| index.producer_node(i));
    let shape = |i: &String| index.producer_node(i).is_some_and(|p| p.op_type == "Shape");
    n.op_type == "Gather"
        && matches!(int(n, "axis"), Ok(None | Some(0)))
        && by_constant
        && data.is_some_and(|s| {
            s.op_type == "Shape" || (s.op_type == "Concat" && s.input.iter().all(shape))
        })
}

/// Drops the nodes of `graph` that no graph output needs.
fn drop_dead(graph: &mut GraphProto) {
    // (a subgraph may read this graph's names: then nothing is dropped)
    let nested = |n: &NodeProto| {
        n.attribute
            .iter()
            .any(|a| a.g.is_some() || !a.graphs.is_empty())
    };
    if graph.node.iter().any(nested) {
        return;
    }
    let index = GraphIndex::new(graph);
    let mut live = vec![false; graph.node.len()];
    let mut stack: Vec<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
    while let Some(t) = stack.pop() {
        let Some(k) = index.producer(t) else { continue };
        if std::mem::replace(&mut live[k], true) {
            continue;
        }
        stack.extend(graph.node[k].input.iter().map(String::as_str));
    }
    let mut k = 0;
    graph.node.retain(|_| {
        k += 1;
        live[k - 1]
    });
}
