//! Test scaffolding shared by attnrt's tests and benches: builders for small ONNX graphs over
//! the `attnrt_onnx` protos, the bytes of a `.npy` file, ready-made blocks ([`blocks`],
//! [`cache_block`], [`lm_head`]), and the shipped models' manifest ([`manifest`]).
//!
//! Only for `[dev-dependencies]` (and the `tests/` and `benches/` crates): nothing here checks
//! its input, as a test wants to be able to build broken models too.
//!
//! ```
//! use attnrt_onnx::{attr, DataType};
//! use attnrt_testkit::{model, node_with_attrs, tensor_f32, value_info, GraphBuilder};
//!
//! // y = Softmax(x · w) over x: [batch, 4].
//! let mut g = GraphBuilder::new("tiny");
//! g.input(value_info("x", DataType::Float, &["batch", "4"]));
//! g.initializer(tensor_f32("w", &[4, 3], &[0.5; 12]));
//! g.node(node_with_attrs("mm", "MatMul", &["x", "w"], &["s"], vec![]));
//! g.node(node_with_attrs("sm", "Softmax", &["s"], &["y"], vec![attr::make_int("axis", -1)]));
//! g.output(value_info("y", DataType::Float, &["batch", "3"]));
//! let m = model(g.finish(), 17);
//! assert_eq!(m.ir_version, 8);
//! ```

pub mod blocks;
pub mod cache_block;
pub mod gelu;
pub mod lm_head;
pub mod manifest;

use attnrt_onnx::opset::min_ir_version_for_opset;
use attnrt_onnx::proto::{tensor_shape_proto, type_proto, TensorShapeProto, TypeProto};
use attnrt_onnx::{
    AttributeProto, DataType, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    ValueInfoProto,
};

/// One dimension of a value info's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim<'a> {
    /// A fixed extent (`dim_value`).
    Fixed(i64),
    /// A named symbolic extent (`dim_param`).
    Sym(&'a str),
}

impl From<i64> for Dim<'_> {
    fn from(v: i64) -> Self {
        Dim::Fixed(v)
    }
}

/// `"4"` is a fixed extent, any other text (`"batch"`, `"L"`) a symbolic one: the short form
/// the tests write shapes in.
impl<'a> From<&'a str> for Dim<'a> {
    fn from(s: &'a str) -> Self {
        match s.parse::<i64>() {
            Ok(v) => Dim::Fixed(v),
            Err(_) => Dim::Sym(s),
        }
    }
}

/// A tensor type of element type `elem` with the given shape; `dims` may be [`Dim`]s, `i64`s
/// (all fixed) or `&str`s (numbers fixed, names symbolic).
pub fn tensor_type<'a, D>(elem: DataType, dims: &[D]) -> TypeProto
where
    D: Copy + Into<Dim<'a>>,
{
    let dim = dims
        .iter()
        .map(|&d| tensor_shape_proto::Dimension {
            value: Some(match d.into() {
                Dim::Fixed(v) => tensor_shape_proto::dimension::Value::DimValue(v),
                Dim::Sym(s) => tensor_shape_proto::dimension::Value::DimParam(s.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: elem as i32,
            shape: Some(TensorShapeProto { dim }),
        })),
        ..Default::default()
    }
}

/// A graph input/output/value info named `name`: a tensor of `elem` with `dims` (see
/// [`tensor_type`] for what `dims` may hold).
pub fn value_info<'a, D>(name: &str, elem: DataType, dims: &[D]) -> ValueInfoProto
where
    D: Copy + Into<Dim<'a>>,
{
    ValueInfoProto {
        name: name.into(),
        r#type: Some(tensor_type(elem, dims)),
        ..Default::default()
    }
}

/// A float value info with fixed `dims`, the most common case.
pub fn float_value(name: &str, dims: &[i64]) -> ValueInfoProto {
    value_info(name, DataType::Float, dims)
}

/// A default-domain node named `name` without attributes.
pub fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    node_with_attrs(name, op, inputs, outputs, Vec::new())
}

