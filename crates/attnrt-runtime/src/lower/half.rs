//! A float16 (or bfloat16) graph's arithmetic run in float32: the rewrite `half-as-float`.
//!
//! A file converted to half precision (`onnxruntime.transformers.float16`, `model.half()`
//! before export) halves the download, but on a CPU without half-precision arithmetic every
//! `MatMul`, `Add` and norm of it runs on tract's generic code, and none of attnrt's kernels
//! (projections, `LayerNormalization`, `Gelu`) take it. This rewrite gives tract a float32
//! graph instead, so every float32 fast path applies unchanged:
//!
//! - float16/bfloat16 initializers and attribute tensors (`Constant`, `ConstantOfShape`) are
//!   widened to float32, once, when the session is built (every half value is a float32 value:
//!   the weights are exactly the file's);
//! - `Cast`s to float16/bfloat16 cast to float32 (so the converter's float32 → float16 →
//!   float32 pairs become identities, which tract removes), and `dtype` attributes asking for
//!   half precision (`EyeLike`, `RandomNormal`, ...) ask for float32; `value_info` types follow;
//! - the graph's declared inputs and outputs keep their types: a float16 graph input is read
//!   through a `Cast` to float32, a float16 graph output is written by a `Cast` to float16;
//! - a `Cast` from a half-precision tensor to a non-float type (an index, a mask) first rounds
//!   its input to the half type, as the graph would have it: a value that rounds across an
//!   integer or to zero gives the graph's result.
//!
//! **Not exact, on purpose**: every intermediate keeps float32 precision instead of being
//! rounded to float16 after each op, so results are *more* precise than the graph's and
//! differ from a float16 evaluation of it by float16 rounding (relative 2⁻¹¹ per op, compounded
//! by the model: the float16 BERT and LLaMA files of `models/half/` agree with ONNX Runtime's
//! float16 outputs within 1e-2 + 1e-2·|b|, `tests/tests/half_precision.rs`; at most 8.8e-3
//! absolute there, 7.4e-3 on a BERT-base at sequence 128). Where the graph would
//! overflow float16 (|x| > 65504 → ±inf) or flush to zero, the float32 value stays finite;
//! a `Cast` to float16 no longer saturates or rounds (a graph that relies on that, e.g. to clamp
//! on purpose, computes the unclamped value); comparisons, `ArgMax` and `TopK` see unrounded
//! values, so two values float16 would make equal keep their order. Integer, boolean and
//! float64 tensors are untouched. `SessionOptions::half_as_float` off runs the graph as it is.
//!
//! Declined (the graph is left as it is, and [`HalfAsFloat::declined`] says why): a graph
//! with subgraphs (`If`/`Loop` bodies), model-local functions, nodes outside the default ONNX
//! domain, half-precision sparse or external-data initializers, a float16 graph input that
//! also has an initializer, a float16 graph output no node produces.

use std::collections::HashMap;

use attnrt_onnx::proto::{tensor_proto, type_proto, GraphProto, ModelProto, NodeProto};
use attnrt_onnx::{attr, opset, DataType};
use tract_onnx::pb::{self as tpb, attribute_proto::AttributeType};

use super::types::ElemTypes;

const FLOAT: i32 = DataType::Float as i32;

/// Whether `t` (a `DataType` number) is float16 or bfloat16.
fn is_half(t: i32) -> bool {
    t == DataType::Float16 as i32 || t == DataType::Bfloat16 as i32
}

/// Whether `t` is a floating-point type (a `Cast` to it keeps a fraction).
fn is_float(t: i32) -> bool {
    is_half(t) || t == FLOAT || t == DataType::Double as i32
}

/// What the rewrite `half-as-float` makes of a model with half-precision tensors, or why it
/// leaves the model as it is ([`half_as_float_report`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HalfAsFloat {
    /// Half-precision initializers and attribute tensors widened to float32.
    pub tensors: usize,
    /// Their values.
    pub values: u64,
    /// `Cast`s (and `dtype` attributes) to float16/bfloat16 that now ask for float32.
    pub casts: usize,
    /// Graph inputs and outputs declared float16/bfloat16, read or written through a `Cast`.
    pub boundary: usize,
    /// Why the graph is run as it is, when the rewrite is not made.
    pub declined: Option<String>,
}

