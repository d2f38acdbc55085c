//! Exclusivity: the fused node replaces the block's nodes, so none of their outputs may be read
//! outside the block or be a graph output — except the block's own output, the
//! `qk_matmul_output` tap and a decoder's cache joins (`present_*`), which the fused node
//! produces.

use attnrt_onnx::node_label;

use super::placed::{Layout, Placed};
use crate::graph::GraphView;
use crate::mismatch::{Check, Mismatch};

/// Checks the placed block `p`, whose scores tensor `tap` (if any) the fused node outputs.
pub fn check(view: &GraphView, p: &Placed, tap: Option<&str>) -> Result<(), Mismatch> {
    if tap.is_some() && p.layout == Layout::Batched {
        return Err(Mismatch::new(
            node_label(view.node(p.core.qk)),
            Check::QkOutput,
            "a qk_matmul_output of the rank the graph reads",
            "qk_matmul_output of batched 3-D attention would have another rank",
        ));
    }
    let nodes = &p.core.nodes;
    for &n in nodes {
        let at = || node_label(view.node(n));
        for o in &view.node(n).output {
            let present =
                p.kv.as_ref()
                    .is_some_and(|kv| o == &kv.present_key || o == &kv.present_value);
            if o == &p.output || o.is_empty() || tap == Some(o.as_str()) || present {
                continue;
            }
            if view.is_graph_output(o) {
                return Err(Mismatch::new(
                    at(),
                    Check::Exclusive,
                    "intermediates used only inside the block",
                    format!("intermediate '{o}' is a graph output"),
                ));
            }
            if let Some(&c) = view.consumers(o).iter().find(|c| !nodes.contains(c)) {
                return Err(Mismatch::new(
                    at(),
                    Check::Exclusive,
                    "intermediates used only inside the block",
                    format!("intermediate '{o}' is also used by {}", view.label(c)),
                ));
            }
        }
    }
    Ok(())
}
