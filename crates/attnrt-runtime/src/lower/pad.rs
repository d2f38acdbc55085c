//! Makes every `Pad` node's `constant_value` (input 2, opset ≥ 11) a scalar with a
//! `Reshape(value, [])` in front of it.
//!
//! tract types that input as rank 0 only ("Impossible to unify 1 with 0"), as the ONNX text
//! says, but ONNX's own function bodies (the Attention-24 expansion's `Pad` of the mask) pass a
//! 1-element 1-D tensor, which ONNX Runtime accepts. The reshape keeps the value, and fails
//! with an error if the input has more than one element. Only tract's copy of the graph is
//! changed.

use attnrt_onnx::proto::ModelProto;
use tract_onnx::pb::{attribute_proto::AttributeType, tensor_proto::DataType};
use tract_onnx::pb::{AttributeProto, GraphProto, NodeProto, TensorProto};

/// The pass: every `Pad` of `g` (tract's copy of `_model`'s graph, subgraphs included) reads
/// its `constant_value` through a reshape to a scalar.
pub(super) fn scalar_pad_values(_model: &ModelProto, g: &mut GraphProto) {
    scalar_pads(g);
}

fn scalar_pads(g: &mut GraphProto) {
    let nodes = std::mem::take(&mut g.node);
    g.node.reserve(nodes.len());
    for (ix, mut n) in nodes.into_iter().enumerate() {
        for a in &mut n.attribute {
            for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                scalar_pads(sub);
            }
        }
        let is_onnx = n.domain.is_empty() || n.domain == "ai.onnx";
        if n.op_type == "Pad" && is_onnx && n.input.get(2).is_some_and(|v| !v.is_empty()) {
            // The node index keeps the names unique even for unnamed nodes.
            let base = format!("attnrt_pad{ix}_{}", n.name);
            let shape = format!("{base}_scalar_shape");
            let value = format!("{base}_scalar_value");
            g.node.push(NodeProto {
                name: shape.clone(),
                op_type: "Constant".into(),
                output: vec![shape.clone()],
                attribute: vec![AttributeProto {
                    name: "value".into(),
                    r#type: AttributeType::Tensor as i32,
                    t: Some(TensorProto {
                        dims: vec![0],
                        data_type: DataType::Int64 as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            });
            g.node.push(NodeProto {
                name: value.clone(),
                op_type: "Reshape".into(),
                input: vec![std::mem::take(&mut n.input[2]), shape],
                output: vec![value.clone()],
                ..Default::default()
            });
            n.input[2] = value;
        }
        g.node.push(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NamedTensor, Session, Tensor, Threads};
    use attnrt_onnx::proto::TensorProto;
    use attnrt_onnx::DataType;
    use attnrt_testkit::{float_value, model, node, GraphBuilder};

    /// `Pad(x [2, 3], pads [0, 1, 0, 1], constant_value)` at opset 18.
    fn pad_model(constant_dims: Vec<i64>) -> ModelProto {
        let mut g = GraphBuilder::new("g");
        g.node(node("", "Pad", &["x", "pads", "value"], &["y"]));
        // `int64_data`/`float_data` rather than `raw_data`: the typed fields are read too.
        g.initializer(TensorProto {
            name: "pads".into(),
            dims: vec![4],
            data_type: DataType::Int64 as i32,
            int64_data: vec![0, 1, 0, 1],
            ..Default::default()
        });
        g.initializer(TensorProto {
            name: "value".into(),
            dims: constant_dims,
            data_type: DataType::Float as i32,
            float_data: vec![7.0],
            ..Default::default()
        });
        g.input(float_value("x", &[2, 3]));
        g.output(float_value("y", &[2, 5]));
        ModelProto {
            ir_version: 10,
            ..model(g.finish(), 18)
        }
    }

    #[test]
    fn pad_constant_value_may_be_a_one_element_tensor() {
        let x = Tensor::from_shape(&[2, 3], &[1f32, 2., 3., 4., 5., 6.]).unwrap();
        let inputs = vec![NamedTensor {
            name: "x".into(),
            tensor: x,
        }];
        let threads = Threads::new(Some(1)).unwrap();
        // The ONNX text's scalar, and the 1-element 1-D tensor of ONNX's function bodies.
        for dims in [vec![], vec![1]] {
            let s = Session::build(&pad_model(dims.clone()), &inputs, &threads, "pad").unwrap();
            let y = s.run(&inputs).unwrap();
            let y = y[0].tensor.to_plain_array_view::<f32>().unwrap();
            assert_eq!(
                y.iter().copied().collect::<Vec<_>>(),
                [7., 1., 2., 3., 7., 7., 4., 5., 6., 7.],
                "constant_value dims {dims:?}"
            );
        }
    }
}