/// A default-domain node named `name` with attributes (`attnrt_onnx::attr::make_*`).
/// An empty input name leaves that optional input unwired, as ONNX spells it.
pub fn node_with_attrs(
    name: &str,
    op: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        name: name.into(),
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

/// A float initializer with `raw_data`.
pub fn tensor_f32(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    attnrt_onnx::tensor::from_f32(name, dims, values)
}

/// An int64 initializer with `raw_data`.
pub fn tensor_i64(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
    attnrt_onnx::tensor::from_i64(name, dims, values)
}

/// A 1-D int64 initializer holding `values` (shape and axes operands).
pub fn tensor_i64_1d(name: &str, values: &[i64]) -> TensorProto {
    tensor_i64(name, &[values.len() as i64], values)
}

/// An int8 initializer with `raw_data` (a quantized weight or zero point).
pub fn tensor_i8(name: &str, dims: &[i64], values: &[i8]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.to_vec(),
        data_type: DataType::Int8 as i32,
        raw_data: values.iter().map(|&v| v as u8).collect(),
        ..Default::default()
    }
}

/// A bool initializer with `raw_data` (one byte per element, as ONNX stores bools).
pub fn tensor_bool(name: &str, dims: &[i64], values: &[bool]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.to_vec(),
        data_type: DataType::Bool as i32,
        raw_data: values
            .iter()
            .map(|&b| u8::from(b))
            .collect::<Vec<u8>>()
            .into(),
        ..Default::default()
    }
}

/// A model around `graph` importing the default domain at `opset`, with the lowest IR version
/// that allows it. Other fields by struct update: `ModelProto { ir_version: 10, ..model(g, 23) }`.
pub fn model(graph: GraphProto, opset: i64) -> ModelProto {
    ModelProto {
        ir_version: min_ir_version_for_opset(opset),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(graph),
        ..Default::default()
    }
}

/// A graph assembled piece by piece; [`GraphBuilder::next_id`] numbers generated names so
/// that a test's own naming scheme (`t3`, `MatMul_4`, ...) stays in the test.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: GraphProto,
    next: usize,
}

impl GraphBuilder {
    /// An empty graph named `name`.
    pub fn new(name: &str) -> Self {
        GraphBuilder {
            graph: GraphProto {
                name: name.into(),
                ..Default::default()
            },
            next: 0,
        }
    }

    /// A number not returned before by this builder: 1, 2, 3, ...
    pub fn next_id(&mut self) -> usize {
        self.next += 1;
        self.next
    }

    /// Adds a graph input and returns its name.
    pub fn input(&mut self, v: ValueInfoProto) -> String {
        let name = v.name.clone();
        self.graph.input.push(v);
        name
    }

    /// Adds a graph output.
    pub fn output(&mut self, v: ValueInfoProto) {
        self.graph.output.push(v);
    }

    /// Adds an initializer and returns its name.
    pub fn initializer(&mut self, t: TensorProto) -> String {
        let name = t.name.clone();
        self.graph.initializer.push(t);
        name
    }

    /// Adds a node and returns the name of its first output (empty if it has none).
    pub fn node(&mut self, n: NodeProto) -> String {
        let out = n.output.first().cloned().unwrap_or_default();
        self.graph.node.push(n);
        out
    }

    /// The graph built so far.
    pub fn graph(&self) -> &GraphProto {
        &self.graph
    }

    /// The graph.
    pub fn finish(self) -> GraphProto {
        self.graph
    }

    /// The graph in a model at `opset` (see [`model`]).
    pub fn into_model(self, opset: i64) -> ModelProto {
        model(self.graph, opset)
    }
}

/// The input and output names of node `i` of a chain of `n` nodes from `x` to `y` through
/// `t0, t1, …`.
pub fn chain_link(i: usize, n: usize) -> (String, String) {
    let input = match i {
        0 => "x".to_string(),
        _ => format!("t{}", i - 1),
    };
    let output = if i + 1 == n {
        "y".to_string()
    } else {
        format!("t{i}")
    };
    (input, output)
}

/// A chain of `n` nodes on one `float[4]` input `x` to the output `y` (ir_version 8, opset 17):
/// `Identity` nodes, except that nodes from index `adds_from` on are `Add` nodes with one
/// `float[4]` initializer each (1e-3). The graph-size benchmarks and tests build it.
pub fn node_chain(n: usize, adds_from: usize) -> ModelProto {
    let mut g = GraphBuilder::new("chain");
    g.input(float_value("x", &[4]));
    for i in 0..n {
        let (input, output) = chain_link(i, n);
        if i >= adds_from {
            let c = g.initializer(tensor_f32(&format!("c{i}"), &[4], &[1e-3; 4]));
            g.node(node(&format!("add{i}"), "Add", &[&input, &c], &[&output]));
        } else {
            g.node(node(&format!("id{i}"), "Identity", &[&input], &[&output]));
        }
    }
    g.output(float_value("y", &[4]));
    g.into_model(17)
}

