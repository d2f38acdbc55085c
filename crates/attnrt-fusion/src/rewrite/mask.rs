//! The fused node's `attn_mask`: a single additive term or a single `-inf` fill map directly;
//! anything else is combined into one float mask with inserted nodes.

use anyhow::{bail, Result};
use attnrt_onnx::{attr, tensor, DataType, GraphProto};

use super::inserted::{Inserted, Names};
use crate::masks::MaskLayer;
use crate::rules::{AttentionMatch, Layout};

/// The mask tensor for `m` (`None`: no mask) and its kind for the report.
pub(super) fn build(
    graph: &GraphProto,
    m: &AttentionMatch,
    names: &Names,
    new: &mut Inserted,
) -> Result<(Option<String>, String)> {
    match m.mask.masks.as_slice() {
        [] => Ok((None, "none".into())),
        [MaskLayer::Add { term, .. }] => Ok((Some(term.clone()), "additive".into())),
        [MaskLayer::Fill {
            cond,
            fill_value,
            masked_when_true,
            ..
        }] if *fill_value == f64::NEG_INFINITY => {
            // Attention's bool mask is True where a key takes part.
            let keep = if *masked_when_true {
                new.node(
                    names.fresh("mask_not")?,
                    "Not",
                    vec![cond.clone()],
                    names.fresh("mask")?,
                    vec![],
                )
            } else {
                cond.clone()
            };
            Ok((Some(keep), "bool".into()))
        }
        layers => combine(graph, layers, names, new),
    }
}

/// Several layers (or a finite fill) as one float mask, applied in the original order.
fn combine(
    graph: &GraphProto,
    layers: &[MaskLayer],
    names: &Names,
    new: &mut Inserted,
) -> Result<(Option<String>, String)> {
    let mut acc: Option<String> = None;
    let mut kinds = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        match layer {
            MaskLayer::Add { term, .. } => {
                kinds.push("additive");
                acc = Some(match acc {
                    None => term.clone(),
                    Some(a) => new.node(
                        names.fresh(&format!("mask_add_{i}"))?,
                        "Add",
                        vec![a, term.clone()],
                        names.fresh(&format!("mask_{i}"))?,
                        vec![],
                    ),
                });
            }
            MaskLayer::Fill {
                cond,
                fill,
                masked_when_true,
                ..
            } => {
                kinds.push("fill");
                // Where(cond, fill, acc or 0): the fill replaces what came before, like the
                // original; the scores themselves get `+ fill` (exact only for -inf).
                let base = match acc {
                    Some(a) => a,
                    None => zero_like(graph, fill, &names.fresh(&format!("mask_zero_{i}"))?, new)?,
                };
                let ins = if *masked_when_true {
                    vec![cond.clone(), fill.clone(), base]
                } else {
                    vec![cond.clone(), base, fill.clone()]
                };
                acc = Some(new.node(
                    names.fresh(&format!("mask_where_{i}"))?,
                    "Where",
                    ins,
                    names.fresh(&format!("mask_{i}"))?,
                    vec![],
                ));
            }
        }
    }
    kinds.dedup();
    Ok((acc, kinds.join("+")))
}

/// A float32 scalar 0 called `zero`, for a fill whose type is float32.
fn zero_like(graph: &GraphProto, fill: &str, zero: &str, new: &mut Inserted) -> Result<String> {
    let dt = graph
        .initializer
        .iter()
        .find(|t| t.name == fill)
        .map(|t| t.data_type)
        .or_else(|| {
            graph
                .node
                .iter()
                .find(|n| n.output.first().map(String::as_str) == Some(fill))
                .and_then(|n| attr::tensor(n, "value").ok().flatten())
                .map(|t| t.data_type)
        })
        .unwrap_or(DataType::Float as i32);
    if dt != DataType::Float as i32 {
        bail!("mask fill '{fill}' is not float32; combining it is not supported");
    }
    new.inits.push(tensor::from_f32(zero, &[], &[0.0]));
    Ok(zero.to_string())
}

/// ONNX Runtime wants the mask's last two axes to be `[Lq, Lk]` exactly: expands `mask` with
/// the run-time lengths taken from Q and V (and the past values, for a decoder with a cache).
pub(super) fn expand(
    m: &AttentionMatch,
    mask: String,
    names: &Names,
    new: &mut Inserted,
) -> Result<String> {
    let seq_axis = if m.placed.layout == Layout::FourD {
        2
    } else {
        1
    };
    let shape_attrs = || {
        vec![
            attr::make_int("start", seq_axis),
            attr::make_int("end", seq_axis + 1),
        ]
    };
    let lq = new.node(
        names.fresh("Lq_shape")?,
        "Shape",
        vec![m.placed.q.clone()],
        names.fresh("Lq")?,
        shape_attrs(),
    );
    let mut lk = new.node(
        names.fresh("Lk_shape")?,
        "Shape",
        vec![m.placed.v.clone()],
        names.fresh("Lk")?,
        shape_attrs(),
    );
    if let Some(kv) = &m.placed.kv {
        // The keys are the past's and this step's: Lk = P + L.
        let past = new.node(
            names.fresh("past_len_shape")?,
            "Shape",
            vec![kv.past_value.clone()],
            names.fresh("past_len")?,
            vec![attr::make_int("start", 2), attr::make_int("end", 3)],
        );
        lk = new.node(
            names.fresh("total_len_add")?,
            "Add",
            vec![past, lk],
            names.fresh("total_len")?,
            vec![],
        );
    }
    let target = new.node(
        names.fresh("mask_shape_concat")?,
        "Concat",
        vec![lq, lk],
        names.fresh("mask_shape")?,
        vec![attr::make_int("axis", 0)],
    );
    Ok(new.node(
        names.fresh("mask_expand")?,
        "Expand",
        vec![mask, target],
        names.fresh("mask_expanded")?,
        vec![],
    ))
}
