//! Nodes that are the identity at inference (`Identity`, `Dropout` in inference mode with its
//! mask unused, `Cast` to the type its input already has; [`attnrt_onnx::passthrough`]
//! decides) are removed: their readers read the passed-on tensor directly, so tract builds a
//! smaller graph: on a chain of 200k `Identity` nodes tract's own per-node cost when wiring (a
//! scan of the nodes already wired) made building quadratic.
//!
//! Kept on purpose: a node whose output is a graph output (the name a user reads must stay),
//! every node of a graph with subgraphs (an `If`/`Loop` body may read any outer name), and
//! every node [`attnrt_onnx::passthrough::classify`] does not prove to be an identity (e.g. a
//! `Dropout` in training mode, a `Cast` whose input type is unknown).

use std::collections::{HashMap, HashSet};

use attnrt_onnx::passthrough::{self, PassthroughFacts};
use attnrt_onnx::proto::{tensor_proto, AttributeProto, GraphProto, ModelProto};
use attnrt_onnx::DataType;
use tract_onnx::pb::GraphProto as TractGraph;

use super::declared_types;

/// The plan: which nodes (by index) go, and what each removed output is read as instead.
#[derive(Debug, Default)]
struct IdentityRemoval {
    /// Per node of the top-level graph: removed.
    pub removed: Vec<bool>,
    /// Output of a removed node → the tensor it passes on (chains resolved).
    pub alias: HashMap<String, String>,
}

impl IdentityRemoval {
    /// How many nodes go.
    pub fn count(&self) -> usize {
        self.removed.iter().filter(|r| **r).count()
    }

    /// The name a reader of `tensor` reads once the removed nodes are gone.
    pub fn resolve<'a>(&'a self, tensor: &'a str) -> &'a str {
        self.alias.get(tensor).map_or(tensor, String::as_str)
    }
}

/// Element types and constant booleans known before run time: graph inputs, initializers,
/// `value_info`, `Constant` nodes, and the outputs of removed nodes (their input's type).
struct Facts<'a> {
    types: HashMap<&'a str, i32>,
    bools: HashMap<&'a str, bool>,
}

impl PassthroughFacts for Facts<'_> {
    fn elem_type(&self, tensor: &str) -> Option<i32> {
        self.types.get(tensor).copied()
    }

    fn constant_bool(&self, tensor: &str) -> Option<bool> {
        self.bools.get(tensor).copied()
    }
}

/// A one-element boolean tensor's value (`int32_data` or `raw_data`, as ONNX stores bools).
fn bool_scalar(t: &attnrt_onnx::proto::TensorProto) -> Option<bool> {
    if t.data_type != DataType::Bool as i32 || t.dims.iter().product::<i64>() != 1 {
        return None;
    }
    if t.data_location == tensor_proto::DataLocation::External as i32 {
        return None;
    }
    match (t.int32_data.as_slice(), &t.raw_data[..]) {
        ([v], _) => Some(*v != 0),
        ([], [b]) => Some(*b != 0),
        _ => None,
    }
}

fn constant_bools(g: &GraphProto) -> HashMap<&str, bool> {
    let mut bools: HashMap<&str, bool> = g
        .initializer
        .iter()
        .filter_map(|t| Some((t.name.as_str(), bool_scalar(t)?)))
        .collect();
    for n in g
        .node
        .iter()
        .filter(|n| n.op_type == "Constant" && n.domain.is_empty())
    {
        let value = n
            .attribute
            .iter()
            .find(|a| a.name == "value")
            .and_then(|a| a.t.as_ref());
        if let (Some(out), Some(v)) = (n.output.first(), value.and_then(bool_scalar)) {
            bools.insert(out.as_str(), v);
        }
    }
    bools
}

fn has_subgraph(a: &AttributeProto) -> bool {
    a.g.is_some() || !a.graphs.is_empty()
}

