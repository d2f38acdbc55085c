//! Models whose graph chooses a branch from an input: optimum's merged decoders take a boolean
//! `use_cache_branch` and hold the whole decoder twice, in the two branches of one `If` (the
//! first step without a cache, every later step with it). attnrt runs such a model as two
//! plain graphs, one per value of the input ([`choose_branch`]): each is fused, planned and run
//! as any other model, and the value fed picks which one runs.

use std::collections::HashSet;

use anyhow::{bail, Context, Result};

use crate::proto::{attribute_proto::AttributeType, tensor_proto::DataType};
use crate::{GraphProto, ModelProto, NodeProto};

/// The graph inputs that only choose a branch: boolean inputs of one element whose every use is
/// the condition of an `If` of the main graph.
pub fn branch_inputs(model: &ModelProto) -> Vec<String> {
    let Some(g) = model.graph.as_ref() else {
        return Vec::new();
    };
    g.input
        .iter()
        .filter(|i| is_bool_scalar(i))
        .map(|i| i.name.clone())
        .filter(|name| {
            let uses: Vec<&NodeProto> = g.node.iter().filter(|n| n.input.contains(name)).collect();
            !uses.is_empty()
                && uses
                    .iter()
                    .all(|n| n.op_type == "If" && n.domain.is_empty() && n.input.len() == 1)
        })
        .collect()
}

fn is_bool_scalar(vi: &crate::ValueInfoProto) -> bool {
    use crate::proto::type_proto::Value;
    let Some(Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return false;
    };
    let one = t.shape.as_ref().is_some_and(|s| {
        s.dim.iter().all(|d| {
            matches!(
                d.value,
                Some(crate::proto::tensor_shape_proto::dimension::Value::DimValue(1))
            )
        })
    });
    t.elem_type == DataType::Bool as i32 && one
}

