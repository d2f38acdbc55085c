//! What a rewrite inserts: nodes and initializers, under fresh names.

use std::collections::HashSet;

use anyhow::{bail, Result};
use attnrt_onnx::{AttributeProto, GraphProto, NodeProto, TensorProto};

/// Names for the nodes and tensors a rewrite inserts: `<fused node>/<suffix>`, refused when the
/// graph already uses one.
pub(super) struct Names {
    prefix: String,
    existing: HashSet<String>,
}

impl Names {
    pub(super) fn new(graph: &GraphProto, prefix: &str) -> Names {
        let existing = graph
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
        Names {
            prefix: prefix.to_string(),
            existing,
        }
    }

    pub(super) fn fresh(&self, suffix: &str) -> Result<String> {
        let n = format!("{}/{suffix}", self.prefix);
        if self.existing.contains(&n) {
            bail!("name '{n}' is already used in the graph; cannot insert the fused block");
        }
        Ok(n)
    }
}

/// The nodes and initializers a rewrite inserts, in insertion order.
#[derive(Default)]
pub(super) struct Inserted {
    pub(super) nodes: Vec<NodeProto>,
    pub(super) inits: Vec<TensorProto>,
}

impl Inserted {
    /// Inserts a node; returns its first output.
    pub(super) fn node(
        &mut self,
        name: String,
        op_type: &str,
        inputs: Vec<String>,
        output: String,
        attribute: Vec<AttributeProto>,
    ) -> String {
        self.nodes.push(NodeProto {
            name,
            op_type: op_type.into(),
            input: inputs,
            output: vec![output.clone()],
            attribute,
            ..Default::default()
        });
        output
    }
}
