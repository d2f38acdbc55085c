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
//! same products of the same operands; the others are not computed. Anything else (the logits of
//! a dynamically quantized product, whose activations' scale spans every position; a merged
//! decoder's branches) is left as it is.

use std::collections::{HashMap, HashSet};

use attnrt_onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use attnrt_onnx::proto::type_proto::Value as TypeValue;
use attnrt_onnx::tensor::from_i64;
use attnrt_onnx::{GraphProto, ModelProto, NodeProto};

/// Ops that compute each position's values from that position's alone (given operands of one
/// position).
const PER_POSITION: [&str; 7] = ["Add", "Sub", "Mul", "Div", "Tanh", "Cast", "Identity"];

/// Names of what the rewrite adds.
const PREFIX: &str = "attnrt/last_position";

/// `model` computing its `logits` output at the last position only (`[batch, 1, vocab]`), when
/// its graph has the form of the module docs; `None` otherwise.
pub fn logits_at_last_position(model: &ModelProto, logits: &str) -> Option<ModelProto> {
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)?;
    let graph = model.graph.as_ref()?;
    // Slice takes its bounds as inputs from opset 10.
    if opset < 10 || graph.initializer.iter().any(|t| t.name.starts_with(PREFIX)) {
        return None;
    }
    let (matmul, chain) = logits_product(graph, logits)?;
    let mut model = model.clone();
    let graph = model.graph.as_mut()?;
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
    Some(model)
}

/// The index of the `MatMul` whose product the `logits` output is (through ops of
/// [`PER_POSITION`]), and the values from its output to the logits; `None` when the logits are
/// not of that form, or a value of the chain is used elsewhere.
fn logits_product(graph: &GraphProto, logits: &str) -> Option<(usize, HashSet<String>)> {
    let constants = constant_shapes(graph);
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for (ix, n) in graph.node.iter().enumerate() {
        for o in &n.output {
            producer.insert(o, ix);
        }
        for i in &n.input {
            *uses.entry(i).or_default() += 1;
        }
    }
    for o in &graph.output {
        *uses.entry(&o.name).or_default() += 1;
    }
    let mut value = logits;
    let mut chain = HashSet::new();
    loop {
        if uses.get(value) != Some(&1) {
            return None;
        }
        chain.insert(value.to_string());
        let ix = *producer.get(value)?;
        let n = &graph.node[ix];
        if !(n.domain.is_empty() || n.domain == "ai.onnx") {
            return None;
        }
        if n.op_type == "MatMul" {
            let weight = constants.get(n.input.get(1)?.as_str())?;
            return (weight.len() == 2).then_some((ix, chain));
        }
        if !PER_POSITION.contains(&n.op_type.as_str()) {
            return None;
        }
        let mut varying = n
            .input
            .iter()
            .filter(|i| !constants.contains_key(i.as_str()));
        let (Some(next), None) = (varying.next(), varying.next()) else {
            return None;
        };
        let one_position = |i: &String| {
            constants
                .get(i.as_str())
                .is_none_or(|dims| dims.iter().rev().skip(1).all(|&d| d == 1))
        };
        if !n.input.iter().all(one_position) {
            return None;
        }
        value = next;
    }
}

/// The dims of every constant of `graph`: its initializers and the outputs of its `Constant`
/// nodes (a scalar or list attribute: rank 0 or 1).
fn constant_shapes(graph: &GraphProto) -> HashMap<&str, Vec<i64>> {
    let mut shapes: HashMap<&str, Vec<i64>> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), t.dims.clone()))
        .collect();
    for n in graph.node.iter().filter(|n| n.op_type == "Constant") {
        let Some(out) = n.output.first() else {
            continue;
        };
        let dims = match n.attribute.iter().find_map(|a| a.t.as_ref()) {
            Some(t) => t.dims.clone(),
            None => vec![n
                .attribute
                .iter()
                .map(|a| a.floats.len() + a.ints.len())
                .sum::<usize>() as i64],
        };
        shapes.insert(out.as_str(), dims);
    }
    shapes
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
    use attnrt_testkit::{model, node, tensor_f32, value_info, GraphBuilder};

    /// `logits = tail(MatMul(h, w))` with `h = Relu(x)`, `x` `[batch, sequence, 4]`: `tail` is
    /// `Add` of `bias` (dims given), or nothing.
    fn decoder(bias: Option<&[i64]>) -> ModelProto {
        let mut g = GraphBuilder::new("d");
        g.input(value_info(
            "x",
            DataType::Float,
            &["batch", "sequence", "4"],
        ));
        g.initializer(tensor_f32("w", &[4, 3], &[0.5; 12]));
        g.node(node("relu", "Relu", &["x"], &["h"]));
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

    #[test]
    fn the_hidden_states_are_sliced_before_the_product() {
        for bias in [None, Some(&[3][..]), Some(&[1, 1, 3][..])] {
            let sliced = logits_at_last_position(&decoder(bias), "logits").unwrap();
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
        assert!(logits_at_last_position(&decoder(Some(&[5, 3])), "logits").is_none());
        // the product also an output
        let mut m = decoder(Some(&[3]));
        let g = m.graph.as_mut().unwrap();
        g.output.push(value_info(
            "p",
            DataType::Float,
            &["batch", "sequence", "3"],
        ));
        assert!(logits_at_last_position(&m, "logits").is_none());
        // a weight computed by the graph
        let mut m = decoder(None);
        let g = m.graph.as_mut().unwrap();
        g.node.insert(0, node("t", "Transpose", &["w0"], &["w"]));
        g.initializer[0].name = "w0".into();
        assert!(logits_at_last_position(&m, "logits").is_none());
        // an opset whose Slice takes no bounds as inputs
        let mut m = decoder(None);
        m.opset_import[0].version = 9;
        assert!(logits_at_last_position(&m, "logits").is_none());
    }
}