impl std::fmt::Display for HalfAsFloat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.declined {
            Some(why) => write!(f, "run in half precision as declared ({why})"),
            None => write!(
                f,
                "float16/bfloat16 arithmetic runs in float32 (--half-as-float): {} tensor(s) \
                 ({} values) widened, {} cast(s) to half precision now to float32, {} graph \
                 input/output(s) cast at the boundary",
                self.tensors, self.values, self.casts, self.boundary
            ),
        }
    }
}

/// What the rewrite would do to `model`: `None` when the model has no half-precision tensor
/// to rewrite (the rewrite is then a no-op), else the counts or the reason it is declined.
/// Made from the model alone, so a report can say it without building a session.
pub fn half_as_float_report(model: &ModelProto) -> Option<HalfAsFloat> {
    let g = model.graph.as_ref()?;
    let mut r = count(g);
    if r == HalfAsFloat::default() {
        return None;
    }
    r.declined = decline_reason(model, g);
    Some(r)
}

/// The counts of [`HalfAsFloat`] over `g` (the reason left empty).
fn count(g: &GraphProto) -> HalfAsFloat {
    let mut r = HalfAsFloat::default();
    let mut tensor = |dims: &[i64]| {
        r.tensors += 1;
        r.values += dims.iter().map(|d| (*d).max(0) as u64).product::<u64>();
    };
    for t in g.initializer.iter().filter(|t| is_half(t.data_type)) {
        tensor(&t.dims);
    }
    for n in &g.node {
        for a in &n.attribute {
            for t in
                a.t.iter()
                    .chain(&a.tensors)
                    .filter(|t| is_half(t.data_type))
            {
                tensor(&t.dims);
            }
        }
    }
    r.casts = g.node.iter().filter(|n| asks_for_half(n)).count();
    r.boundary = g
        .input
        .iter()
        .chain(&g.output)
        .filter(|v| declared_type(v).is_some_and(is_half))
        .count();
    r
}

/// Whether `n` is a `Cast` to half precision or has a `dtype` attribute asking for it.
fn asks_for_half(n: &NodeProto) -> bool {
    n.attribute
        .iter()
        .any(|a| type_attribute(&n.op_type, &a.name) && is_half(a.i as i32))
}

/// Whether the attribute `name` of an `op_type` node is an element type its output takes.
fn type_attribute(op_type: &str, name: &str) -> bool {
    name == "dtype" || op_type == "Cast" && name == "to"
}

/// The element type `v` declares, if any.
fn declared_type(v: &attnrt_onnx::proto::ValueInfoProto) -> Option<i32> {
    match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) if t.elem_type != 0 => Some(t.elem_type),
        _ => None,
    }
}

/// Why the rewrite cannot be made on `model` (see the module docs), if it cannot.
fn decline_reason(model: &ModelProto, g: &GraphProto) -> Option<String> {
    if !model.functions.is_empty() {
        return Some("the model defines local functions".into());
    }
    for n in &g.node {
        if !opset::is_default_domain(&n.domain) {
            return Some(format!("node '{}' is in domain '{}'", n.name, n.domain));
        }
        if n.attribute
            .iter()
            .any(|a| a.g.is_some() || !a.graphs.is_empty())
        {
            return Some(format!("node '{}' has a subgraph", n.name));
        }
    }
    if let Some(t) = g.sparse_initializer.iter().find_map(|s| s.values.as_ref()) {
        if is_half(t.data_type) {
            return Some(format!("sparse initializer '{}' is half precision", t.name));
        }
    }
    let external = tensor_proto::DataLocation::External as i32;
    if let Some(t) = g
        .initializer
        .iter()
        .find(|t| is_half(t.data_type) && t.data_location == external)
    {
        return Some(format!(
            "initializer '{}' is stored outside the file",
            t.name
        ));
    }
    boundary_reason(g)
}