/// `model` with every `If` whose condition is the graph input `input` replaced by the nodes of
/// the branch `value` chooses (`then_branch` for true). The branch's outputs take the names of
/// the `If`'s outputs; names the branch defines that the outer graph also defines are renamed.
/// The input stays declared (a caller may keep feeding it); nothing reads it any more.
pub fn choose_branch(model: &ModelProto, input: &str, value: bool) -> Result<ModelProto> {
    let mut model = model.clone();
    let g = model.graph.as_mut().context("the model has no graph")?;
    let mut nodes = Vec::with_capacity(g.node.len());
    let mut taken: HashSet<String> = defined_names(g);
    // Node names too: a branch may reuse the outer graph's (tract needs them unique).
    let mut node_names: HashSet<String> = g.node.iter().map(|n| n.name.clone()).collect();
    for node in std::mem::take(&mut g.node) {
        if node.op_type != "If" || node.input.first().map(String::as_str) != Some(input) {
            nodes.push(node);
            continue;
        }
        let which = if value { "then_branch" } else { "else_branch" };
        let branch = node
            .attribute
            .iter()
            .find(|a| a.name == which && a.r#type == AttributeType::Graph as i32)
            .and_then(|a| a.g.clone())
            .with_context(|| format!("If node '{}' has no {which}", node.name))?;
        let mut inlined = inline(&node, branch, &mut taken, &mut g.initializer)?;
        for n in &mut inlined {
            if n.name.is_empty() || node_names.contains(&n.name) {
                n.name = fresh(&format!("{}/{}", node.name, n.op_type), &mut node_names);
            } else {
                node_names.insert(n.name.clone());
            }
        }
        nodes.extend(inlined);
    }
    g.node = nodes;
    Ok(model)
}

/// Every name the graph defines: inputs, initializers, node outputs.
fn defined_names(g: &GraphProto) -> HashSet<String> {
    g.input
        .iter()
        .map(|i| i.name.clone())
        .chain(g.initializer.iter().map(|t| t.name.clone()))
        .chain(g.node.iter().flat_map(|n| n.output.iter().cloned()))
        .collect()
}

/// The branch's nodes, writing the `If`'s outputs; its initializers join `initializers`.
fn inline(
    node: &NodeProto,
    mut branch: GraphProto,
    taken: &mut HashSet<String>,
    initializers: &mut Vec<crate::TensorProto>,
) -> Result<Vec<NodeProto>> {
    if branch.output.len() != node.output.len() {
        bail!(
            "If node '{}': its branch has {} outputs, the node {}",
            node.name,
            branch.output.len(),
            node.output.len()
        );
    }
    // Names the branch defines (not the If's own outputs) that are taken outside: renamed.
    let outputs: HashSet<&String> = node.output.iter().collect();
    let mut renames = std::collections::HashMap::new();
    let defined = branch
        .node
        .iter()
        .flat_map(|n| n.output.iter())
        .chain(branch.initializer.iter().map(|t| &t.name));
    for name in defined {
        if !name.is_empty() && taken.contains(name) && !outputs.contains(name) {
            renames.insert(name.clone(), fresh(name, taken));
        }
    }
    let rename = |s: &mut String| {
        if let Some(r) = renames.get(s.as_str()) {
            *s = r.clone();
        }
    };
    for t in &mut branch.initializer {
        rename(&mut t.name);
    }
    for n in &mut branch.node {
        n.input.iter_mut().for_each(rename);
        n.output.iter_mut().for_each(rename);
    }
    initializers.append(&mut branch.initializer);
    let mut nodes = branch.node;
    // Branch outputs under the If's names: an Identity where they differ.
    for (out, wanted) in branch.output.iter().zip(&node.output) {
        let mut produced = out.name.clone();
        rename(&mut produced);
        if &produced != wanted {
            nodes.push(NodeProto {
                name: format!("{}/{}", node.name, wanted),
                op_type: "Identity".into(),
                input: vec![produced],
                output: vec![wanted.clone()],
                ..NodeProto::default()
            });
        }
    }
    taken.extend(nodes.iter().flat_map(|n| n.output.iter().cloned()));
    Ok(nodes)
}

/// `name` with the first numeric suffix (`name.branch1`, `.branch2`...) not yet taken.
fn fresh(name: &str, taken: &mut HashSet<String>) -> String {
    let candidate = (1..)
        .map(|k| format!("{name}.branch{k}"))
        .find(|c| !taken.contains(c))
        .unwrap_or_default();
    taken.insert(candidate.clone());
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{type_proto, TensorShapeProto, TypeProto};
    use crate::{AttributeProto, ValueInfoProto};

    fn value(name: &str, elem: DataType, dims: &[i64]) -> ValueInfoProto {
        use crate::proto::tensor_shape_proto::{dimension::Value, Dimension};
        let dim = dims
            .iter()
            .map(|&d| Dimension {
                value: Some(Value::DimValue(d)),
                ..Dimension::default()
            })
            .collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: elem as i32,
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..TypeProto::default()
            }),
            ..ValueInfoProto::default()
        }
    }

    fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
        NodeProto {
            name: format!("{op}_{output}"),
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            ..NodeProto::default()
        }
    }

    fn branch(name: &str, op: &str, out: &str) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: AttributeType::Graph as i32,
            g: Some(GraphProto {
                // `t` is defined outside too: the branch's copy is renamed
                node: vec![node(op, &["x", "x"], "t"), node("Neg", &["t"], out)],
                output: vec![value(out, DataType::Float, &[2])],
                ..GraphProto::default()
            }),
            ..AttributeProto::default()
        }
    }

    /// `y = If(use_cache_branch, then: -(x + x), else: -(x · x))`, and `t = Abs(x)` outside.
    fn merged() -> ModelProto {
        let mut choose = node("If", &["use_cache_branch"], "y");
        choose.attribute = vec![
            branch("then_branch", "Add", "y"),
            branch("else_branch", "Mul", "z"),
        ];
        ModelProto {
            graph: Some(GraphProto {
                node: vec![node("Abs", &["x"], "t"), choose],
                input: vec![
                    value("x", DataType::Float, &[2]),
                    value("use_cache_branch", DataType::Bool, &[1]),
                ],
                output: vec![
                    value("y", DataType::Float, &[2]),
                    value("t", DataType::Float, &[2]),
                ],
                ..GraphProto::default()
            }),
            ..ModelProto::default()
        }
    }

    #[test]
    fn the_chosen_branch_replaces_the_if() {
        let m = merged();
        assert_eq!(branch_inputs(&m), ["use_cache_branch"]);
        let then = choose_branch(&m, "use_cache_branch", true).unwrap();
        let g = then.graph.unwrap();
        let ops: Vec<(&str, Vec<&str>, &str)> = g
            .node
            .iter()
            .map(|n| {
                (
                    n.op_type.as_str(),
                    n.input.iter().map(String::as_str).collect(),
                    n.output[0].as_str(),
                )
            })
            .collect();
        assert_eq!(
            ops,
            [
                ("Abs", vec!["x"], "t"),
                ("Add", vec!["x", "x"], "t.branch1"),
                ("Neg", vec!["t.branch1"], "y"),
            ]
        );
        // the else branch names its output z: an Identity gives it the If's name
        let other = choose_branch(&m, "use_cache_branch", false)
            .unwrap()
            .graph
            .unwrap();
        let last = other.node.last().unwrap();
        assert_eq!(
            (
                last.op_type.as_str(),
                last.input[0].as_str(),
                last.output[0].as_str()
            ),
            ("Identity", "z", "y")
        );
        assert_eq!(other.node[1].op_type, "Mul");
        // an input that feeds anything but an If's condition does not choose a branch
        let mut used = merged();
        let g = used.graph.as_mut().unwrap();
        g.node.push(node("Not", &["use_cache_branch"], "n"));
        assert!(branch_inputs(&used).is_empty());
    }
}
