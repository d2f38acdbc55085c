//! Emitting the fused node for a proven [`AttentionMatch`] and cleaning up after it:
//!
//! - this file: the `Attention` node, its K transpose and the batched 3-D wrapping;
//! - `inserted`: fresh names and the nodes inserted;
//! - `cache_shape`: `Shape` of a cache join the mask is computed from, recomputed from the
//!   past's and this step's shapes;
//! - `mask`: the `attn_mask` input built from the remaining mask layers;
//! - `past_inputs`: an `Attention` node already in the graph given its cache joins;
//! - `splice`: the matched nodes (and what they alone read) out, the new nodes in, the
//!   graph's declarations tidied.

mod cache_shape;
mod inserted;
mod mask;
mod past_inputs;
mod splice;

use anyhow::Result;
use attnrt_onnx::{attr, tensor, AttributeProto, GraphProto, NodeProto};

use self::inserted::{Inserted, Names};
pub use self::past_inputs::give_cache;
pub use self::splice::replace_nodes;
use crate::rules::{AttentionMatch, Layout};

/// What one rewrite did.
pub struct Rewritten {
    /// The fused node's name.
    pub node: String,
    /// Labels of the nodes removed (the matched nodes and those left dead), in graph order.
    pub removed: Vec<String>,
    /// The mask kind written to the report.
    pub mask: String,
}

/// Replaces the match in `graph` by one `Attention` node named `name`.
pub fn rewrite(graph: &mut GraphProto, m: &AttentionMatch, name: &str) -> Result<Rewritten> {
    let names = Names::new(graph, name);
    let mut new = Inserted::default();
    // K: insert one Transpose when the graph only has Kᵀ (or K in another order).
    let mut k = m.placed.k.source.clone();
    if let Some(perm) = &m.placed.k.perm {
        k = new.node(
            names.fresh("K_transpose")?,
            "Transpose",
            vec![k],
            names.fresh("K")?,
            vec![attr::make_ints("perm", perm)],
        );
    }
    let (mask, mask_kind) = mask::build(graph, m, &names, &mut new)?;
    let mask = match mask {
        Some(t) if m.mask.expand => Some(mask::expand(m, t, &names, &mut new)?),
        other => other,
    };
    let mut inputs = vec![m.placed.q.clone(), k, m.placed.v.clone()];
    inputs.extend(mask);
    if let Some(kv) = &m.placed.kv {
        cache_shape::replace_readers(graph, kv, &names, &mut new)?;
        // Inputs 4 and 5; an absent mask is the empty name.
        inputs.resize(3 + 1, String::new());
        inputs.extend([kv.past_key.clone(), kv.past_value.clone()]);
    }
    attention_node(m, inputs, name, &names, &mut new)?;
    let removed = splice::splice(graph, m, new, name)?;
    Ok(Rewritten {
        node: name.to_string(),
        removed,
        mask: mask_kind,
    })
}

/// The fused node's attributes.
fn attributes(m: &AttentionMatch) -> Vec<AttributeProto> {
    let mut attrs = Vec::new();
    if let Layout::ThreeD { q_heads, kv_heads } = m.placed.layout {
        attrs.push(attr::make_int("q_num_heads", q_heads));
        attrs.push(attr::make_int("kv_num_heads", kv_heads));
    }
    if let Some(s) = m.scale.value() {
        attrs.push(attr::make_float("scale", s));
    }
    if m.mask.is_causal {
        attrs.push(attr::make_int("is_causal", 1));
    }
    if let Some(c) = m.placed.core.softcap {
        attrs.push(attr::make_float("softcap", c));
    }
    if let Some(tap) = &m.qk_output {
        if tap.mode != 0 {
            attrs.push(attr::make_int("qk_matmul_output_mode", tap.mode));
        }
    }
    attrs
}

/// The `Attention` node reading `inputs` (Q, K, V, optional mask, optional past key and
/// value), wrapped in
/// `Unsqueeze`/`Squeeze` for the batched layout.
fn attention_node(
    m: &AttentionMatch,
    mut inputs: Vec<String>,
    name: &str,
    names: &Names,
    new: &mut Inserted,
) -> Result<()> {
    let mut output = m.placed.output.clone();
    if m.placed.layout == Layout::Batched {
        // (N, L, d) batched MatMuls: heads are independent, so [1, N, L, d] 4-D attention
        // computes the same thing.
        let axes = names.fresh("axes0")?;
        new.inits.push(tensor::from_i64(&axes, &[1], &[0]));
        for (i, what) in ["Q", "K", "V"].iter().enumerate() {
            inputs[i] = new.node(
                names.fresh(&format!("{what}_unsqueeze"))?,
                "Unsqueeze",
                vec![inputs[i].clone(), axes.clone()],
                names.fresh(&format!("{what}4"))?,
                vec![],
            );
        }
        let y4 = names.fresh("Y4")?;
        new.node(
            names.fresh("Y_squeeze")?,
            "Squeeze",
            vec![y4.clone(), axes.clone()],
            output,
            vec![],
        );
        output = y4;
    }
    // Outputs: Y, present_key, present_value, qk_matmul_output; unproduced ones are empty.
    let (present_key, present_value) = match &m.placed.kv {
        Some(kv) => (kv.present_key.clone(), kv.present_value.clone()),
        None => (String::new(), String::new()),
    };
    let mut outputs = vec![output, present_key, present_value];
    if let Some(tap) = &m.qk_output {
        outputs.push(tap.tensor.clone());
    }
    while outputs.last().is_some_and(String::is_empty) {
        outputs.pop();
    }
    new.nodes.push(NodeProto {
        name: name.to_string(),
        op_type: "Attention".into(),
        input: inputs,
        output: outputs,
        attribute: attributes(m),
        ..Default::default()
    });
    Ok(())
}
