//! A decoder's context: how many positions it can take, read off its graph.
//!
//! A learned position table (GPT-2's `wpe`) or a constant rotary cos/sin table has one row per
//! position, and a position past its last row is out of range: tract panics inside the
//! `Gather`. Generation stops before that (or at a length the caller gives) and keeps the tokens
//! it made. A model whose positions are computed (LLaMA's rotary `inv_freq`) has no table and no
//! limit read here.

use std::collections::HashSet;

use attnrt_fusion::graph::GraphIndex;
use attnrt_onnx::opset::is_default_domain;
use attnrt_onnx::{ModelProto, NodeProto};
use serde::Serialize;

/// How many positions (prompt and generated tokens together) a generation may use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContextLimit {
    /// The number of positions.
    pub positions: usize,
    /// The position table it comes from (`None`: the caller's maximum length).
    pub table: Option<String>,
}

impl std::fmt::Display for ContextLimit {
    /// `the model's context of 128 positions (position table 'wpe' has 128 rows)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.positions;
        match &self.table {
            Some(t) => write!(
                f,
                "the model's context of {n} positions (position table '{t}' has {n} rows)"
            ),
            None => write!(f, "the maximum length of {n} positions"),
        }
    }
}

/// Ops whose output holds their first input's index values (reshaped, cast, broadcast,
/// repeated).
const KEEP_VALUES: [&str; 8] = [
    "Cast",
    "Identity",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Flatten",
    "Expand",
    "Tile",
];

/// The smallest position table of `model`: a `Gather` along axis 0 from a 2-D constant
/// (initializer or `Constant`) whose indices are positions, i.e. come from the `position_ids`
/// input or from a `Range` (positions computed from the past length), through ops that keep
/// the index values or offset them (`Add`, `Sub`). A token table is indexed by `input_ids`,
/// which reaches neither.
pub fn position_table(model: &ModelProto, position_ids: Option<&str>) -> Option<ContextLimit> {
    let graph = model.graph.as_ref()?;
    let index = GraphIndex::new(graph);
    let onnx = |n: &NodeProto| is_default_domain(&n.domain);
    let rows = |table: &str| match index.constant(table)?.dims[..] {
        // (a `Constant` of another domain is not ONNX's)
        [rows, _] if index.constant_node(table).is_none_or(onnx) => usize::try_from(rows).ok(),
        _ => None,
    };
    graph
        .node
        .iter()
        .filter(|n| n.op_type == "Gather" && onnx(n))
        .filter(|n| matches!(attnrt_onnx::attr::int(n, "axis"), Ok(None | Some(0 | -2))))
        .filter_map(|n| {
            let table = n.input.first()?;
            let rows = rows(table)?;
            let indices = n.input.get(1)?;
            is_position(indices, position_ids, &index).then(|| (rows, table.clone()))
        })
        .filter(|(rows, _)| *rows > 0)
        .min()
        .map(|(positions, table)| ContextLimit {
            positions,
            table: Some(table),
        })
}

/// Whether the values of `tensor` are positions (see [`position_table`]).
fn is_position(tensor: &str, position_ids: Option<&str>, index: &GraphIndex) -> bool {
    let mut frontier = vec![tensor];
    let mut seen = HashSet::new();
    while let Some(t) = frontier.pop() {
        if !seen.insert(t) || seen.len() > 64 {
            continue;
        }
        if Some(t) == position_ids {
            return true;
        }
        let Some(n) = index
            .producer_node(t)
            .filter(|n| is_default_domain(&n.domain))
        else {
            continue;
        };
        match n.op_type.as_str() {
            "Range" => return true,
            "Add" | "Sub" => frontier.extend(n.input.iter().take(2).map(String::as_str)),
            op if KEEP_VALUES.contains(&op) => frontier.extend(n.input.first().map(String::as_str)),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_testkit::{model, node, tensor_f32, GraphBuilder};

    /// Token table `wte` [10, 2] indexed by `input_ids`, position table `wpe` [6, 2] indexed by
    /// `pos` (the `position_ids` input, or a `Range` from the past length plus a cast).
    fn decoder(positions_from_range: bool) -> ModelProto {
        let mut g = GraphBuilder::new("d");
        g.initializer(tensor_f32("wte", &[10, 2], &[0.0; 20]));
        g.initializer(tensor_f32("wpe", &[6, 2], &[0.0; 12]));
        g.node(node("tok", "Gather", &["wte", "input_ids"], &["t"]));
        if positions_from_range {
            g.node(node("r", "Range", &["past", "total", "one"], &["range"]));
            g.node(node("c", "Cast", &["range"], &["pos"]));
        }
        let pos = if positions_from_range {
            "pos"
        } else {
            "position_ids"
        };
        g.node(node("where", "Gather", &["wpe", pos], &["p"]));
        g.node(node("sum", "Add", &["t", "p"], &["y"]));
        model(g.finish(), 17)
    }

    #[test]
    fn the_position_table_is_found_and_the_token_table_is_not() {
        for from_range in [false, true] {
            let c = position_table(&decoder(from_range), Some("position_ids")).unwrap();
            assert_eq!(c.positions, 6);
            assert_eq!(c.table.as_deref(), Some("wpe"));
            assert_eq!(
                c.to_string(),
                "the model's context of 6 positions (position table 'wpe' has 6 rows)"
            );
        }
        // Without the position_ids name, a table fed by that input is not known as one.
        assert_eq!(position_table(&decoder(false), None), None);
        assert_eq!(position_table(&decoder(true), None).unwrap().positions, 6);
    }
}
