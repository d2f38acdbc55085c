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
//! `Where(IsNaN(p), 0, p)` is one pattern). A failed match is a [`Mismatch`] naming the node and
//! the check, never just "no".
//!
//! Skip-through: where an op pattern finds a node that is the identity at inference
//! (`Identity`, `Dropout` in inference mode, `Cast` to the same type; see
//! [`crate::graph::skip`]) instead of one of its ops, it looks through it and records it in
//! [`Captures::skipped`]; a `Dropout` that may run in training mode stops the match there.

use std::collections::BTreeMap;

use attnrt_onnx::passthrough::Passthrough;
use attnrt_onnx::NodeProto;

use crate::graph::{skip, GraphView, Value};
use crate::mismatch::{Check, Mismatch};

/// A predicate on a matched node (attributes, constant inputs).
pub type NodeCheck = fn(&GraphView, &NodeProto) -> Result<(), Mismatch>;

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
    /// Skip-through nodes looked through, in match order (outermost first along each input).
    pub skipped: Skipped,
}

/// Skip-through nodes looked through, with their kinds.
pub type Skipped = Vec<(usize, Passthrough)>;

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

    fn bind_tensor(&mut self, name: &'static str, tensor: &str) -> Result<(), Mismatch> {
        match self.tensors.get(name) {
            Some(t) if t != tensor => Err(Mismatch::new(
                format!("'{tensor}'"),
                Check::Binding,
                format!("'{name}' to be '{t}' as elsewhere in the pattern"),
                format!("'{tensor}'"),
            )),
            Some(_) => Ok(()),
            None => {
                self.tensors.insert(name, tensor.to_string());
                Ok(())
            }
        }
    }
}

/// How a tensor is named in a failure: its producer's label, else the name quoted.
fn where_(view: &GraphView, tensor: &str) -> String {
    view.producer(tensor)
        .map(|p| attnrt_onnx::node_label(view.node(p)))
        .unwrap_or_else(|| format!("'{tensor}'"))
}

/// Matches `pat` against `tensor`, adding to `caps`. On failure `caps` may hold partial
/// bindings; callers that retry pass a clone.
pub fn match_tensor(
    view: &GraphView,
    tensor: &str,
    pat: &Pat,
    caps: &mut Captures,
) -> Result<(), Mismatch> {
    match pat {
        Pat::Any(name) => caps.bind_tensor(name, tensor),
        Pat::Scalar(name) => match view.value(tensor) {
            Some(v @ (Value::Floats(..) | Value::Ints(..))) if v.scalar_f64().is_some() => {
                caps.bind_tensor(name, tensor)
            }
            _ => Err(Mismatch::new(
                where_(view, tensor),
                Check::KnownValue,
                format!("{name}: a single number known before run time"),
                format!("'{tensor}' is not a single number known before run time"),
            )),
        },
        Pat::Alt(alts) => match_alt(view, tensor, alts, caps),
        Pat::Op(o) => match_op(view, tensor, o, caps),
    }
}

