//! The logits of a step at its last position only. A decoder gives logits for every position it
//! is fed (`[batch, sequence, vocab]`), but generation chooses each row's token from its last
//! position's: at a 128-token prompt of a 32000-token vocabulary, the product by the output
//! embedding over the 127 other positions is a fifth of the prefill's work, and its result
//! (16 MB a row) is thrown away.
//!
//! When the logits are a `MatMul` of the hidden states by a constant weight, possibly followed
//! by ops that treat every position alike (a bias, a softcap: elementwise, their other operands
//! constants of one position), the hidden states are sliced to their last position before that
//! `MatMul` (`Slice` from -1 along the sequence axis). The last position's logits are then the
//! same products of the same operands; the others are not computed. The slice is exact only
//! when axis 1 of the product's input is the sequence: the symbolic forward pass of
//! `attnrt-fusion` ([`GraphView`]) must show that input `[batch, sequence, hidden]` with the
//! token ids' two dims, and every value from the product to the logits with the same two first
//! axes (issue 26: hidden states `[batch·sequence, hidden]`, or sequence-major, are refused).
//! Anything else (the logits of a dynamically quantized product, whose activations' scale spans
//! every position; a merged decoder's branches) is left as it is, and the reason is kept
//! ([`Generator::last_position_refusal`](super::Generator::last_position_refusal)).

use std::collections::HashSet;

use attnrt_fusion::graph::{shape_str, GraphIndex, GraphView};
use attnrt_onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use attnrt_onnx::proto::type_proto::Value as TypeValue;
use attnrt_onnx::tensor::from_i64;
use attnrt_onnx::validate::topo_order;
use attnrt_onnx::{opset, GraphProto, ModelProto, NodeProto};

/// Ops that compute each position's values from that position's alone (given operands of one
/// position).
const PER_POSITION: [&str; 7] = ["Add", "Sub", "Mul", "Div", "Tanh", "Cast", "Identity"];

/// Names of what the rewrite adds.
const PREFIX: &str = "attnrt/last_position";

/// `model` computing its `logits` output at the last position only (`[batch, 1, vocab]`), when
/// its graph has the form of the module docs and the product's input is shown to be
/// `[batch, sequence, hidden]` with the token ids' (`input_ids`) batch and length on its axes 0
/// and 1, both kept up to the logits ([`check_layout`]); otherwise why the logits are left at
/// every position.
pub fn logits_at_last_position(
    model: &ModelProto,
    logits: &str,
    input_ids: &str,
) -> Result<ModelProto, String> {
    let graph = model.graph.as_ref().ok_or("the model has no graph")?;
    // Slice takes its bounds as inputs from opset 10.
    let opset = opset::default_version(model).ok_or("the model imports no default opset")?;
    if opset < 10 {
        return Err(format!(
            "opset {opset}: Slice takes its bounds as inputs from opset 10"
        ));
    }
    if graph.initializer.iter().any(|t| t.name.starts_with(PREFIX)) {
        return Err("the logits are already computed at the last position only".into());
    }
    let index = GraphIndex::new(graph);
    let (matmul, chain) = logits_product(&index, logits)?;
    check_layout(index, opset, matmul, &chain, input_ids)?;
    Ok(sliced(model, matmul, &chain, logits))
}

/// `model` with the input of its node `matmul` sliced to the last position (axis 1), the
/// declarations of the `chain`'s values dropped and the `logits` output declared of one
/// position.
fn sliced(model: &ModelProto, matmul: usize, chain: &HashSet<String>, logits: &str) -> ModelProto {
    let mut model = model.clone();
    let graph = model.graph.get_or_insert_with(Default::default);
    let hidden = format!("{PREFIX}/hidden");
    let node = &mut graph.node[matmul];
    let slice = NodeProto {
        name: format!("{PREFIX}/Slice"),
        op_type: "Slice".into(),
        input: vec![
            node.input[0].clone(),
            format!("{PREFIX}/starts"),
            format!("{PREFIX}/ends"),
            format!("{PREFIX}/axes"),
        ],
        output: vec![hidden.clone()],
        ..Default::default()
    };
    node.input[0] = hidden;
    graph.node.insert(matmul, slice);
    for (name, value) in [("starts", -1), ("ends", i64::MAX), ("axes", 1)] {
        graph
            .initializer
            .push(from_i64(&format!("{PREFIX}/{name}"), &[1], &[value]));
    }
    // What the graph declares of the chain's values had every position.
    graph.value_info.retain(|v| !chain.contains(&v.name));
    declare_one_position(graph, logits);
    model
}

