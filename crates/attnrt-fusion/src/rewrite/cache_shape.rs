//! `Shape` of a cache join the block's inputs are computed from (GPT-2 slices its causal mask
//! to the key length `Shape(present_key)[2]`; optimum's LLaMA to the key length of the
//! head-repeated join): the fused node produces the join, so it cannot also feed the mask. The
//! shape is computed from what the join reads instead:
//!
//! ```text
//! Shape(present)[s:e] = Shape(past)[s:e] + Shape(new)[s:e] · [0, 0, 1, 0][s:e]
//! ```
//!
//! (the join is on axis 2 of rank-4 tensors, so only that size adds up). A `Shape` of another
//! tensor, whose elements are known sizes or sizes of the join (`ShapeDim`), takes those
//! elements from the join's shape so computed and adds the known ones:
//!
//! ```text
//! Gather(Shape(past) + Shape(new) · [0, 0, 1, 0], axes) · from_join + known
//! ```

use anyhow::Result;
use attnrt_onnx::{attr, tensor, GraphProto};

use super::inserted::{Inserted, Names};
use crate::rules::kv_cache::{KvCache, ShapeDim};

/// The join's axis in a rank-4 tensor.
const JOIN_AXIS: usize = 2;

/// Inserts, for every recorded `Shape` reader, the nodes that compute its output from the
/// past and this step's shapes (the reader itself is removed with the block).
pub(super) fn replace_readers(
    graph: &GraphProto,
    kv: &KvCache,
    names: &Names,
    new: &mut Inserted,
) -> Result<()> {
    for (i, r) in kv.shape_readers.iter().enumerate() {
        let output = &graph.node[r.node].output[0];
        let (past, step) = if r.of_key {
            (&kv.past_key, &kv.new_key)
        } else {
            (&kv.past_value, &kv.new_value)
        };
        let tag = |what: &str| names.fresh(&format!("present_shape{i}/{what}"));
        let axes: Option<Vec<usize>> = r
            .dims
            .iter()
            .map(|d| match d {
                ShapeDim::Axis(a) => Some(*a),
                ShapeDim::Known(_) => None,
            })
            .collect();
        // A run of the join's axes is a slice of its shape; anything else is gathered.
        let run = axes.filter(|a| a.windows(2).all(|w| w[1] == w[0] + 1));
        let (start, end) = match &run {
            Some(a) => a.first().map_or((0, 0), |&s| (s, s + a.len())),
            None => (0, 4),
        };
        let target = match run {
            Some(_) => output.clone(),
            None => tag("join_shape")?,
        };
        let range_attrs = || {
            vec![
                attr::make_int("start", start as i64),
                attr::make_int("end", end as i64),
            ]
        };
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
        let joined = new.node(tag("add")?, "Add", vec![sp, grown], target, vec![]);
        if joined != *output {
            gather_dims(&r.dims, joined, output, &tag, new)?;
        }
    }
    Ok(())
}

/// `output = Gather(join_shape, axes) · from_join + known`, element by element of `dims`.
fn gather_dims(
    dims: &[ShapeDim],
    join_shape: String,
    output: &str,
    tag: &dyn Fn(&str) -> Result<String>,
    new: &mut Inserted,
) -> Result<()> {
    let len = [dims.len() as i64];
    let (mut axes, mut from_join, mut known) = (Vec::new(), Vec::new(), Vec::new());
    for d in dims {
        let (a, f, k) = match *d {
            ShapeDim::Axis(a) => (a as i64, 1, 0),
            ShapeDim::Known(v) => (0, 0, v),
        };
        axes.push(a);
        from_join.push(f);
        known.push(k);
    }
    let mut init = |what: &str, v: &[i64]| -> Result<String> {
        let name = tag(what)?;
        new.inits.push(tensor::from_i64(&name, &len, v));
        Ok(name)
    };
    let (axes, from_join, known) = (
        init("axes", &axes)?,
        init("from_join", &from_join)?,
        init("known", &known)?,
    );
    let picked = new.node(
        tag("gather")?,
        "Gather",
        vec![join_shape, axes],
        tag("picked")?,
        vec![attr::make_int("axis", 0)],
    );
    let kept = new.node(
        tag("select")?,
        "Mul",
        vec![picked, from_join],
        tag("selected")?,
        vec![],
    );
    new.node(
        tag("known_add")?,
        "Add",
        vec![kept, known],
        output.to_string(),
        vec![],
    );
    Ok(())
}
