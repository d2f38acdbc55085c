//! The symbolic forward pass: static facts about every tensor's shape, element type and (for
//! small tensors) value, from the graph's declarations and one small function per op family.
//!
//! - [`constant`]: `Constant`, `ConstantOfShape`, `Shape`, `Range`, `Cast`, `Identity`;
//! - [`elementwise`]: unary ops, broadcasting binary ops and their arithmetic on known values;
//! - [`shape_ops`]: `Reshape`, `Transpose`, `(Un)Squeeze`, `Expand`, `Tile`, `Flatten`;
//! - [`indexing`]: `Concat`, `Gather`, `Slice`, `Pad`, `Split`;
//! - [`linalg`]: `MatMul`, `Gemm`, `Conv`, `Reduce*`, `Gather{Elements,ND}`, `Attention`;
//! - [`quantize`]: `(Dynamic)QuantizeLinear`, `DequantizeLinear`, `MatMulInteger`.
//!
//! [`rule_for`] is the one table from op type to its function; an op without one leaves its
//! outputs to what the graph declares.

mod constant;
mod elementwise;
mod facts;
mod indexing;
mod linalg;
mod quantize;
mod shape_ops;

use std::collections::HashMap;

use attnrt_onnx::{GraphProto, NodeProto, ValueInfoProto};

pub(crate) use self::facts::Facts;
use super::dim::Dim;
use super::value::tensor_value;

/// Infers one node's outputs from what is known of its inputs.
type Rule = fn(&mut Facts, &NodeProto);

/// The function that infers `op` (default domain), if attnrt knows the op.
fn rule_for(op: &str) -> Option<Rule> {
    Some(match op {
        "Constant" => constant::constant,
        "ConstantOfShape" => constant::constant_of_shape,
        "Identity" => constant::identity,
        "Shape" => constant::shape,
        "Cast" => constant::cast,
        "Range" => constant::range,
        "Softmax"
        | "Sqrt"
        | "Relu"
        | "Erf"
        | "Neg"
        | "Not"
        | "IsNaN"
        | "IsInf"
        | "Tanh"
        | "Sigmoid"
        | "Exp"
        | "Log"
        | "Reciprocal"
        | "Abs"
        | "Gelu"
        | "LayerNormalization"
        | "Dropout"
        | "Clip"
        | "BatchNormalization"
        | "Softplus"
        | "HardSigmoid"
        | "Trilu"
        | "Floor"
        | "Ceil"
        | "Round"
        | "Sign"
        | "Sin"
        | "Cos"
        | "InstanceNormalization"
        | "RMSNormalization"
        | "LogSoftmax"
        | "Elu"
        | "LeakyRelu"
        | "Mish"
        | "HardSwish" => elementwise::unary,
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Equal" | "Less" | "Greater" | "And"
        | "Or" | "Where" | "Max" | "Min" | "GreaterOrEqual" | "LessOrEqual" | "Xor"
        | "BitwiseAnd" | "BitwiseOr" => elementwise::binary,
        "Reshape" => shape_ops::reshape,
        "Transpose" => shape_ops::transpose,
        "Unsqueeze" | "Squeeze" => shape_ops::squeeze_unsqueeze,
        "Concat" => indexing::concat,
        "Gather" => indexing::gather,
        "Slice" => indexing::slice,
        "Pad" => indexing::pad,
        "ScatterND" | "ScatterElements" => indexing::scatter,
        "Expand" => shape_ops::expand,
        "Tile" => shape_ops::tile,
        "Flatten" => shape_ops::flatten,
        "Split" => indexing::split,
        "MatMul" => linalg::matmul,
        "Gemm" => linalg::gemm,
        "Conv" => linalg::conv,
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL2"
        | "ReduceSumSquare" | "ReduceLogSumExp" => linalg::reduce,
        "GatherElements" => linalg::gather_elements,
        "GatherND" => linalg::gather_nd,
        "Attention" => linalg::attention,
        "QuantizeLinear" => quantize::quantize_linear,
        "DequantizeLinear" => quantize::dequantize_linear,
        "DynamicQuantizeLinear" => quantize::dynamic_quantize_linear,
        "MatMulInteger" => quantize::matmul_integer,
        _ => return None,
    })
}

/// Runs the forward pass over `order` (a topological order of `graph.node`).
pub(crate) fn infer(graph: &GraphProto, order: &[usize]) -> Facts {
    let mut f = Facts::default();
    for vi in graph
        .input
        .iter()
        .chain(graph.value_info.iter())
        .chain(graph.output.iter())
    {
        if let Some(t) = tensor_type(vi) {
            f.elem_types.insert(vi.name.clone(), t.elem_type);
        }
    }
    // Graph inputs: value_info shapes; unnamed dims get a fresh symbol.
    for vi in &graph.input {
        if let Some(s) = value_info_shape(vi) {
            f.shapes.insert(vi.name.clone(), s);
        }
    }
    for t in &graph.initializer {
        f.shapes.insert(
            t.name.clone(),
            t.dims.iter().map(|&d| Dim::known(d)).collect(),
        );
        f.elem_types.insert(t.name.clone(), t.data_type);
        if let Some(v) = tensor_value(t) {
            f.values.insert(t.name.clone(), v);
        }
    }
    // Declared shapes of intermediates, used only when inference cannot say more.
    let declared: HashMap<&str, Vec<Dim>> = graph
        .value_info
        .iter()
        .chain(graph.output.iter())
        .filter_map(|vi| value_info_shape(vi).map(|s| (vi.name.as_str(), s)))
        .collect();
    for &idx in order {
        let n = &graph.node[idx];
        if attnrt_onnx::opset::is_default_domain(&n.domain) {
            if let Some(rule) = rule_for(&n.op_type) {
                rule(&mut f, n);
            }
        }
        for o in &n.output {
            if !f.shapes.contains_key(o) {
                if let Some(s) = declared.get(o.as_str()) {
                    f.shapes.insert(o.clone(), s.clone());
                }
            }
        }
    }
    f
}

fn tensor_type(vi: &ValueInfoProto) -> Option<&attnrt_onnx::proto::type_proto::Tensor> {
    match &vi.r#type.as_ref()?.value {
        Some(attnrt_onnx::proto::type_proto::Value::TensorType(tt)) => Some(tt),
        _ => None,
    }
}

/// The declared shape of `vi`; an unnamed dimension gets a fresh symbol `<name>#<axis>`.
fn value_info_shape(vi: &ValueInfoProto) -> Option<Vec<Dim>> {
    use attnrt_onnx::proto::tensor_shape_proto::dimension::Value as DV;
    let shape = tensor_type(vi)?.shape.as_ref()?;
    Some(
        shape
            .dim
            .iter()
            .enumerate()
            .map(|(i, d)| match &d.value {
                Some(DV::DimValue(v)) => Dim::known(*v),
                Some(DV::DimParam(p)) if !p.is_empty() => Dim::sym(p),
                _ => Dim::sym(&format!("{}#{i}", vi.name)),
            })
            .collect(),
    )
}
