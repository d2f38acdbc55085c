//! Where a run's time goes: every planned node's evaluation is timed, and the times are summed
//! per op kind and ranked per node ([`crate::Session::run_profiled`]).
//!
//! A node's op kind is the ONNX op type of the node it came from. tract names a node after the
//! ONNX node (or, for an unnamed one, after its first output) and names what it derives from it
//! `name.suffix` or `name-suffix`; `OpKinds` maps a planned node back by the longest such
//! prefix that names a node of the model (so a `Pow` that attnrt runs as multiplications still
//! counts as `Pow`). A node tract made up with no ONNX origin keeps tract's op name. Graph
//! inputs and constants are not listed: their time, and everything outside the nodes (input
//! copies, run state, outputs), is the difference between the run time and the nodes' sum.

use std::collections::HashMap;
use std::time::Duration;

use attnrt_onnx::proto::GraphProto;
use serde::Serialize;

/// ONNX node name → op type, for the nodes of a model's top-level graph.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpKinds(HashMap<String, String>);

impl OpKinds {
    /// The op types of `g`'s nodes, under the names tract gives them.
    pub(crate) fn of_graph(g: &GraphProto) -> OpKinds {
        let mut kinds = HashMap::with_capacity(g.node.len());
        for n in &g.node {
            let name = if !n.name.is_empty() {
                n.name.as_str()
            } else {
                match n.output.first() {
                    Some(o) if !o.is_empty() => o.as_str(),
                    _ => continue,
                }
            };
            kinds.insert(name.to_string(), n.op_type.clone());
        }
        OpKinds(kinds)
    }

    /// The ONNX op type of the node a planned node named `name` came from, if any.
    pub(crate) fn kind_of(&self, name: &str) -> Option<&str> {
        let mut candidate = name;
        loop {
            if let Some(kind) = self.0.get(candidate) {
                return Some(kind);
            }
            let cut = candidate.rfind(['.', '-'])?;
            candidate = &candidate[..cut];
        }
    }
}

/// One planned node and its time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeTime {
    /// The planned node's name (the ONNX node's, with a suffix when tract derived it).
    pub node: String,
    /// Its op kind: the ONNX op type of the node it came from, else tract's op name.
    pub op: String,
    /// What ran: tract's name of the op (e.g. `AttnrtAttention`, `AttnrtProjection`).
    pub tract_op: String,
    /// Mean time per profiled run, in milliseconds.
    pub ms: f64,
    /// Share of the mean run time (0–1).
    pub share: f64,
}

/// The time of all nodes of one op kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpTime {
    /// The op kind (see [`NodeTime::op`]).
    pub op: String,
    /// Mean time per profiled run, in milliseconds.
    pub ms: f64,
    /// Share of the mean run time (0–1).
    pub share: f64,
    /// Number of planned nodes of this kind.
    pub nodes: usize,
}

/// A profile as reported: totals, every op kind, and the slowest nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileReport {
    /// Number of runs the times are the mean of.
    pub runs: usize,
    /// Mean wall time of a run, in milliseconds.
    pub run_ms: f64,
    /// Mean time inside the listed nodes, in milliseconds.
    pub ops_ms: f64,
    /// `run_ms − ops_ms` (not below 0): inputs, constants, run state, outputs.
    pub other_ms: f64,
    /// Per op kind, slowest first.
    pub by_op: Vec<OpTime>,
    /// The slowest nodes, slowest first.
    pub top_nodes: Vec<NodeTime>,
}

#[derive(Debug, Clone)]
struct NodeEntry {
    node: String,
    op: String,
    tract_op: String,
    total: Duration,
}

/// The times of one or more runs of a plan, per node, in plan order.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    runs: usize,
    wall: Duration,
    nodes: Vec<NodeEntry>,
}

impl Profile {
    /// A profile of one run: `(node, op kind, tract op, time)` per node in plan order, and the
    /// run's wall time.
    pub(crate) fn of_run(
        nodes: impl IntoIterator<Item = (String, String, String, Duration)>,
        wall: Duration,
    ) -> Profile {
        Profile {
            runs: 1,
            wall,
            nodes: nodes
                .into_iter()
                .map(|(node, op, tract_op, total)| NodeEntry {
                    node,
                    op,
                    tract_op,
                    total,
                })
                .collect(),
        }
    }

    /// Sets the wall time of this one-run profile.
    pub(crate) fn set_wall(&mut self, wall: Duration) {
        self.wall = wall;
    }

