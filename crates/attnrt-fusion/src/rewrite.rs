//! Emitting the fused node for a proven [`AttentionMatch`] and cleaning up after it.

use std::collections::{BTreeSet, HashMap, HashSet};

use anyhow::{bail, Context, Result};
use attnrt_onnx::{
    attr, node_label, tensor, validate::topo_order, GraphProto, NodeProto, TensorProto,
};

use crate::attention::{AttentionMatch, Layout, MaskLayer};

/// What one rewrite did.
pub struct Rewritten {
    /// The fused node's name.
    pub node: String,
    /// Labels of the nodes removed (the matched nodes and those left dead), in graph order.
    pub removed: Vec<String>,
    /// The mask kind written to the report.
    pub mask: String,
}

fn node(
    name: String,
    op_type: &str,
    inputs: Vec<String>,
    outputs: Vec<String>,
    attribute: Vec<attnrt_onnx::AttributeProto>,
) -> NodeProto {
    NodeProto {
        name,
        op_type: op_type.into(),
        input: inputs,
        output: outputs,
        attribute,
        ..Default::default()
    }
}

/// Replaces the match in `graph` by one `Attention` node named `name`.
pub fn rewrite(graph: &mut GraphProto, m: &AttentionMatch, name: &str) -> Result<Rewritten> {
    let existing: HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| {
            n.output
                .iter()
                .cloned()
                .chain(std::iter::once(n.name.clone()))
        })
        .chain(graph.initializer.iter().map(|t| t.name.clone()))
        .chain(graph.input.iter().map(|t| t.name.clone()))
        .collect();
    let fresh = |suffix: &str| -> Result<String> {
        let n = format!("{name}/{suffix}");
        if existing.contains(&n) {
            bail!("name '{n}' is already used in the graph; cannot insert the fused block");
        }
        Ok(n)
    };
    let mut new_nodes: Vec<NodeProto> = Vec::new();
    let mut new_inits: Vec<TensorProto> = Vec::new();

    // K: insert one Transpose when the graph only has Kᵀ (or K in another order).
    let mut k = m.k.0.clone();
    if let Some(perm) = &m.k.1 {
        let out = fresh("K")?;
        new_nodes.push(node(
            fresh("K_transpose")?,
            "Transpose",
            vec![k.clone()],
            vec![out.clone()],
            vec![attr::make_ints("perm", perm)],
        ));
        k = out;
    }

    // Mask: a single additive term or a single -inf fill map directly; anything else is
    // combined into one float mask with inserted nodes.
    let (mask_tensor, mask_kind) = build_mask(graph, m, &fresh, &mut new_nodes, &mut new_inits)?;

    // ONNX Runtime wants the mask's last two axes to be [Lq, Lk] exactly: expand a
    // broadcasting mask with the run-time lengths taken from Q and V.
    let mask_tensor = match (mask_tensor, m.expand_mask) {
        (Some(mt), true) => {
            let seq_axis = if m.layout == Layout::FourD { 2 } else { 1 };
            let lq = fresh("Lq")?;
            let lk = fresh("Lk")?;
            let shape_attrs = || {
                vec![
                    attr::make_int("start", seq_axis),
                    attr::make_int("end", seq_axis + 1),
                ]
            };
            new_nodes.push(node(
                fresh("Lq_shape")?,
                "Shape",
                vec![m.q.clone()],
                vec![lq.clone()],
                shape_attrs(),
            ));
            new_nodes.push(node(
                fresh("Lk_shape")?,
                "Shape",
                vec![m.v.clone()],
                vec![lk.clone()],
                shape_attrs(),
            ));
            let target = fresh("mask_shape")?;
            new_nodes.push(node(
                fresh("mask_shape_concat")?,
                "Concat",
                vec![lq, lk],
                vec![target.clone()],
                vec![attr::make_int("axis", 0)],
            ));
            let out = fresh("mask_expanded")?;
            new_nodes.push(node(
                fresh("mask_expand")?,
                "Expand",
                vec![mt, target],
                vec![out.clone()],
                vec![],
            ));
            Some(out)
        }
        (mt, _) => mt,
    };

    let mut inputs = vec![m.q.clone(), k, m.v.clone()];
    let mut attrs = Vec::new();
    if let Layout::ThreeD { q_heads, kv_heads } = m.layout {
        attrs.push(attr::make_int("q_num_heads", q_heads));
        attrs.push(attr::make_int("kv_num_heads", kv_heads));
    }
    if let Some(s) = m.scale_attr {
        attrs.push(attr::make_float("scale", s));
    }
    if m.is_causal {
        attrs.push(attr::make_int("is_causal", 1));
    }
    if let Some(c) = m.softcap {
        attrs.push(attr::make_float("softcap", c));
    }
    if let Some((_, mode)) = &m.qk_output {
        if *mode != 0 {
            attrs.push(attr::make_int("qk_matmul_output_mode", *mode));
        }
    }
    if let Some(mt) = &mask_tensor {
        inputs.push(mt.clone());
    }
    let mut output = m.output.clone();
    if m.layout == Layout::Batched {
        // (N, L, d) batched MatMuls: heads are independent, so [1, N, L, d] 4-D attention
        // computes the same thing.
        let axes = fresh("axes0")?;
        new_inits.push(tensor::from_i64(&axes, &[1], &[0]));
        for (i, what) in ["Q", "K", "V"].iter().enumerate() {
            let out = fresh(&format!("{what}4"))?;
            new_nodes.push(node(
                fresh(&format!("{what}_unsqueeze"))?,
                "Unsqueeze",
                vec![inputs[i].clone(), axes.clone()],
                vec![out.clone()],
                vec![],
            ));
            inputs[i] = out;
        }
        let y4 = fresh("Y4")?;
        new_nodes.push(node(
            fresh("Y_squeeze")?,
            "Squeeze",
            vec![y4.clone(), axes.clone()],
            vec![output.clone()],
            vec![],
        ));
        output = y4;
    }
    let outputs = match &m.qk_output {
        // Outputs: Y, present_key, present_value (not produced), qk_matmul_output.
        Some((t, _)) => vec![output, String::new(), String::new(), t.clone()],
        None => vec![output],
    };
    new_nodes.push(node(name.to_string(), "Attention", inputs, outputs, attrs));

    // Remove the matched nodes, insert the new ones where the last matched node was.
    let last = *m.core.iter().max().context("empty match")?;
    let mut removed_idx: BTreeSet<usize> = m.core.clone();
    let mut removed_inputs: Vec<String> = m
        .core
        .iter()
        .flat_map(|&i| graph.node[i].input.clone())
        .collect();
    // Dead code: nodes whose outputs lost their last reader (shape computations of the head
    // split, scale chains, repeat_kv), found by walking up from the removed nodes' inputs.
    let mut readers: HashMap<String, usize> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        if removed_idx.contains(&i) {
            continue;
        }
        for inp in &n.input {
            *readers.entry(inp.clone()).or_default() += 1;
        }
    }
    for n in &new_nodes {
        for inp in &n.input {
            *readers.entry(inp.clone()).or_default() += 1;
        }
    }
    let outputs: HashSet<String> = graph.output.iter().map(|o| o.name.clone()).collect();
    let producer: HashMap<String, usize> = graph
        .node
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().map(move |o| (o.clone(), i)))
        .collect();
    while let Some(t) = removed_inputs.pop() {
        let Some(&p) = producer.get(&t) else { continue };
        if removed_idx.contains(&p) {
            continue;
        }
        let pn = &graph.node[p];
        let dead = pn.output.iter().all(|o| {
            o.is_empty() || (readers.get(o).copied().unwrap_or(0) == 0 && !outputs.contains(o))
        });
        if dead {
            removed_idx.insert(p);
            for inp in &pn.input {
                if let Some(c) = readers.get_mut(inp) {
                    *c -= 1;
                }
                removed_inputs.push(inp.clone());
            }
        }
    }
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
    graph.initializer.extend(new_inits);

    // Initializers that only the removed nodes read go too; value_info of gone tensors too.
    let read: HashSet<&str> = graph
        .node
        .iter()
        .flat_map(|n| n.input.iter().map(String::as_str))
        .collect();
    let graph_outs: HashSet<String> = graph.output.iter().map(|o| o.name.clone()).collect();
    let produced: HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter().cloned())
        .collect();
    graph.initializer.retain(|t| {
        !old_inputs.contains(&t.name)
            || read.contains(t.name.as_str())
            || graph_outs.contains(&t.name)
    });
    let inits: HashSet<String> = graph.initializer.iter().map(|t| t.name.clone()).collect();
    // Declared types of tensors that no longer exist would confuse readers and checkers.
    graph
        .value_info
        .retain(|vi| !removed_outputs.contains(&vi.name) || produced.contains(&vi.name));

    // Declare the fused node's input shapes we proved, where the graph does not: ONNX shape
    // inference of Attention needs the hidden sizes of 3-D inputs.
    let declared: HashSet<String> = graph
        .value_info
        .iter()
        .chain(graph.input.iter())
        .chain(graph.output.iter())
        .map(|v| v.name.clone())
        .collect();
    for (t, ty, dims) in &m.input_shapes {
        if !declared.contains(t)
            && !inits.contains(t.as_str())
            && !graph.value_info.iter().any(|v| &v.name == t)
        {
            graph.value_info.push(value_info(t, *ty, dims));
        }
    }

    let order = topo_order(graph).map_err(|e| anyhow::anyhow!("after fusing {name}: {e}"))?;
    let mut slots: Vec<Option<NodeProto>> = std::mem::take(&mut graph.node)
        .into_iter()
        .map(Some)
        .collect();
    graph.node = order.into_iter().filter_map(|i| slots[i].take()).collect();

    Ok(Rewritten {
        node: name.to_string(),
        removed,
        mask: mask_kind,
    })
}