/// The index of the `MatMul` whose product the `logits` output is (through ops of
/// [`PER_POSITION`]), and the values from its output to the logits; why not, when the logits
/// are not of that form or a value of the chain is used elsewhere.
fn logits_product(index: &GraphIndex, logits: &str) -> Result<(usize, HashSet<String>), String> {
    let mut value = logits;
    let mut chain = HashSet::new();
    loop {
        // (a node's readings are counted once: one that reads a value twice is refused anyway,
        // as the chain's node for its operands or as a second reader)
        let as_output = usize::from(index.is_graph_output(value));
        if index.consumers(value).len() + as_output != 1 {
            return Err(format!("'{value}' is read by more than the logits"));
        }
        chain.insert(value.to_string());
        let ix = index
            .producer(value)
            .ok_or_else(|| format!("'{value}' is not computed by a node"))?;
        let n = index.node(ix);
        let by = format!("'{value}' is made by {} '{}'", n.op_type, n.name);
        if !opset::is_default_domain(&n.domain) {
            return Err(format!("{by} of domain '{}'", n.domain));
        }
        if n.op_type == "MatMul" {
            let weight = n.input.get(1).and_then(|w| constant_dims(index, w));
            return match weight {
                Some(dims) if dims.len() == 2 => Ok((ix, chain)),
                _ => Err(format!("{by}, whose weight is not a constant matrix")),
            };
        }
        if !PER_POSITION.contains(&n.op_type.as_str()) {
            return Err(format!(
                "{by}, which is not known to keep each position's values apart"
            ));
        }
        let mut varying = n.input.iter().filter(|i| constant_dims(index, i).is_none());
        let (Some(next), None) = (varying.next(), varying.next()) else {
            return Err(format!("{by} of more than one computed operand"));
        };
        let one_position = |i: &String| {
            constant_dims(index, i).is_none_or(|dims| dims.iter().rev().skip(1).all(|&d| d == 1))
        };
        if !n.input.iter().all(one_position) {
            return Err(format!("{by} with a constant of more than one position"));
        }
        value = next;
    }
}

/// Checks what makes slicing axis 1 of the input of node `matmul` exact, from the shapes the
/// symbolic forward pass ([`GraphView`]) proves: that input is `[batch, sequence, hidden]`
/// with the token ids' (`input_ids`, `[batch, sequence]`) axes 0 and 1, and every value of the
/// `chain` from the product to the logits keeps those two axes in place (rank 3, the same
/// dims). A graph whose hidden states are `[batch·sequence, hidden]`, or sequence-major, or
/// whose shapes cannot be shown is refused with what was found.
fn check_layout(
    index: GraphIndex,
    opset: i64,
    matmul: usize,
    chain: &HashSet<String>,
    input_ids: &str,
) -> Result<(), String> {
    let order = topo_order(index.graph).map_err(|e| e.to_string())?;
    let view = GraphView::from_index(index, &order, opset);
    let node = view.node(matmul);
    let hidden = &node.input[0];
    let of = format!("'{hidden}' (the input of MatMul '{}')", node.name);
    let shape = view
        .shape(hidden)
        .ok_or_else(|| format!("the shape of {of} is not known"))?;
    let ids = view
        .shape(input_ids)
        .filter(|s| s.len() == 2)
        .ok_or_else(|| {
            format!("the token ids '{input_ids}' are not known to be [batch, sequence]")
        })?;
    if shape.len() != 3 || shape[..2] != *ids {
        return Err(format!(
            "{of} is {}, not [batch, sequence, hidden] with the token ids' {}",
            shape_str(shape),
            shape_str(ids)
        ));
    }
    let mut chain: Vec<&String> = chain.iter().collect();
    chain.sort();
    for value in chain {
        match view.shape(value) {
            Some(s) if s.len() == 3 && s[..2] == *ids => {}
            found => {
                return Err(format!(
                    "'{value}' (between the product and the logits) is {}, not {} by the \
                     vocabulary",
                    found.map_or("of unknown shape".into(), shape_str),
                    shape_str(ids)
                ))
            }
        }
    }
    Ok(())
}

/// The dims of `tensor` when it is a constant: an initializer or the output of a `Constant`
/// node (a scalar or list attribute: rank 0).
fn constant_dims<'a>(index: &GraphIndex<'a>, tensor: &str) -> Option<&'a [i64]> {
    let attribute = || index.constant_node(tensor).map(|_| &[][..]);
    index
        .constant(tensor)
        .map(|t| &t.dims[..])
        .or_else(attribute)
}