    /// Adds the runs of `other` (normally of the same plan; nodes are matched by name, and a
    /// node new to this profile is appended).
    pub fn merge(&mut self, other: Profile) {
        let mut at: HashMap<String, usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(ix, n)| (n.node.clone(), ix))
            .collect();
        self.runs += other.runs;
        self.wall += other.wall;
        for n in other.nodes {
            match at.get(&n.node) {
                Some(&ix) => self.nodes[ix].total += n.total,
                None => {
                    at.insert(n.node.clone(), self.nodes.len());
                    self.nodes.push(n);
                }
            }
        }
    }

    /// Number of runs profiled.
    pub fn runs(&self) -> usize {
        self.runs
    }

    fn mean_ms(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e3 / self.runs.max(1) as f64
    }

    fn share(&self, ms: f64) -> f64 {
        let run = self.run_ms();
        if run > 0.0 {
            ms / run
        } else {
            0.0
        }
    }

    /// Mean wall time of a run, in milliseconds.
    pub fn run_ms(&self) -> f64 {
        self.mean_ms(self.wall)
    }

    /// Mean time inside the listed nodes, in milliseconds.
    pub fn ops_ms(&self) -> f64 {
        self.mean_ms(self.nodes.iter().map(|n| n.total).sum())
    }

    /// Every listed node, in plan order.
    pub fn nodes(&self) -> Vec<NodeTime> {
        self.nodes
            .iter()
            .map(|n| {
                let ms = self.mean_ms(n.total);
                NodeTime {
                    node: n.node.clone(),
                    op: n.op.clone(),
                    tract_op: n.tract_op.clone(),
                    ms,
                    share: self.share(ms),
                }
            })
            .collect()
    }

    /// Time per op kind, slowest first (ties by name).
    pub fn by_op(&self) -> Vec<OpTime> {
        let mut kinds: Vec<(String, Duration, usize)> = Vec::new();
        let mut at: HashMap<&str, usize> = HashMap::new();
        for n in &self.nodes {
            let ix = *at.entry(n.op.as_str()).or_insert_with(|| {
                kinds.push((n.op.clone(), Duration::ZERO, 0));
                kinds.len() - 1
            });
            kinds[ix].1 += n.total;
            kinds[ix].2 += 1;
        }
        let mut out: Vec<OpTime> = kinds
            .into_iter()
            .map(|(op, total, nodes)| {
                let ms = self.mean_ms(total);
                OpTime {
                    op,
                    ms,
                    share: self.share(ms),
                    nodes,
                }
            })
            .collect();
        out.sort_by(|a, b| b.ms.total_cmp(&a.ms).then_with(|| a.op.cmp(&b.op)));
        out
    }

    /// The `n` slowest nodes, slowest first (ties in plan order).
    pub fn top_nodes(&self, n: usize) -> Vec<NodeTime> {
        let mut nodes = self.nodes();
        nodes.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        nodes.truncate(n);
        nodes
    }

    /// The report of this profile with the `top` slowest nodes.
    pub fn report(&self, top: usize) -> ProfileReport {
        let (run_ms, ops_ms) = (self.run_ms(), self.ops_ms());
        ProfileReport {
            runs: self.runs,
            run_ms,
            ops_ms,
            other_ms: (run_ms - ops_ms).max(0.0),
            by_op: self.by_op(),
            top_nodes: self.top_nodes(top),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_testkit::{node, GraphBuilder};

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn entry(node: &str, op: &str, t: u64) -> (String, String, String, Duration) {
        (node.into(), op.into(), format!("tract{op}"), ms(t))
    }

    #[test]
    fn kinds_map_back_by_the_longest_named_prefix() {
        let mut g = GraphBuilder::new("g");
        g.node(node("/h.0/mlp/Pow", "Pow", &["x", "e"], &["p"]));
        g.node(node("", "Tanh", &["p"], &["t.0"]));
        g.node(node("/h.0", "Relu", &["t.0"], &["y"]));
        let kinds = OpKinds::of_graph(g.graph());
        assert_eq!(kinds.kind_of("/h.0/mlp/Pow"), Some("Pow"));
        assert_eq!(kinds.kind_of("/h.0/mlp/Pow.attnrt_pow_sq"), Some("Pow"));
        assert_eq!(kinds.kind_of("t.0-recip.fix"), Some("Tanh"));
        assert_eq!(kinds.kind_of("/h.0.pack"), Some("Relu"));
        assert_eq!(kinds.kind_of("/h"), None);
        assert_eq!(kinds.kind_of("made.up"), None);
    }

    #[test]
    fn kinds_and_nodes_are_summed_and_ranked() {
        let mut p = Profile::of_run(
            [
                entry("a", "MatMul", 4),
                entry("b", "Add", 1),
                entry("c", "MatMul", 2),
            ],
            ms(10),
        );
        p.merge(Profile::of_run(
            [
                entry("a", "MatMul", 6),
                entry("b", "Add", 1),
                entry("c", "MatMul", 2),
            ],
            ms(10),
        ));
        let r = p.report(2);
        assert_eq!(r.runs, 2);
        assert!((r.run_ms - 10.0).abs() < 1e-9);
        assert!((r.ops_ms - 8.0).abs() < 1e-9);
        assert!((r.other_ms - 2.0).abs() < 1e-9);
        let kinds: Vec<(&str, usize)> = r.by_op.iter().map(|k| (k.op.as_str(), k.nodes)).collect();
        assert_eq!(kinds, [("MatMul", 2), ("Add", 1)]);
        assert!((r.by_op[0].ms - 7.0).abs() < 1e-9);
        assert!((r.by_op[0].share - 0.7).abs() < 1e-9);
        let top: Vec<&str> = r.top_nodes.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(top, ["a", "c"]);
        assert_eq!(r.top_nodes[0].tract_op, "tractMatMul");
    }

    #[test]
    fn an_empty_profile_reports_zeros() {
        let r = Profile::default().report(10);
        assert_eq!((r.runs, r.run_ms, r.other_ms), (0, 0.0, 0.0));
        assert!(r.by_op.is_empty() && r.top_nodes.is_empty());
    }
}