/// Which nodes of `model`'s graph are identities at inference that can go (see the module
/// docs). Linear in the size of the graph.
fn plan_identity_removal(model: &ModelProto, opset: i64) -> IdentityRemoval {
    let Some(g) = model.graph.as_ref() else {
        return IdentityRemoval::default();
    };
    let mut plan = IdentityRemoval {
        removed: vec![false; g.node.len()],
        alias: HashMap::new(),
    };
    if g.node.iter().any(|n| n.attribute.iter().any(has_subgraph)) {
        return plan;
    }
    let outputs: HashSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    let mut facts = Facts {
        types: declared_types(g),
        bools: constant_bools(g),
    };
    let mut read: HashSet<&str> = HashSet::new();
    for n in &g.node {
        read.extend(n.input.iter().map(String::as_str));
    }
    for (ix, n) in g.node.iter().enumerate() {
        let (Some(input), Some(output)) = (n.input.first(), n.output.first()) else {
            continue;
        };
        let extra_outputs_unused =
            n.output.iter().skip(1).all(|o| {
                o.is_empty() || !read.contains(o.as_str()) && !outputs.contains(o.as_str())
            });
        if input.is_empty()
            || outputs.contains(output.as_str())
            || !extra_outputs_unused
            || passthrough::classify(n, opset, &facts).is_err()
        {
            continue;
        }
        let source = plan.resolve(input).to_string();
        if let Some(t) = facts.types.get(source.as_str()).copied() {
            facts.types.insert(output.as_str(), t);
        }
        plan.alias.insert(output.clone(), source);
        plan.removed[ix] = true;
    }
    plan
}

/// The pass: the identities of `model`'s graph leave `g`, tract's copy of it (the same nodes,
/// in the same order: this pass runs before any pass that adds or removes nodes).
pub(super) fn remove_identities(model: &ModelProto, g: &mut TractGraph) {
    let opset = attnrt_onnx::opset::default_version(model).unwrap_or(1);
    apply(g, &plan_identity_removal(model, opset));
}

/// Applies `plan` to the graph tract will read (the same nodes, in the same order, as the
/// graph the plan was made on): removed nodes go, their readers read the passed-on tensor.
fn apply(g: &mut TractGraph, plan: &IdentityRemoval) {
    if plan.count() == 0 || plan.removed.len() != g.node.len() {
        return;
    }
    let nodes = std::mem::take(&mut g.node);
    g.node = nodes
        .into_iter()
        .zip(&plan.removed)
        .filter(|(_, removed)| !**removed)
        .map(|(mut n, _)| {
            for i in &mut n.input {
                if let Some(a) = plan.alias.get(i.as_str()) {
                    *i = a.clone();
                }
            }
            n
        })
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_onnx::attr::make_int;
    use attnrt_testkit::{float_value, node, node_with_attrs, tensor_bool, GraphBuilder};

    fn plan_of(build: impl FnOnce(&mut GraphBuilder)) -> IdentityRemoval {
        let mut g = GraphBuilder::new("g");
        g.input(float_value("x", &[4]));
        build(&mut g);
        plan_identity_removal(&g.into_model(17), 17)
    }

    #[test]
    fn a_chain_of_identities_resolves_to_its_source() {
        let p = plan_of(|g| {
            g.node(node("a", "Identity", &["x"], &["t1"]));
            g.node(node("b", "Dropout", &["t1"], &["t2"]));
            g.node(node_with_attrs(
                "c",
                "Cast",
                &["t2"],
                &["t3"],
                vec![make_int("to", 1)],
            ));
            g.node(node("d", "Relu", &["t3"], &["y"]));
            g.output(float_value("y", &[4]));
        });
        assert_eq!(p.removed, [true, true, true, false]);
        assert_eq!(p.resolve("t3"), "x");
    }

    #[test]
    fn graph_outputs_training_dropouts_and_unknown_casts_stay() {
        let p = plan_of(|g| {
            g.initializer(tensor_bool("on", &[], &[true]));
            g.node(node("train", "Dropout", &["x", "", "on"], &["t1"]));
            g.node(node_with_attrs(
                "cast",
                "Cast",
                &["t1"],
                &["t2"],
                vec![make_int("to", 1)],
            ));
            g.node(node("to_int", "Cast", &["x"], &["i"]));
            g.node(node("out", "Identity", &["t2"], &["y"]));
            g.output(float_value("y", &[4]));
        });
        // The Dropout is in training mode, the Cast after it reads a tensor of unknown type,
        // the Cast without `to` is malformed, and `y` is a graph output.
        assert_eq!(p.removed, [false, false, false, false]);
        assert_eq!(p.count(), 0);
    }

    #[test]
    fn a_used_dropout_mask_keeps_the_dropout() {
        let p = plan_of(|g| {
            g.node(node("drop", "Dropout", &["x"], &["t1", "mask"]));
            g.node(node("not", "Not", &["mask"], &["y"]));
            g.output(float_value("y", &[4]));
        });
        assert_eq!(p.removed, [false, false]);
    }
}