/// The first alternative that matches, its tag recorded; else every alternative's failure.
fn match_alt(
    view: &GraphView,
    tensor: &str,
    alts: &[(&'static str, Pat)],
    caps: &mut Captures,
) -> Result<(), Mismatch> {
    let mut failures: Vec<Mismatch> = Vec::new();
    for (tag, p) in alts {
        let mut trial = caps.clone();
        match match_tensor(view, tensor, p, &mut trial) {
            Ok(()) => {
                trial.tags.push(tag);
                *caps = trial;
                return Ok(());
            }
            Err(m) => failures.push(m),
        }
    }
    // Every variant stopped at the same node for the same reason (a Dropout in training mode
    // before any of them): that is the failure.
    if failures.windows(2).all(|w| w[0] == w[1]) {
        if let Some(m) = failures.pop() {
            return Err(m);
        }
    }
    let reasons: Vec<String> = alts
        .iter()
        .zip(&failures)
        .map(|((tag, _), m)| format!("{tag}: at {}: {}", m.node, m.reason()))
        .collect();
    let tags: Vec<&str> = alts.iter().map(|(t, _)| *t).collect();
    Err(Mismatch::new(
        where_(view, tensor),
        Check::Variant,
        format!("one of the variants {}", tags.join(", ")),
        format!("no variant matched ({})", reasons.join("; ")),
    ))
}

/// A node of one of `o.ops` producing `tensor`, with inputs matching `o.inputs`.
fn match_op(
    view: &GraphView,
    tensor: &str,
    o: &OpPat,
    caps: &mut Captures,
) -> Result<(), Mismatch> {
    // `tensor` becomes the node's own output when skip-through nodes were looked through.
    let (idx, tensor, skipped) = producer_of(view, tensor, o)?;
    let node = view.node(idx);
    let label = || attnrt_onnx::node_label(node);
    let inputs: Vec<&str> = node.input.iter().map(String::as_str).collect();
    if inputs.len() != o.inputs.len() {
        return Err(Mismatch::new(
            label(),
            Check::Inputs,
            format!("{}: {} inputs", o.name, o.inputs.len()),
            format!("{} inputs", inputs.len()),
        ));
    }
    for check in &o.checks {
        check(view, node)?;
    }
    match caps.nodes.get(o.name) {
        Some(&prev) if prev != idx => {
            return Err(Mismatch::new(
                label(),
                Check::Binding,
                format!(
                    "'{}' to be {} as elsewhere in the pattern",
                    o.name,
                    attnrt_onnx::node_label(view.node(prev))
                ),
                "another node".to_string(),
            ))
        }
        _ => {}
    }
    let orders: &[&[usize]] = if o.commutative && inputs.len() == 2 {
        &[&[0, 1], &[1, 0]]
    } else {
        &[&[]]
    };
    let mut last = None;
    for order in orders {
        let mut trial = caps.clone();
        let res = o.inputs.iter().enumerate().try_for_each(|(k, p)| {
            let i = order.get(k).copied().unwrap_or(k);
            match_tensor(view, inputs[i], p, &mut trial)
        });
        match res {
            Ok(()) => {
                trial.nodes.insert(o.name, idx);
                trial.skipped.extend(skipped.iter().copied());
                trial.bind_tensor(o.name, tensor)?;
                *caps = trial;
                return Ok(());
            }
            Err(f) => last = Some(f),
        }
    }
    Err(last.expect("at least one input order is tried"))
}

/// The node producing `tensor`, which must be one of `o.ops` (default domain), looking through
/// skip-through nodes; with the tensor it produces and the nodes looked through.
fn producer_of<'a>(
    view: &GraphView<'a>,
    tensor: &'a str,
    o: &OpPat,
) -> Result<(usize, &'a str, Skipped), Mismatch> {
    let expected = || format!("{}: {} producing '{tensor}'", o.name, o.ops.join("|"));
    let mut skipped = Vec::new();
    let mut t = tensor;
    loop {
        let Some(idx) = view.producer(t) else {
            return Err(Mismatch::new(
                format!("'{t}'"),
                Check::OpType,
                expected(),
                "not produced by a node",
            ));
        };
        let node = view.node(idx);
        let default = attnrt_onnx::opset::is_default_domain(&node.domain);
        if default && o.ops.contains(&node.op_type.as_str()) {
            return Ok((idx, t, skipped));
        }
        match view.passthrough(idx) {
            Ok(kind) => {
                skipped.push((idx, kind));
                t = &node.input[0];
            }
            Err(Some(_)) => {
                return Err(Mismatch::new(
                    attnrt_onnx::node_label(node),
                    Check::SkipThrough,
                    skip::EXPECTED,
                    view.why_not_passthrough(idx).unwrap_or_default(),
                ))
            }
            Err(None) => {
                return Err(Mismatch::new(
                    attnrt_onnx::node_label(node),
                    Check::OpType,
                    expected(),
                    format!("{}{}", domain_prefix(&node.domain), node.op_type),
                ))
            }
        }
    }
}

fn domain_prefix(domain: &str) -> String {
    if attnrt_onnx::opset::is_default_domain(domain) {
        String::new()
    } else {
        format!("{domain}::")
    }
}