/// Why a half-precision graph input or output cannot be kept at the boundary, if one cannot.
fn boundary_reason(g: &GraphProto) -> Option<String> {
    let initialized = |name: &str| g.initializer.iter().any(|t| t.name == name);
    for i in g
        .input
        .iter()
        .filter(|v| declared_type(v).is_some_and(is_half))
    {
        if initialized(&i.name) {
            return Some(format!("graph input '{}' also has an initializer", i.name));
        }
    }
    for o in g
        .output
        .iter()
        .filter(|v| declared_type(v).is_some_and(is_half))
    {
        let produced = g.node.iter().any(|n| n.output.contains(&o.name));
        let is_input = g.input.iter().any(|i| i.name == o.name);
        if !produced && !is_input {
            return Some(format!(
                "graph output '{}' is not computed by a node",
                o.name
            ));
        }
    }
    None
}

/// The pass: `g`, tract's copy of `model`'s graph, computes in float32 where `model` computes
/// in float16/bfloat16 (see the module docs); left alone when the rewrite is declined.
pub(super) fn half_as_float(model: &ModelProto, g: &mut tpb::GraphProto) {
    let Some(report) = half_as_float_report(model) else {
        return;
    };
    if report.declined.is_some() {
        return;
    }
    let Some(source) = model.graph.as_ref() else {
        return;
    };
    let rounded = rounded_casts(source);
    for t in &mut g.initializer {
        widen(t);
    }
    let nodes = std::mem::take(&mut g.node);
    g.node.reserve(nodes.len());
    for (ix, mut n) in nodes.into_iter().enumerate() {
        let half = n.output.first().and_then(|o| rounded.get(o.as_str()));
        if let (Some(half), Some(input)) = (half, n.input.first_mut()) {
            let round = format!("{input}.attnrt_round{ix}");
            let name = format!("attnrt_round{ix}_{}", n.name);
            g.node.push(cast_node(&name, input, &round, *half));
            *input = round;
        }
        g.node.push(widen_node(n));
    }
    for v in &mut g.value_info {
        set_float(v);
    }
    cast_at_boundary(g);
}

/// The `Cast`s of `g` from a half-precision tensor to a non-float type (by output name), with
/// that half type: their input is rounded to it first, as the graph has it.
fn rounded_casts(g: &GraphProto) -> HashMap<&str, i32> {
    let mut types = ElemTypes::new(g);
    let mut out = HashMap::new();
    for n in g.node.iter().filter(|n| n.op_type == "Cast") {
        let to = attr::int(n, "to").ok().flatten().map(|t| t as i32);
        let (Some(to), Some(input), Some(output)) = (to, n.input.first(), n.output.first()) else {
            continue;
        };
        if let Some(half) = types.of(input).filter(|t| is_half(*t) && !is_float(to)) {
            out.insert(output.as_str(), half);
        }
    }
    out
}

/// `n` with its half-precision attribute tensors widened and its `to`/`dtype` asking for
/// float32 instead of half precision.
fn widen_node(mut n: tpb::NodeProto) -> tpb::NodeProto {
    if !opset::is_default_domain(&n.domain) {
        return n;
    }
    for a in &mut n.attribute {
        if type_attribute(&n.op_type, &a.name) && is_half(a.i as i32) {
            a.i = FLOAT as i64;
        }
        for t in a.t.iter_mut().chain(a.tensors.iter_mut()) {
            widen(t);
        }
    }
    n
}