/// Declares the `logits` output's sequence axis (axis 1 of `[batch, sequence, vocab]`) as 1.
fn declare_one_position(graph: &mut GraphProto, logits: &str) {
    let Some(output) = graph.output.iter_mut().find(|o| o.name == logits) else {
        return;
    };
    let Some(TypeValue::TensorType(t)) = output.r#type.as_mut().and_then(|t| t.value.as_mut())
    else {
        return;
    };
    if let Some(dim) = t.shape.as_mut().and_then(|s| s.dim.get_mut(1)) {
        dim.value = Some(DimValue::DimValue(1));
        dim.denotation.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_onnx::DataType;
    use attnrt_testkit::lm_head::{lm_head_decoder, HiddenLayout};
    use attnrt_testkit::{model, node, tensor_f32, value_info, GraphBuilder};

    /// `logits = tail(MatMul(h, w))` with `h = Gather(embedding, ids)`, `ids`
    /// `[batch, sequence]`: `tail` is `Add` of `bias` (dims given), or nothing.
    fn decoder(bias: Option<&[i64]>) -> ModelProto {
        let mut g = GraphBuilder::new("d");
        g.input(value_info("ids", DataType::Int64, &["batch", "sequence"]));
        g.initializer(tensor_f32("embedding", &[5, 4], &[0.25; 20]));
        g.initializer(tensor_f32("w", &[4, 3], &[0.5; 12]));
        g.node(node("embed", "Gather", &["embedding", "ids"], &["h"]));
        let product = if bias.is_some() { "p" } else { "logits" };
        g.node(node("lm_head", "MatMul", &["h", "w"], &[product]));
        if let Some(dims) = bias {
            let n = dims.iter().product::<i64>() as usize;
            g.initializer(tensor_f32("b", dims, &vec![1.0; n]));
            g.node(node("bias", "Add", &["p", "b"], &["logits"]));
        }
        g.output(value_info(
            "logits",
            DataType::Float,
            &["batch", "sequence", "3"],
        ));
        model(g.finish(), 17)
    }

    /// Why `m`'s logits are left at every position (panics when they are not).
    fn refusal(m: &ModelProto, ids: &str) -> String {
        match logits_at_last_position(m, "logits", ids) {
            Ok(_) => panic!("the logits were rewritten to the last position"),
            Err(why) => why,
        }
    }

    #[test]
    fn the_hidden_states_are_sliced_before_the_product() {
        for bias in [None, Some(&[3][..]), Some(&[1, 1, 3][..])] {
            let sliced = logits_at_last_position(&decoder(bias), "logits", "ids").unwrap();
            let g = sliced.graph.unwrap();
            let slice = g.node.iter().position(|n| n.op_type == "Slice").unwrap();
            let matmul = g.node.iter().position(|n| n.op_type == "MatMul").unwrap();
            assert!(slice < matmul, "{bias:?}");
            assert_eq!(g.node[slice].input[0], "h");
            assert_eq!(g.node[matmul].input[0], g.node[slice].output[0]);
            let Some(TypeValue::TensorType(t)) =
                g.output[0].r#type.as_ref().unwrap().value.as_ref()
            else {
                panic!()
            };
            assert_eq!(
                t.shape.as_ref().unwrap().dim[1].value,
                Some(DimValue::DimValue(1))
            );
        }
    }

    #[test]
    fn logits_that_mix_positions_or_feed_other_values_are_left_alone() {
        // a bias per position
        let why = refusal(&decoder(Some(&[5, 3])), "ids");
        assert!(why.contains("more than one position"), "{why}");
        // the product also an output
        let mut m = decoder(Some(&[3]));
        let g = m.graph.as_mut().unwrap();
        g.output.push(value_info(
            "p",
            DataType::Float,
            &["batch", "sequence", "3"],
        ));
        let why = refusal(&m, "ids");
        assert!(why.contains("'p' is read by more than the logits"), "{why}");
        // a weight computed by the graph
        let mut m = decoder(None);
        let g = m.graph.as_mut().unwrap();
        g.node.insert(0, node("t", "Transpose", &["w0"], &["w"]));
        g.initializer[1].name = "w0".into();
        let why = refusal(&m, "ids");
        assert!(why.contains("not a constant matrix"), "{why}");
        // an opset whose Slice takes no bounds as inputs
        let mut m = decoder(None);
        m.opset_import[0].version = 9;
        assert!(refusal(&m, "ids").contains("opset 9"));
    }

    /// Issue 26: slicing axis 1 is exact only for hidden states `[batch, sequence, hidden]`
    /// whose two first axes stay in place up to the logits.
    #[test]
    fn hidden_states_of_another_layout_are_left_alone() {
        use HiddenLayout::*;
        let decoder = lm_head_decoder(BatchMajor);
        assert!(logits_at_last_position(&decoder, "logits", "input_ids").is_ok());
        // the product's input is the token ids' [batch, sequence] only when these are named
        assert!(refusal(&decoder, "past_key_values.0.key").contains("not known to be"));
        let cases = [
            // a broadcast bias makes the flat product [1, batch·sequence, vocab]
            (
                Flat,
                "'h2' (the input of MatMul 'lm_head') is [batch·sequence, 4]",
            ),
            (FlatReshaped, "'logits' is made by Reshape 'unflatten'"),
            (
                SequenceMajor,
                "'logits' is made by Transpose 'to_batch_major'",
            ),
            (
                SequenceMajorLogits,
                "'ht' (the input of MatMul 'lm_head') is [sequence, batch, 4]",
            ),
        ];
        for (layout, reason) in cases {
            let why = refusal(&lm_head_decoder(layout), "input_ids");
            assert!(why.contains(reason), "{layout:?}: {why}");
        }
        // a bias of rank 4 (one position) makes the logits of rank 4
        let mut m = lm_head_decoder(BatchMajor);
        let g = m.graph.as_mut().unwrap();
        let bias = g.initializer.iter_mut().find(|t| t.name == "bias").unwrap();
        bias.dims = vec![1, 1, 1, 10];
        let why = refusal(&m, "input_ids");
        assert!(
            why.contains(
                "'logits' (between the product and the logits) is [1, batch, sequence, 10]"
            ),
            "{why}"
        );
    }
}
