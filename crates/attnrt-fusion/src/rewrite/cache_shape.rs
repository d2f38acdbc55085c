//! `Shape` of a cache join the block's inputs are computed from (GPT-2 slices its causal mask
//! to the key length `Shape(present_key)[2]`): the fused node produces the join, so it cannot
//! also feed the mask. The shape is computed from what the join reads instead:
//!
//! ```text
//! Shape(present)[s:e] = Shape(past)[s:e] + Shape(new)[s:e] · [0, 0, 1, 0][s:e]
//! ```
//!
//! (the join is on axis 2 of rank-4 tensors, so only that size adds up).

use anyhow::{Context, Result};
use attnrt_onnx::{attr, node_label, tensor, GraphProto};

use super::inserted::{Inserted, Names};
use crate::rules::kv_cache::KvCache;

/// The join's axis in a rank-4 tensor.
const JOIN_AXIS: usize = 2;

/// Inserts, for every recorded `Shape` reader of a join, the nodes that compute its output
/// from the past and this step's shapes (the reader itself is removed with the block).
pub(super) fn replace_readers(
    graph: &GraphProto,
    kv: &KvCache,
    names: &Names,
    new: &mut Inserted,
) -> Result<()> {
    for (i, &idx) in kv.shape_readers.iter().enumerate() {
        let n = &graph.node[idx];
        let (past, step) = if n.input[0] == kv.present_key {
            (&kv.past_key, &kv.new_key)
        } else {
            (&kv.past_value, &kv.new_value)
        };
        let (start, end) =
            shape_range(n).with_context(|| format!("{}: start/end of Shape", node_label(n)))?;
        let range_attrs = || {
            vec![
                attr::make_int("start", start as i64),
                attr::make_int("end", end as i64),
            ]
        };
        let tag = |what: &str| names.fresh(&format!("present_shape{i}/{what}"));
        let sp = new.node(
            tag("past")?,
            "Shape",
            vec![past.clone()],
            tag("past_shape")?,
            range_attrs(),
        );
        let sn = new.node(
            tag("new")?,
            "Shape",
            vec![step.clone()],
            tag("new_shape")?,
            range_attrs(),
        );
        let unit: Vec<i64> = (start..end).map(|a| (a == JOIN_AXIS) as i64).collect();
        let unit_name = tag("join_axis")?;
        new.inits
            .push(tensor::from_i64(&unit_name, &[unit.len() as i64], &unit));
        let grown = new.node(
            tag("mul")?,
            "Mul",
            vec![sn, unit_name],
            tag("grown")?,
            vec![],
        );
        new.node(
            tag("add")?,
            "Add",
            vec![sp, grown],
            n.output[0].clone(),
            vec![],
        );
    }
    Ok(())
}

/// `Shape`'s `start`/`end` on a rank-4 input, clamped as the spec says.
fn shape_range(n: &attnrt_onnx::NodeProto) -> Result<(usize, usize)> {
    let rank = 4i64;
    let norm = |v: i64| (if v < 0 { v.saturating_add(rank) } else { v }).clamp(0, rank) as usize;
    let start = norm(attr::int(n, "start")?.unwrap_or(0));
    let end = norm(attr::int(n, "end")?.unwrap_or(rank));
    Ok((start, end.max(start)))
}