fn value_info(
    name: &str,
    elem_type: i32,
    dims: &[crate::graph::Dim],
) -> attnrt_onnx::ValueInfoProto {
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
    attnrt_onnx::ValueInfoProto {
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

type Fresh<'a> = dyn Fn(&str) -> Result<String> + 'a;

fn build_mask(
    graph: &GraphProto,
    m: &AttentionMatch,
    fresh: &Fresh,
    new_nodes: &mut Vec<NodeProto>,
    new_inits: &mut Vec<TensorProto>,
) -> Result<(Option<String>, String)> {
    match m.masks.as_slice() {
        [] => return Ok((None, "none".into())),
        [MaskLayer::Add { term, .. }] => return Ok((Some(term.clone()), "additive".into())),
        [MaskLayer::Fill {
            cond,
            fill_value,
            masked_when_true,
            ..
        }] if *fill_value == f64::NEG_INFINITY => {
            // Attention's bool mask is True where a key takes part.
            if *masked_when_true {
                let out = fresh("mask")?;
                new_nodes.push(node(
                    fresh("mask_not")?,
                    "Not",
                    vec![cond.clone()],
                    vec![out.clone()],
                    vec![],
                ));
                return Ok((Some(out), "bool".into()));
            }
            return Ok((Some(cond.clone()), "bool".into()));
        }
        _ => {}
    }
    let mut acc: Option<String> = None;
    let mut kinds = Vec::new();
    for (i, layer) in m.masks.iter().enumerate() {
        match layer {
            MaskLayer::Add { term, .. } => {
                kinds.push("additive");
                acc = Some(match acc {
                    None => term.clone(),
                    Some(a) => {
                        let out = fresh(&format!("mask_{i}"))?;
                        new_nodes.push(node(
                            fresh(&format!("mask_add_{i}"))?,
                            "Add",
                            vec![a, term.clone()],
                            vec![out.clone()],
                            vec![],
                        ));
                        out
                    }
                });
            }
            MaskLayer::Fill {
                cond,
                fill,
                masked_when_true,
                ..
            } => {
                kinds.push("fill");
                // Where(cond, fill, acc or 0): the fill replaces what came before, like the
                // original; the scores themselves get `+ fill` (exact only for -inf).
                let base = match acc {
                    Some(a) => a,
                    None => {
                        let zero = fresh(&format!("mask_zero_{i}"))?;
                        let dt = graph
                            .initializer
                            .iter()
                            .find(|t| &t.name == fill)
                            .map(|t| t.data_type)
                            .or_else(|| {
                                graph
                                    .node
                                    .iter()
                                    .find(|n| n.output.first() == Some(fill))
                                    .and_then(|n| attr::tensor(n, "value").ok().flatten())
                                    .map(|t| t.data_type)
                            })
                            .unwrap_or(attnrt_onnx::DataType::Float as i32);
                        if dt != attnrt_onnx::DataType::Float as i32 {
                            bail!(
                                "mask fill '{fill}' is not float32; combining it is not supported"
                            );
                        }
                        new_inits.push(tensor::from_f32(&zero, &[], &[0.0]));
                        zero
                    }
                };
                let out = fresh(&format!("mask_{i}"))?;
                let ins = if *masked_when_true {
                    vec![cond.clone(), fill.clone(), base]
                } else {
                    vec![cond.clone(), base, fill.clone()]
                };
                new_nodes.push(node(
                    fresh(&format!("mask_where_{i}"))?,
                    "Where",
                    ins,
                    vec![out.clone()],
                    vec![],
                ));
                acc = Some(out);
            }
        }
    }
    kinds.dedup();
    Ok((acc, kinds.join("+")))
}