/// `y = Pow(x, e)` on one float input `x` of shape `dims`, with `e` a rank-0 float
/// initializer equal to `exponent` (ir_version 8, opset 17): the `Pow` of GPT-2's GELU
/// (`x³`), for the Pow-lowering benchmark and tests.
pub fn pow_model(dims: &[i64], exponent: f32) -> ModelProto {
    let mut g = GraphBuilder::new("pow");
    g.input(float_value("x", dims));
    g.initializer(tensor_f32("e", &[], &[exponent]));
    g.node(node("pow", "Pow", &["x", "e"], &["y"]));
    g.output(float_value("y", dims));
    g.into_model(17)
}

/// A `.npy` file (format 1.0) with dtype `descr` (`<f4`, `<i8`, ...), C order, `shape` and the
/// raw little-endian `data` (not checked against the shape, so tests can truncate it).
pub fn npy_bytes(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let shape_txt = match shape {
        // A 1-tuple needs its trailing comma in Python's syntax.
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // The header is padded with spaces and a newline so that the data starts 64-aligned.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// `n` deterministic values in `[-1, 1]` (steps of 0.001) from a multiplicative hash of the index
/// and `seed`: test data that differs per seed and needs no RNG crate.
pub fn seeded_values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8;
            (h % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_from_text_are_fixed_when_numeric() {
        let t = tensor_type(DataType::Float, &["batch", "4"]);
        let Some(type_proto::Value::TensorType(t)) = t.value else {
            panic!("tensor type")
        };
        let dims: Vec<_> = t.shape.unwrap().dim.into_iter().map(|d| d.value).collect();
        assert_eq!(
            dims,
            vec![
                Some(tensor_shape_proto::dimension::Value::DimParam(
                    "batch".into()
                )),
                Some(tensor_shape_proto::dimension::Value::DimValue(4)),
            ]
        );
    }

    #[test]
    fn npy_header_is_64_aligned_and_shapes_use_python_tuples() {
        for (shape, txt) in [(&[][..], "()"), (&[3][..], "(3,)"), (&[2, 3][..], "(2, 3)")] {
            let b = npy_bytes("<f4", shape, &[1, 2]);
            assert_eq!((b.len() - 2) % 64, 0);
            let header = String::from_utf8_lossy(&b[10..b.len() - 2]).into_owned();
            assert!(header.contains(&format!("'shape': {txt}")), "{header}");
            assert_eq!(&b[b.len() - 2..], &[1, 2]);
        }
    }

    #[test]
    fn initializers_and_nodes_are_wired_by_name() {
        let mut g = GraphBuilder::new("g");
        let m = g.initializer(tensor_bool("m", &[3], &[true, false, true]));
        let axes = g.initializer(tensor_i64_1d("axes", &[0, 2]));
        let y = g.node(node("where", "Where", &[&m, "x", "z"], &["y"]));
        g.output(value_info(
            "y",
            DataType::Float,
            &[Dim::Fixed(3), Dim::Sym("n")],
        ));
        assert_eq!((m.as_str(), axes.as_str(), y.as_str()), ("m", "axes", "y"));
        assert_eq!((g.next_id(), g.next_id()), (1, 2));
        let graph = g.finish();
        assert_eq!(graph.initializer[0].raw_data, vec![1, 0, 1]);
        assert_eq!(graph.initializer[0].data_type, DataType::Bool as i32);
        assert_eq!(graph.initializer[1].dims, vec![2]);
        assert_eq!(graph.node[0].input, vec!["m", "x", "z"]);
        assert_eq!(graph.output[0].name, "y");
    }

    #[test]
    fn model_uses_the_lowest_ir_version_for_its_opset() {
        assert_eq!(model(GraphProto::default(), 17).ir_version, 8);
        assert_eq!(model(GraphProto::default(), 23).ir_version, 11);
    }
}