/// A `Cast` node of `input` to `to`, writing `output`.
fn cast_node(name: &str, input: &str, output: &str, to: i32) -> tpb::NodeProto {
    tpb::NodeProto {
        name: name.into(),
        op_type: "Cast".into(),
        input: vec![input.into()],
        output: vec![output.into()],
        attribute: vec![tpb::AttributeProto {
            name: "to".into(),
            r#type: AttributeType::Int as i32,
            i: to as i64,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The element type `v` declares in tract's copy, if any.
fn tract_declared(v: &tpb::ValueInfoProto) -> Option<i32> {
    match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(tpb::type_proto::Value::TensorType(t)) if t.elem_type != 0 => Some(t.elem_type),
        _ => None,
    }
}

/// Declares `v` float32 if it was declared half precision.
fn set_float(v: &mut tpb::ValueInfoProto) {
    if let Some(tpb::type_proto::Value::TensorType(t)) =
        v.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        if is_half(t.elem_type) {
            t.elem_type = FLOAT;
        }
    }
}

/// Half-precision graph inputs are read through a `Cast` to float32, half-precision graph
/// outputs written by a `Cast` from float32; the declared inputs and outputs are unchanged.
fn cast_at_boundary(g: &mut tpb::GraphProto) {
    let mut renamed: HashMap<String, String> = HashMap::new();
    let mut front = Vec::new();
    let mut back = Vec::new();
    let inputs: Vec<String> = g.input.iter().map(|i| i.name.clone()).collect();
    for i in &g.input {
        // Readers get the float32 copy; an input that is also an output passes on unchanged.
        if tract_declared(i).is_some_and(is_half) {
            let wide = format!("{}.attnrt_float", i.name);
            front.push(cast_node(
                &format!("attnrt_widen_{}", i.name),
                &i.name,
                &wide,
                FLOAT,
            ));
            renamed.insert(i.name.clone(), wide);
        }
    }
    for o in &g.output {
        let Some(half) = tract_declared(o).filter(|t| is_half(*t)) else {
            continue;
        };
        if inputs.contains(&o.name) {
            continue;
        }
        let wide = format!("{}.attnrt_float", o.name);
        back.push(cast_node(
            &format!("attnrt_narrow_{}", o.name),
            &wide,
            &o.name,
            half,
        ));
        renamed.insert(o.name.clone(), wide);
    }
    if renamed.is_empty() {
        return;
    }
    for n in &mut g.node {
        for name in n.input.iter_mut().chain(n.output.iter_mut()) {
            if let Some(r) = renamed.get(name.as_str()) {
                *name = r.clone();
            }
        }
    }
    let nodes = std::mem::take(&mut g.node);
    g.node = front.into_iter().chain(nodes).chain(back).collect();
}

/// `t` as float32 if it is float16/bfloat16 (values in `raw_data`, or one per `int32_data`
/// entry as ONNX stores 16-bit types); any other tensor unchanged.
fn widen(t: &mut tpb::TensorProto) {
    let float16 = DataType::Float16 as i32;
    if !is_half(t.data_type) {
        return;
    }
    let bits: Vec<u16> = if t.raw_data.is_empty() {
        t.int32_data.iter().map(|v| *v as u16).collect()
    } else {
        t.raw_data
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect()
    };
    let to_f32 = |b: u16| {
        if t.data_type == float16 {
            attnrt_onnx::tensor::f16_to_f32(b)
        } else {
            f32::from_bits(u32::from(b) << 16)
        }
    };
    let values: Vec<u8> = bits
        .into_iter()
        .flat_map(|b| to_f32(b).to_le_bytes())
        .collect();
    t.raw_data = values;
    t.int32_data.clear();
    t.data_type = FLOAT;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NamedTensor, Session, SessionOptions, Tensor, Threads};
    use attnrt_onnx::attr::make_int;
    use attnrt_onnx::proto::TensorProto;
    use attnrt_testkit::{node, node_with_attrs, tensor_f32, value_info, GraphBuilder};
    use tract_onnx::prelude::{f16, DatumType};

    fn tensor_f16(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: DataType::Float16 as i32,
            raw_data: values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes())
                .collect(),
            ..Default::default()
        }
    }

    /// `y = x·W + b` (float16 in, weights and out) and `i = Cast<int64>(x[0] · s)`, with
    /// x [1, 4] and s chosen so that the product rounds to 3.0 in float16 but is below 3 in
    /// float32.
    fn half_model() -> ModelProto {
        let mut g = GraphBuilder::new("g");
        g.input(value_info("x", DataType::Float16, &[1, 4]));
        let w: Vec<f32> = (0..12).map(|v| v as f32 * 0.25 - 1.0).collect();
        g.initializer(tensor_f16("w", &[4, 3], &w));
        g.initializer(tensor_f16("b", &[3], &[0.5, -0.5, 1.0]));
        g.initializer(tensor_f16("s", &[1, 4], &[2.994_140_6; 4]));
        g.node(node("mm", "MatMul", &["x", "w"], &["xw"]));
        g.node(node("add", "Add", &["xw", "b"], &["y"]));
        g.node(node("mul", "Mul", &["x", "s"], &["p"]));
        g.node(node_with_attrs(
            "cast",
            "Cast",
            &["p"],
            &["i"],
            vec![make_int("to", 7)],
        ));
        g.output(value_info("y", DataType::Float16, &[1, 3]));
        g.output(value_info("i", DataType::Int64, &[1, 4]));
        g.into_model(17)
    }

    fn run(model: &ModelProto, half_as_float: bool) -> (Vec<NamedTensor>, Vec<String>) {
        let x: Vec<f16> = [1.001_953_1, 1.0, -1.0, 0.5].map(f16::from_f32).to_vec();
        let inputs = [NamedTensor {
            name: "x".into(),
            tensor: Tensor::from_shape(&[1, 4], &x).unwrap(),
        }];
        let options = SessionOptions {
            half_as_float,
            ..SessionOptions::per_shape()
        };
        let threads = Threads::new(Some(1)).unwrap();
        let s = Session::build_with_options(model, &inputs, &threads, "half", &options).unwrap();
        (s.run(&inputs).unwrap(), s.op_names())
    }

    #[test]
    fn a_float16_graph_runs_in_float32_and_keeps_its_interface() {
        let model = half_model();
        let report = half_as_float_report(&model).unwrap();
        assert_eq!((report.tensors, report.values, report.boundary), (3, 19, 2));
        assert_eq!(report.declined, None);
        let (on, on_ops) = run(&model, true);
        let (off, off_ops) = run(&model, false);
        for out in [&on, &off] {
            assert_eq!(out[0].tensor.datum_type(), DatumType::F16);
            // The Cast to int64 sees the product rounded to float16 (3.0), as the graph has it,
            // not the float32 product 2.99998856.
            // (tract hands this integer output back as TDim: read it as int64.)
            let i = out[1].tensor.cast_to_dt(DatumType::I64).unwrap();
            let i = i
                .try_as_plain_ram()
                .unwrap()
                .as_slice::<i64>()
                .unwrap()
                .to_vec();
            assert_eq!(i, [3, 2, -2, 1]);
        }
        let y = |t: &Tensor| -> Vec<f32> {
            t.try_as_plain_ram()
                .unwrap()
                .as_slice::<f16>()
                .unwrap()
                .iter()
                .map(|v| v.to_f32())
                .collect()
        };
        for (a, b) in y(&on[0].tensor).iter().zip(y(&off[0].tensor)) {
            assert!((a - b).abs() <= 2e-3 * b.abs() + 1e-3, "{a} vs {b}");
        }
        let projections = |ops: &[String]| {
            ops.iter()
                .filter(|o| o.as_str() == crate::projection::OP_NAME)
                .count()
        };
        assert_eq!(projections(&on_ops), 1, "{on_ops:?}");
        assert_eq!(projections(&off_ops), 0, "{off_ops:?}");
    }

    /// float32 in and out, bfloat16 inside (`Cast`s at the boundary, a bfloat16 weight): tract
    /// has no bfloat16, so the graph runs only through the rewrite, as a float32 projection.
    #[test]
    fn a_bfloat16_graph_with_float32_boundaries_runs_on_the_float32_kernels() {
        let mut g = GraphBuilder::new("g");
        g.input(value_info("x", DataType::Float, &[2, 2]));
        // bfloat16 bits of 1.0, 2.0, -0.5, 0.25 ([2, 2] row-major).
        g.initializer(TensorProto {
            name: "w".into(),
            dims: vec![2, 2],
            data_type: DataType::Bfloat16 as i32,
            int32_data: vec![0x3f80, 0x4000, 0xbf00, 0x3e80],
            ..Default::default()
        });
        let to = |t: DataType| vec![make_int("to", t as i64)];
        g.node(node_with_attrs(
            "in",
            "Cast",
            &["x"],
            &["xb"],
            to(DataType::Bfloat16),
        ));
        g.node(node("mm", "MatMul", &["xb", "w"], &["yb"]));
        g.node(node_with_attrs(
            "out",
            "Cast",
            &["yb"],
            &["y"],
            to(DataType::Float),
        ));
        g.output(value_info("y", DataType::Float, &[2, 2]));
        let model = g.into_model(17);
        let inputs = [NamedTensor {
            name: "x".into(),
            tensor: Tensor::from_shape(&[2, 2], &[1.0f32, 2.0, 3.0, -1.0]).unwrap(),
        }];
        let threads = Threads::new(Some(1)).unwrap();
        let s = Session::build_with_options(
            &model,
            &inputs,
            &threads,
            "bf16",
            &SessionOptions::per_shape(),
        )
        .unwrap();
        let y = s.run(&inputs).unwrap();
        let y = y[0]
            .tensor
            .try_as_plain_ram()
            .unwrap()
            .as_slice::<f32>()
            .unwrap()
            .to_vec();
        assert_eq!(y, [0.0, 2.5, 3.5, 5.75]);
        assert!(
            s.op_names().iter().any(|o| o == crate::projection::OP_NAME),
            "{:?}",
            s.op_names()
        );
        assert_eq!(half_as_float_report(&model).unwrap().casts, 1);
        // As declared, tract refuses the bfloat16 graph: an error, not a panic.
        let off = SessionOptions {
            half_as_float: false,
            ..SessionOptions::per_shape()
        };
        let err = Session::build_with_options(&model, &inputs, &threads, "bf16", &off).unwrap_err();
        assert!(format!("{err:#}").contains("Bfloat16"), "{err:#}");
    }

    #[test]
    fn bfloat16_and_float16_tensors_widen_exactly() {
        let mut t = tpb::TensorProto {
            data_type: DataType::Bfloat16 as i32,
            dims: vec![3],
            int32_data: vec![0x3f80, 0xc000, 0x3e20],
            ..Default::default()
        };
        widen(&mut t);
        assert_eq!(t.data_type, FLOAT);
        let v: Vec<f32> = t
            .raw_data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(v, [1.0, -2.0, 0.15625]);
        let mut h = tpb::TensorProto {
            data_type: DataType::Float16 as i32,
            dims: vec![2],
            raw_data: [0x3c00u16, 0x7c00]
                .iter()
                .flat_map(|b| b.to_le_bytes())
                .collect(),
            ..Default::default()
        };
        widen(&mut h);
        let v: Vec<f32> = h
            .raw_data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(v, [1.0, f32::INFINITY]);
    }

    #[test]
    fn float32_models_are_not_reported_and_foreign_domains_decline() {
        let mut g = GraphBuilder::new("g");
        g.input(value_info("x", DataType::Float, &[2]));
        g.initializer(tensor_f32("w", &[2], &[1.0, 2.0]));
        g.node(node("m", "Mul", &["x", "w"], &["y"]));
        g.output(value_info("y", DataType::Float, &[2]));
        assert_eq!(half_as_float_report(&g.into_model(17)), None);

        let mut g = GraphBuilder::new("g");
        g.input(value_info("x", DataType::Float16, &[2]));
        g.initializer(tensor_f16("w", &[2], &[1.0, 2.0]));
        let mut n = node("fm", "FastMul", &["x", "w"], &["y"]);
        n.domain = "com.example".into();
        g.node(n);
        g.output(value_info("y", DataType::Float16, &[2]));
        let r = half_as_float_report(&g.into_model(17)).unwrap();
        assert_eq!(
            r.declined.as_deref(),
            Some("node 'fm' is in domain 'com.example'")
        );
        assert!(r.to_string().contains("as declared"), "{r}");
    }
}
