//! A small declarative pattern language over a [`GraphView`].
//!
//! A pattern is the subgraph it matches, written from the root tensor upwards:
//!
//! ```text
//! op("context", &["MatMul"], [probs(), any("v")])
//! ```
//!
//! matches a `MatMul` producing the tensor, whose first input matches `probs()` and whose second
//! input is anything (captured as `v`). [`Pat::Alt`] lists exporter variants under a tag;
//! commutative ops try both input orders; a name captured twice must bind the same tensor (so
//! `Where(IsNaN(p), 0, p)` is one pattern). A failed match says why, never just "no".

use std::collections::BTreeMap;

use attnrt_onnx::NodeProto;

use crate::graph::{GraphView, Value};

/// A predicate on a matched node (attributes, constant inputs); `Err` says what was expected.
pub type NodeCheck = fn(&GraphView, &NodeProto) -> Result<(), String>;

/// A pattern for the tensor at some position.
#[derive(Clone)]
pub enum Pat {
    /// Any tensor, captured under the name.
    Any(&'static str),
    /// A tensor whose value is a single number known before run time (a constant, or computed
    /// from static shapes), captured under the name.
    Scalar(&'static str),
    /// A tensor produced by a node of one of these op types.
    Op(Box<OpPat>),
    /// The first alternative that matches; its tag is recorded in [`Captures::tags`].
    Alt(Vec<(&'static str, Pat)>),
}

/// The node part of [`Pat::Op`].
#[derive(Clone)]
pub struct OpPat {
    /// Capture name for the node (and its output tensor).
    pub name: &'static str,
    /// Accepted op types (default domain).
    pub ops: &'static [&'static str],
    /// Patterns for the inputs, in order. Extra inputs of the node are not allowed.
    pub inputs: Vec<Pat>,
    /// Whether a two-input op may match its inputs in either order.
    pub commutative: bool,
    /// Extra predicates on the node.
    pub checks: Vec<NodeCheck>,
}

/// `any(name)`: any tensor.
pub fn any(name: &'static str) -> Pat {
    Pat::Any(name)
}

/// `scalar(name)`: a single-element value known before run time.
pub fn scalar(name: &'static str) -> Pat {
    Pat::Scalar(name)
}

/// `op(name, ops, inputs)`: a node of one of `ops` with these inputs.
pub fn op<const N: usize>(
    name: &'static str,
    ops: &'static [&'static str],
    inputs: [Pat; N],
) -> Pat {
    Pat::Op(Box::new(OpPat {
        name,
        ops,
        inputs: inputs.into(),
        commutative: false,
        checks: vec![],
    }))
}

/// Alternatives, tried in order.
pub fn alt<const N: usize>(alts: [(&'static str, Pat); N]) -> Pat {
    Pat::Alt(alts.into())
}

impl Pat {
    /// The same op pattern, matching its two inputs in either order.
    pub fn commutative(mut self) -> Pat {
        if let Pat::Op(o) = &mut self {
            o.commutative = true;
        }
        self
    }

    /// The same op pattern with one more node predicate.
    pub fn check(mut self, f: NodeCheck) -> Pat {
        if let Pat::Op(o) = &mut self {
            o.checks.push(f);
        }
        self
    }
}

/// What a match bound.
#[derive(Clone, Debug, Default)]
pub struct Captures {
    /// Captured tensors by name (for `Op` captures: the node's matched output).
    pub tensors: BTreeMap<&'static str, String>,
    /// Captured nodes by name (indices into the graph's node list).
    pub nodes: BTreeMap<&'static str, usize>,
    /// Tags of the alternatives taken, in match order.
    pub tags: Vec<&'static str>,
}

impl Captures {
    /// The tensor captured as `name`.
    pub fn tensor(&self, name: &str) -> Option<&str> {
        self.tensors.get(name).map(String::as_str)
    }

    /// The node captured as `name`.
    pub fn node(&self, name: &str) -> Option<usize> {
        self.nodes.get(name).copied()
    }

    /// Whether the alternative tagged `tag` was taken.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.contains(&tag)
    }

    fn bind_tensor(&mut self, name: &'static str, tensor: &str) -> Result<(), Failure> {
        match self.tensors.get(name) {
            Some(t) if t != tensor => Err(Failure::new(
                tensor,
                format!("'{name}' is bound to '{t}', not '{tensor}'"),
            )),
            Some(_) => Ok(()),
            None => {
                self.tensors.insert(name, tensor.to_string());
                Ok(())
            }
        }
    }
}

/// Why a pattern did not match: the tensor where it failed and what was expected.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The tensor where matching stopped.
    pub tensor: String,
    /// What was expected there.
    pub reason: String,
}

impl Failure {
    fn new(tensor: &str, reason: String) -> Failure {
        Failure {
            tensor: tensor.to_string(),
            reason,
        }
    }
}

/// Matches `pat` against `tensor`, adding to `caps`. On failure `caps` may hold partial
/// bindings; callers that retry pass a clone.
pub fn match_tensor(
    view: &GraphView,
    tensor: &str,
    pat: &Pat,
    caps: &mut Captures,
) -> Result<(), Failure> {
    match pat {
        Pat::Any(name) => caps.bind_tensor(name, tensor),
        Pat::Scalar(name) => match view.value(tensor) {
            Some(v @ (Value::Floats(..) | Value::Ints(..))) if v.scalar_f64().is_some() => {
                caps.bind_tensor(name, tensor)
            }
            _ => Err(Failure::new(
                tensor,
                format!("{name}: '{tensor}' is not a single number known before run time"),
            )),
        },
        Pat::Alt(alts) => {
            let mut reasons = Vec::new();
            for (tag, p) in alts {
                let mut trial = caps.clone();
                match match_tensor(view, tensor, p, &mut trial) {
                    Ok(()) => {
                        trial.tags.push(tag);
                        *caps = trial;
                        return Ok(());
                    }
                    Err(f) => reasons.push(format!("{tag}: {}", f.reason)),
                }
            }
            Err(Failure::new(
                tensor,
                format!("no variant matched ({})", reasons.join("; ")),
            ))
        }
        Pat::Op(o) => {
            let Some(idx) = view.producer(tensor) else {
                return Err(Failure::new(
                    tensor,
                    format!(
                        "{}: '{tensor}' is not produced by a node (expected {})",
                        o.name,
                        o.ops.join("|")
                    ),
                ));
            };
            let node = view.node(idx);
            if !attnrt_onnx::opset::is_default_domain(&node.domain)
                || !o.ops.contains(&node.op_type.as_str())
            {
                return Err(Failure::new(
                    tensor,
                    format!(
                        "{}: expected {} producing '{tensor}', found {} ({})",
                        o.name,
                        o.ops.join("|"),
                        node.op_type,
                        attnrt_onnx::node_label(node)
                    ),
                ));
            }
            let inputs: Vec<&str> = node.input.iter().map(String::as_str).collect();
            if inputs.len() != o.inputs.len() {
                return Err(Failure::new(
                    tensor,
                    format!(
                        "{}: {} has {} inputs, expected {}",
                        o.name,
                        attnrt_onnx::node_label(node),
                        inputs.len(),
                        o.inputs.len()
                    ),
                ));
            }
            for check in &o.checks {
                check(view, node).map_err(|r| {
                    Failure::new(
                        tensor,
                        format!("{} {}: {r}", o.name, attnrt_onnx::node_label(node)),
                    )
                })?;
            }
            match caps.nodes.get(o.name) {
                Some(&prev) if prev != idx => {
                    return Err(Failure::new(
                        tensor,
                        format!("'{}' bound to another node", o.name),
                    ))
                }
                _ => {}
            }
            let orders: Vec<Vec<usize>> = if o.commutative && inputs.len() == 2 {
                vec![vec![0, 1], vec![1, 0]]
            } else {
                vec![(0..inputs.len()).collect()]
            };
            let mut last = None;
            for order in orders {
                let mut trial = caps.clone();
                let res = order
                    .iter()
                    .zip(&o.inputs)
                    .try_for_each(|(&i, p)| match_tensor(view, inputs[i], p, &mut trial));
                match res {
                    Ok(()) => {
                        trial.nodes.insert(o.name, idx);
                        trial.bind_tensor(o.name, tensor)?;
                        *caps = trial;
                        return Ok(());
                    }
                    Err(f) => last = Some(f),
                }
            }
            Err(last.unwrap_or_else(|| Failure::new(tensor, "no input order matched".into())))
        }
    }
}
