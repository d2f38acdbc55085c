//! Skip-through nodes: `Identity`, `Dropout` in inference mode and `Cast` to the type its input
//! already has pass their first input through unchanged at inference
//! ([`attnrt_onnx::passthrough`] says which, or why not). The rules look through them anywhere
//! inside an attention block; the ones inside are removed with the block.

use attnrt_onnx::passthrough::{self, Passthrough, PassthroughFacts};

use super::{GraphView, Value};

/// What a node inside a block must be when it is none of the block's ops (the `expected` of a
/// failed skip-through check).
pub const EXPECTED: &str = "a node that is the identity at inference (Identity, Dropout in \
                            inference mode, Cast to the same type)";

/// How many skip-through nodes in a row are followed.
const MAX_SKIPS: usize = 16;

impl PassthroughFacts for GraphView<'_> {
    fn elem_type(&self, tensor: &str) -> Option<i32> {
        GraphView::elem_type(self, tensor)
    }

    fn constant_bool(&self, tensor: &str) -> Option<bool> {
        if !self.is_constant(tensor) {
            return None;
        }
        match self.value(tensor)? {
            Value::Bools(_, v) if v.len() == 1 => Some(v[0]),
            _ => None,
        }
    }
}

/// The word a report uses for a kind of skip-through node.
pub fn kind_name(kind: Passthrough) -> &'static str {
    match kind {
        Passthrough::Identity => "identity",
        Passthrough::Dropout => "dropout",
        Passthrough::SameTypeCast => "cast",
    }
}

impl GraphView<'_> {
    /// Whether node `idx` is a skip-through node: `Ok` with its kind, or `Err` with why not
    /// (`None` for op types that never are).
    pub fn passthrough(&self, idx: usize) -> Result<Passthrough, Option<String>> {
        passthrough::classify(self.node(idx), self.opset(), self)
    }

    /// Why node `idx` is not a skip-through node, without its label (the failure names the
    /// node): `None` when its op type never is one.
    pub fn why_not_passthrough(&self, idx: usize) -> Option<String> {
        let why = self.passthrough(idx).err()??;
        let label = attnrt_onnx::node_label(self.node(idx));
        Some(
            why.strip_prefix(&format!("{label}: "))
                .map_or(why.clone(), str::to_string),
        )
    }

    /// `t` seen through the skip-through nodes that produce it: the tensor they pass on, and
    /// the nodes looked through (outermost first).
    pub fn skip_producers(&self, t: &str) -> (String, Vec<usize>) {
        let mut cur = t.to_string();
        let mut skipped = Vec::new();
        while skipped.len() < MAX_SKIPS {
            let Some(p) = self.producer(&cur) else { break };
            if self.passthrough(p).is_err() {
                break;
            }
            skipped.push(p);
            cur = self.node(p).input[0].clone();
        }
        (cur, skipped)
    }

    /// The one node reading `t`, looking through skip-through nodes that are its one reader
    /// and whose other outputs nobody reads: the reader and the nodes looked through. `Err`
    /// with what `t` (or a tensor looked through) has instead, to follow its name in a message
    /// (`has several consumers`): several readers, none, or one in a subgraph.
    pub fn sole_reader(&self, t: &str) -> Result<(usize, Vec<usize>), String> {
        let mut cur = t;
        let mut skipped = Vec::new();
        loop {
            let c = match self.consumers(cur) {
                [c] if self.in_subgraph(*c) => {
                    return Err(format!("is read by {}", self.label(*c)))
                }
                [c] => *c,
                [] => return Err("has no consumer".into()),
                _ => return Err("has several consumers".into()),
            };
            let n = self.node(c);
            let passes = skipped.len() < MAX_SKIPS
                && n.input.first().map(String::as_str) == Some(cur)
                && self.passthrough(c).is_ok()
                && n.output.iter().skip(1).all(|o| self.unread(o));
            if !passes {
                return Ok((c, skipped));
            }
            skipped.push(c);
            cur = n.output.first().ok_or("has a reader without outputs")?;
        }
    }

    /// Whether nobody reads `t` (no node, not a graph output).
    pub fn unread(&self, t: &str) -> bool {
        t.is_empty() || (self.consumers(t).is_empty() && !self.is_graph_output(t))
    }
}
