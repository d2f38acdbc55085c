//! Operator-level validation (issue 28): each rule refuses a small invalid model with one
//! line naming the node and the attribute or input, accepts the valid neighbour of that
//! model, and every shipped model passes. Many of these models come from a mutation fuzzer's
//! findings, where tract hung or ate memory. `tests/python/test_op_check_ort.py` builds the
//! same kinds of models in Python and confirms ONNX Runtime refuses each and runs its valid
//! neighbour.

mod common;

use common::{models_dir, shipped_models};

use attnrt_onnx::attr::{make_float, make_int, make_ints, make_tensor};
use attnrt_onnx::proto::{
    tensor_shape_proto::{dimension, Dimension},
    type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use attnrt_onnx::{
    load_model, load_model_from_bytes, tensor, validate_model, AttributeProto, Limits, Message,
    OpError, ValidationError,
};

// ---------------------------------------------------------------------------------------------
// A small graph builder: float inputs of given dims (-1 for a symbolic extent), int64
// initializers, nodes; every output no node reads becomes a graph output.

struct G {
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    value_info: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
}

fn shaped(name: &str, dims: Option<&[i64]>) -> ValueInfoProto {
    let shape = dims.map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .enumerate()
            .map(|(i, &d)| Dimension {
                value: Some(if d < 0 {
                    dimension::Value::DimParam(format!("s{i}"))
                } else {
                    dimension::Value::DimValue(d)
                }),
                ..Default::default()
            })
            .collect(),
    });
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
                shape,
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl G {
    fn new(opset: i64) -> G {
        G {
            opset,
            nodes: Vec::new(),
            inputs: Vec::new(),
            value_info: Vec::new(),
            inits: Vec::new(),
        }
    }

    fn input(mut self, name: &str, dims: &[i64]) -> G {
        self.inputs.push(shaped(name, Some(dims)));
        self
    }

    fn input_unranked(mut self, name: &str) -> G {
        self.inputs.push(shaped(name, None));
        self
    }

    fn value_info(mut self, name: &str, dims: &[i64]) -> G {
        self.value_info.push(shaped(name, Some(dims)));
        self
    }

    fn ints(mut self, name: &str, values: &[i64]) -> G {
        self.inits
            .push(tensor::from_i64(name, &[values.len() as i64], values));
        self
    }

    fn ints_dims(mut self, name: &str, dims: &[i64], values: &[i64]) -> G {
        self.inits.push(tensor::from_i64(name, dims, values));
        self
    }

    fn node(self, name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> G {
        self.node_with(name, op, inputs, outputs, vec![])
    }

    fn node_with(
        mut self,
        name: &str,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> G {
        self.nodes.push(NodeProto {
            name: name.into(),
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        });
        self
    }

    fn graph(self) -> GraphProto {
        let read: Vec<&String> = self.nodes.iter().flat_map(|n| &n.input).collect();
        let output = self
            .nodes
            .iter()
            .flat_map(|n| &n.output)
            .filter(|o| !o.is_empty() && !read.contains(o))
            .map(|o| shaped(o, None))
            .collect();
        GraphProto {
            name: "g".into(),
            node: self.nodes,
            input: self.inputs,
            value_info: self.value_info,
            initializer: self.inits,
            output,
            ..Default::default()
        }
    }

    fn model(self) -> ModelProto {
        let opset = self.opset;
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            graph: Some(self.graph()),
            ..Default::default()
        }
    }
}

/// The operator error validation gives `m`; fails the test when there is none or when it is
/// another kind of error.
fn refusal(m: &ModelProto) -> OpError {
    match validate_model(m) {
        Err(ValidationError::Op(e)) => e,
        other => panic!("expected an operator error, got {other:?}"),
    }
}

/// The one line of `refusal`, checked to hold every one of `parts`.
fn refused(m: &ModelProto, parts: &[&str]) -> String {
    let line = refusal(m).to_string();
    assert!(!line.contains('\n'), "{line}");
    for p in parts {
        assert!(line.contains(p), "{line:?} lacks {p:?}");
    }
    line
}

fn accepted(m: &ModelProto) {
    validate_model(m).unwrap_or_else(|e| panic!("refused a valid model: {e}"));
}

fn transpose(perm: &[i64]) -> ModelProto {
    G::new(17)
        .input("x", &[2, 3, 4, 5])
        .node_with(
            "t",
            "Transpose",
            &["x"],
            &["y"],
            vec![make_ints("perm", perm)],
        )
        .model()
}

// ---------------------------------------------------------------------------------------------
// Transpose

#[test]
fn transpose_perm_must_be_a_permutation_of_the_input_axes() {
    assert_eq!(
        refusal(&transpose(&[0, 1, 1, 3])).to_string(),
        "node 't' (Transpose): attribute perm [0, 1, 1, 3] repeats axis 1"
    );
    refused(
        &transpose(&[0, 2, 0, 3]),
        &["'t'", "perm", "repeats axis 0"],
    );
    refused(&transpose(&[0, 1, 2, 4]), &["'t'", "perm", "holds 4"]);
    refused(&transpose(&[-1, 0, 1, 2]), &["'t'", "perm", "holds -1"]);
    assert_eq!(
        refusal(&transpose(&[1, 0])).to_string(),
        "node 't' (Transpose): attribute perm [1, 0] has 2 value(s), but input 0 'x' has rank 4"
    );
    accepted(&transpose(&[0, 2, 1, 3]));
    // Without a stated rank a repeat is still a repeat.
    let unranked = G::new(17).input_unranked("x").node_with(
        "t",
        "Transpose",
        &["x"],
        &["y"],
        vec![make_ints("perm", &[2, 2, 1])],
    );
    refused(
        &unranked.model(),
        &["'t'", "perm [2, 2, 1]", "repeats axis 2"],
    );
    let no_perm = G::new(17)
        .input("x", &[2, 3])
        .node("t", "Transpose", &["x"], &["y"]);
    accepted(&no_perm.model());
}

#[test]
fn an_unnamed_node_is_named_by_its_output() {
    let mut m = transpose(&[3, 3, 1, 0]);
    m.graph.as_mut().unwrap().node[0].name.clear();
    refused(&m, &["node '<Transpose -> y>' (Transpose)", "perm"]);
}

// ---------------------------------------------------------------------------------------------
// Arity

#[test]
fn input_and_output_counts_follow_the_schema_at_the_models_opset() {
    let one = G::new(17)
        .input("x", &[2, 3])
        .node("mm", "MatMul", &["x"], &["y"]);
    assert_eq!(
        refusal(&one.model()).to_string(),
        "node 'mm' (MatMul): has 1 input(s); MatMul at opset 17 takes 2"
    );
    let empty = G::new(17)
        .input("x", &[2, 3])
        .node("mm", "MatMul", &["x", ""], &["y"]);
    refused(&empty.model(), &["'mm'", "input 1 is required but empty"]);
    let two_out = G::new(17)
        .input("x", &[2, 3])
        .node("sm", "Softmax", &["x"], &["y", "z"]);
    refused(&two_out.model(), &["'sm'", "2 output(s)", "gives 1"]);
    // Gemm's C became optional at opset 11.
    let gemm = |opset| {
        G::new(opset)
            .input("a", &[2, 3])
            .input("b", &[3, 4])
            .node("g", "Gemm", &["a", "b"], &["y"])
            .model()
    };
    refused(
        &gemm(9),
        &["'g'", "has 2 input(s); Gemm at opset 9 takes 3"],
    );
    accepted(&gemm(11));
    // An empty name is how ONNX omits an optional input.
    let ln = G::new(17).input("x", &[2, 4]).input("s", &[4]).node(
        "ln",
        "LayerNormalization",
        &["x", "s", ""],
        &["y"],
    );
    accepted(&ln.model());
    let concat = G::new(17).input("x", &[2]).node_with(
        "c",
        "Concat",
        &["x", "x", "x", "x"],
        &["y"],
        vec![make_int("axis", 0)],
    );
    accepted(&concat.model());
}

// ---------------------------------------------------------------------------------------------
// Axis attributes

#[test]
fn axis_attributes_lie_inside_the_input_rank() {
    let softmax = |opset, dims: &[i64], axis: Option<i64>| {
        let attrs = axis.map(|a| vec![make_int("axis", a)]).unwrap_or_default();
        G::new(opset)
            .input("x", dims)
            .node_with("sm", "Softmax", &["x"], &["y"], attrs)
            .model()
    };
    assert_eq!(
        refusal(&softmax(17, &[2, 3, 4, 5], Some(5))).to_string(),
        "node 'sm' (Softmax): attribute axis 5 is outside [-4, 4) for input 0 'x' of rank 4"
    );
    refused(&softmax(17, &[2, 3, 4, 5], Some(-5)), &["'sm'", "axis -5"]);
    accepted(&softmax(17, &[2, 3, 4, 5], Some(-4)));
    // The default axis was 1 before opset 13, -1 since; a scalar has no axis.
    refused(
        &softmax(11, &[4], None),
        &["'sm'", "axis 1 (the default)", "rank 1"],
    );
    accepted(&softmax(13, &[4], None));
    refused(&softmax(17, &[], None), &["'sm'", "rank 0"]);

    let ln = |axis| {
        G::new(17)
            .input("x", &[2, 3, 4, 5])
            .input("s", &[5])
            .node_with(
                "ln",
                "LayerNormalization",
                &["x", "s"],
                &["y"],
                vec![make_int("axis", axis)],
            )
            .model()
    };
    refused(&ln(4), &["'ln'", "attribute axis 4 is outside", "rank 4"]);
    accepted(&ln(-1));

    let flatten = |axis| {
        G::new(17)
            .input("x", &[2, 3])
            .node_with("f", "Flatten", &["x"], &["y"], vec![make_int("axis", axis)])
            .model()
    };
    accepted(&flatten(2)); // Flatten's axis may equal the rank
    refused(&flatten(3), &["'f'", "axis 3", "[-2, 3)"]);

    let argmax = G::new(17).input("x", &[2, 3]).node_with(
        "am",
        "ArgMax",
        &["x"],
        &["y"],
        vec![make_int("axis", 2)],
    );
    refused(&argmax.model(), &["'am'", "attribute axis 2 is outside"]);
}

#[test]
fn an_attribute_of_the_wrong_type_is_refused() {
    let m = G::new(17).input("x", &[2, 3]).node_with(
        "sm",
        "Softmax",
        &["x"],
        &["y"],
        vec![make_float("axis", 1.0)],
    );
    refused(&m.model(), &["'sm'", "attribute axis must be of type INT"]);
}

#[test]
fn cumsum_axis_input_lies_inside_the_rank() {
    let m = |axis| {
        G::new(17)
            .input("x", &[2, 3])
            .ints_dims("a", &[], &[axis])
            .node("cs", "CumSum", &["x", "a"], &["y"])
            .model()
    };
    refused(&m(7), &["'cs'", "input 1 'a' [7]", "axis 7"]);
    accepted(&m(-2));
}

// ---------------------------------------------------------------------------------------------
// Axes lists: Squeeze, Unsqueeze, Reduce*

#[test]
fn squeeze_and_unsqueeze_axes_follow_their_opset_signature() {
    // Before opset 13 the axes are an attribute; from 13 an input.
    let sq11 = |axes: &[i64]| {
        G::new(11)
            .input("x", &[1, 3])
            .node_with(
                "sq",
                "Squeeze",
                &["x"],
                &["y"],
                vec![make_ints("axes", axes)],
            )
            .model()
    };
    refused(&sq11(&[2]), &["'sq'", "attribute axes [2]", "axis 2"]);
    accepted(&sq11(&[0]));
    let sq13 = |axes: &[i64]| {
        G::new(13)
            .input("x", &[1, 3])
            .ints("a", axes)
            .node("sq", "Squeeze", &["x", "a"], &["y"])
            .model()
    };
    refused(&sq13(&[1]), &["'sq'", "input 1 'a' [1]", "extent 3"]);
    // ONNX Runtime accepts a repeated Squeeze axis.
    accepted(&sq13(&[0, -2]));
    let stale = G::new(13).input("x", &[1, 3]).node_with(
        "sq",
        "Squeeze",
        &["x"],
        &["y"],
        vec![make_ints("axes", &[0])],
    );
    refused(
        &stale.model(),
        &[
            "'sq'",
            "attribute axes is not an attribute of Squeeze at opset 13",
        ],
    );

    let unsq = |axes: &[i64]| {
        G::new(17)
            .input("x", &[2, 3])
            .ints("a", axes)
            .node("u", "Unsqueeze", &["x", "a"], &["y"])
            .model()
    };
    refused(
        &unsq(&[0, 0]),
        &["'u'", "input 1 'a' [0, 0]", "repeats axis 0"],
    );
    refused(&unsq(&[1, -3]), &["'u'", "repeats axis -3"]);
    refused(&unsq(&[4]), &["'u'", "axis 4", "the output of rank 3"]);
    accepted(&unsq(&[-3]));
    let unsq11 = G::new(11)
        .input("x", &[2])
        .node("u", "Unsqueeze", &["x"], &["y"]);
    refused(&unsq11.model(), &["'u'", "attribute axes is required"]);
}

#[test]
fn reduce_axes_lie_inside_the_rank_as_attribute_or_input() {
    let mean17 = |axes: &[i64]| {
        G::new(17)
            .input("x", &[2, 3, 4])
            .node_with(
                "r",
                "ReduceMean",
                &["x"],
                &["y"],
                vec![make_ints("axes", axes)],
            )
            .model()
    };
    refused(&mean17(&[3]), &["'r'", "attribute axes [3]", "rank 3"]);
    accepted(&mean17(&[1, 1])); // ONNX Runtime accepts a repeat here
    let mean18 = G::new(18).input("x", &[2, 3, 4]).ints("a", &[-4]).node(
        "r",
        "ReduceMean",
        &["x", "a"],
        &["y"],
    );
    refused(&mean18.model(), &["'r'", "input 1 'a' [-4]"]);
    // ReduceSum took its axes as an input already from opset 13.
    let sum13 = G::new(13).input("x", &[2, 3, 4]).ints("a", &[5]).node(
        "r",
        "ReduceSum",
        &["x", "a"],
        &["y"],
    );
    refused(&sum13.model(), &["'r'", "input 1 'a' [5]"]);
    let stale = G::new(18).input("x", &[2, 3]).node_with(
        "r",
        "ReduceMax",
        &["x"],
        &["y"],
        vec![make_ints("axes", &[0])],
    );
    refused(
        &stale.model(),
        &["'r'", "not an attribute of ReduceMax at opset 18"],
    );
}

// ---------------------------------------------------------------------------------------------
// Concat, Reshape, Expand, Tile

#[test]
fn concat_needs_its_axis_and_inputs_of_one_rank() {
    let concat = |b: &[i64], attrs: Vec<AttributeProto>| {
        G::new(17)
            .input("a", &[2, 3])
            .input("b", b)
            .node_with("c", "Concat", &["a", "b"], &["y"], attrs)
            .model()
    };
    refused(
        &concat(&[2, 3], vec![]),
        &["'c'", "attribute axis is required"],
    );
    refused(
        &concat(&[3], vec![make_int("axis", 0)]),
        &["'c'", "input 1 'b' has rank 1, but input 0 'a' has rank 2"],
    );
    refused(
        &concat(&[2, 3], vec![make_int("axis", 2)]),
        &["'c'", "axis 2"],
    );
    accepted(&concat(&[5, 3], vec![make_int("axis", -2)]));
}

fn reshape(input: &[i64], target: &[i64], allowzero: Option<i64>) -> ModelProto {
    let attrs = allowzero
        .map(|a| vec![make_int("allowzero", a)])
        .unwrap_or_default();
    G::new(17)
        .input("x", input)
        .ints("shape", target)
        .node_with("r", "Reshape", &["x", "shape"], &["y"], attrs)
        .model()
}

#[test]
fn reshape_targets_must_fit_the_input() {
    assert_eq!(
        refusal(&reshape(&[2, 3, 4, 5], &[7, -1], None)).to_string(),
        "node 'r' (Reshape): input 1 'shape' [7, -1] asks for a multiple of 7 elements (with its -1), but input 0 'x' of shape [2, 3, 4, 5] has 120"
    );
    refused(
        &reshape(&[2, 3, 4, 5], &[7, 8], None),
        &["'r'", "56 elements", "has 120"],
    );
    refused(
        &reshape(&[-1, 4], &[-1, -1], None),
        &["'r'", "more than one -1"],
    );
    refused(&reshape(&[-1, 4], &[-2, 4], None), &["'r'", "holds -2"]);
    refused(
        &reshape(&[6, 4], &[4, 3, 0, 2], None),
        &["'r'", "0 at position 2"],
    );
    refused(
        &reshape(&[0, 4], &[0, -1], Some(1)),
        &["'r'", "both 0 and -1"],
    );
    // 0 copies the input's extent; -1 takes the rest; symbolic extents are not counted.
    accepted(&reshape(&[2, 3, 4, 5], &[0, 0, -1], None));
    accepted(&reshape(&[2, 3, 4, 5], &[2, 12, 5], None));
    accepted(&reshape(&[-1, 3, 4, 5], &[0, 7, -1], None));
    accepted(&reshape(&[0, 4], &[0, 8], Some(1)));
    let matrix = G::new(17)
        .input("x", &[2, 3])
        .ints_dims("shape", &[1, 2], &[3, 2])
        .node("r", "Reshape", &["x", "shape"], &["y"]);
    refused(
        &matrix.model(),
        &["'r'", "input 1 'shape' [3, 2] has rank 2"],
    );
}

#[test]
fn expand_and_tile_arguments_fit_the_input() {
    let expand = |shape: &[i64]| {
        G::new(17)
            .input("x", &[3, 1])
            .ints("s", shape)
            .node("e", "Expand", &["x", "s"], &["y"])
            .model()
    };
    refused(
        &expand(&[5, 4]),
        &["'e'", "input 1 's' [5, 4]", "does not broadcast"],
    );
    refused(&expand(&[-1, 4]), &["'e'", "holds -1"]);
    accepted(&expand(&[2, 3, 4]));
    accepted(&expand(&[1]));
    let tile = |repeats: &[i64]| {
        G::new(17)
            .input("x", &[3, 4])
            .ints("n", repeats)
            .node("t", "Tile", &["x", "n"], &["y"])
            .model()
    };
    refused(
        &tile(&[2]),
        &["'t'", "input 1 'n' [2] has 1 value(s), one per axis"],
    );
    refused(&tile(&[2, -1]), &["'t'", "holds -1"]);
    accepted(&tile(&[2, 0]));
}

// ---------------------------------------------------------------------------------------------
// Slice, Split

fn slice(lists: &[(&str, &[i64])], x: &[i64]) -> ModelProto {
    let mut g = G::new(17).input("x", x);
    let mut inputs = vec!["x"];
    for (name, values) in lists {
        g = g.ints(name, values);
        inputs.push(name);
    }
    g.node("s", "Slice", &inputs, &["y"]).model()
}

#[test]
fn slice_lists_agree_in_length_steps_and_axes() {
    refused(
        &slice(&[("starts", &[0]), ("ends", &[1, 2])], &[3, 4]),
        &[
            "'s'",
            "input 2 'ends' [1, 2] has 2 value(s), but input 1 'starts' [0] has 1",
        ],
    );
    let full = |axes: &[i64], steps: &[i64]| {
        slice(
            &[("b", &[0, 0]), ("e", &[1, 1]), ("a", axes), ("st", steps)],
            &[3, 4],
        )
    };
    refused(
        &full(&[0, 1], &[1, 0]),
        &["'s'", "input 4 'st' [1, 0] holds a step of 0"],
    );
    refused(
        &full(&[0, -2], &[1, 1]),
        &["'s'", "input 3 'a' [0, -2] repeats axis -2"],
    );
    refused(&full(&[0, 2], &[1, 1]), &["'s'", "axis 2", "rank 2"]);
    accepted(&full(&[1, 0], &[1, -1]));
    refused(
        &slice(&[("b", &[0, 0, 0]), ("e", &[1, 1, 1])], &[3, 4]),
        &["'s'", "more than the 2 axes"],
    );
    // Opset 9: the lists are attributes.
    let v9 = G::new(9).input("x", &[3, 4]).node_with(
        "s",
        "Slice",
        &["x"],
        &["y"],
        vec![make_ints("starts", &[0]), make_ints("ends", &[1, 2])],
    );
    refused(
        &v9.model(),
        &["'s'", "attribute ends [1, 2] has 2 value(s)"],
    );
}

#[test]
fn split_sizes_sum_to_the_extent_cut() {
    let split13 = |sizes: &[i64], outputs: &[&str]| {
        G::new(13)
            .input("x", &[3, 4])
            .ints("sizes", sizes)
            .node_with(
                "sp",
                "Split",
                &["x", "sizes"],
                outputs,
                vec![make_int("axis", 1)],
            )
            .model()
    };
    assert_eq!(
        refusal(&split13(&[1, 2], &["a", "b"])).to_string(),
        "node 'sp' (Split): input 1 'sizes' [1, 2] sums to 3, but input 0 'x' has extent 4 on axis 1"
    );
    refused(
        &split13(&[1, 1, 2], &["a", "b"]),
        &["'sp'", "3 value(s)", "2 output(s)"],
    );
    refused(&split13(&[-1, 5], &["a", "b"]), &["'sp'", "holds -1"]);
    accepted(&split13(&[1, 3], &["a", "b"]));
    let split11 = G::new(11).input("x", &[3, 4]).node_with(
        "sp",
        "Split",
        &["x"],
        &["a", "b"],
        vec![make_int("axis", 1), make_ints("split", &[3, 3])],
    );
    refused(
        &split11.model(),
        &["'sp'", "attribute split [3, 3] sums to 6"],
    );
    let even = |opset, x: &[i64]| {
        G::new(opset)
            .input("x", x)
            .node("sp", "Split", &["x"], &["a", "b"])
            .model()
    };
    refused(&even(13, &[5]), &["'sp'", "extent of 5", "2 outputs"]);
    accepted(&even(13, &[6]));
    // From opset 18 exactly one of the sizes and num_outputs.
    refused(
        &even(18, &[6]),
        &["'sp'", "attribute num_outputs is missing"],
    );
    let both = G::new(18)
        .input("x", &[6])
        .ints("sizes", &[3, 3])
        .node_with(
            "sp",
            "Split",
            &["x", "sizes"],
            &["a", "b"],
            vec![make_int("num_outputs", 2)],
        );
    refused(
        &both.model(),
        &["'sp'", "attribute num_outputs 2 is given together"],
    );
}

// ---------------------------------------------------------------------------------------------
// MatMul, Gemm, broadcasting

#[test]
fn matrix_products_and_broadcasts_agree_on_stated_extents() {
    let mm = |a: &[i64], b: &[i64]| {
        G::new(17)
            .input("a", a)
            .input("b", b)
            .node("mm", "MatMul", &["a", "b"], &["y"])
            .model()
    };
    refused(
        &mm(&[3, 4], &[5, 6]),
        &["'mm'", "input 1 'b' of shape [5, 6]", "contracted"],
    );
    refused(&mm(&[2, 3, 4], &[3, 4, 6]), &["'mm'", "batch"]);
    refused(&mm(&[], &[4]), &["'mm'", "input 0 'a' has rank 0"]);
    accepted(&mm(&[2, 1, 3, 4], &[5, 4, 6]));
    accepted(&mm(&[4], &[4, 6]));
    accepted(&mm(&[-1, 4], &[-1, 6]));
    let gemm = |b: &[i64], trans_b| {
        G::new(17)
            .input("a", &[2, 3])
            .input("b", b)
            .node_with(
                "g",
                "Gemm",
                &["a", "b"],
                &["y"],
                vec![make_int("transB", trans_b)],
            )
            .model()
    };
    refused(
        &gemm(&[3, 4, 1], 0),
        &["'g'", "input 1 'b' has rank 3, expected 2"],
    );
    refused(
        &gemm(&[3, 4], 1),
        &["'g'", "transB=1", "contracted extents 4 and 3"],
    );
    accepted(&gemm(&[4, 3], 1));
    let add = |b: &[i64]| {
        G::new(17)
            .input("a", &[3, 4])
            .input("b", b)
            .node("add", "Add", &["a", "b"], &["y"])
            .model()
    };
    refused(
        &add(&[5]),
        &["'add'", "input 1 'b' of shape [5] does not broadcast"],
    );
    accepted(&add(&[1, 4]));
    accepted(&add(&[-1]));
}

// ---------------------------------------------------------------------------------------------
// Constant indices

#[test]
fn constant_indices_lie_inside_the_extent_they_index() {
    let gather = |op: &str, indices: &[i64], dims: &[i64]| {
        G::new(17)
            .input("x", &[3, 4])
            .ints_dims("i", dims, indices)
            .node_with("g", op, &["x", "i"], &["y"], vec![make_int("axis", 1)])
            .model()
    };
    assert_eq!(
        refusal(&gather("Gather", &[0, 7], &[2])).to_string(),
        "node 'g' (Gather): input 1 'i' [0, 7] holds index 7, outside [-4, 4) of axis 1 of input 0 'x'"
    );
    accepted(&gather("Gather", &[0, -4, 3], &[3]));
    refused(
        &gather("GatherElements", &[0, 9], &[1, 2]),
        &["'g'", "index 9"],
    );
    let gather_axis = G::new(17).input("x", &[3, 4]).ints("i", &[0]).node_with(
        "g",
        "Gather",
        &["x", "i"],
        &["y"],
        vec![make_int("axis", 2)],
    );
    refused(
        &gather_axis.model(),
        &["'g'", "attribute axis 2 is outside"],
    );
    let scatter = G::new(17)
        .input("x", &[3, 4])
        .input("u", &[1, 2])
        .ints_dims("i", &[1, 2], &[0, -5])
        .node("s", "ScatterElements", &["x", "i", "u"], &["y"]);
    refused(&scatter.model(), &["'s'", "index -5", "axis 0"]);
    let nd = |op: &str, dims: &[i64], indices: &[i64]| {
        let inputs: &[&str] = if op == "ScatterND" {
            &["x", "i", "u"]
        } else {
            &["x", "i"]
        };
        G::new(17)
            .input("x", &[3, 4])
            .input("u", &[1])
            .ints_dims("i", dims, indices)
            .node("nd", op, inputs, &["y"])
            .model()
    };
    refused(
        &nd("GatherND", &[1, 3], &[0, 0, 0]),
        &["'nd'", "tuples of 3"],
    );
    refused(
        &nd("ScatterND", &[1, 2], &[0, 9]),
        &["'nd'", "index 9", "axis 1"],
    );
    accepted(&nd("GatherND", &[1, 2], &[2, 3]));
}

// ---------------------------------------------------------------------------------------------
// Where the facts come from

#[test]
fn facts_come_from_value_info_constants_and_enclosing_graphs() {
    // The rank of a node's output, from value_info.
    let via_value_info = G::new(17)
        .input("x", &[2, 3])
        .value_info("n", &[2, 3])
        .node("neg", "Neg", &["x"], &["n"])
        .node_with(
            "t",
            "Transpose",
            &["n"],
            &["y"],
            vec![make_ints("perm", &[0, 1, 2])],
        );
    refused(
        &via_value_info.model(),
        &["'t'", "but input 0 'n' has rank 2"],
    );
    // A Reshape target from a Constant node.
    let target = tensor::from_i64("", &[2], &[5, 5]);
    let via_constant = G::new(17)
        .input("x", &[2, 3])
        .node_with(
            "k",
            "Constant",
            &[],
            &["shape"],
            vec![make_tensor("value", target)],
        )
        .node("r", "Reshape", &["x", "shape"], &["y"]);
    refused(
        &via_constant.model(),
        &["'r'", "input 1 'shape' [5, 5]", "25 elements"],
    );
    // An initializer a graph input may override is not a constant.
    let mut overridable = reshape(&[2, 3], &[5, 5], None);
    let g = overridable.graph.as_mut().unwrap();
    g.input.push(shaped("shape", Some(&[2])));
    accepted(&overridable);
}

fn if_model(branch: GraphProto, outer: G) -> ModelProto {
    let other = G::new(17).node("id", "Identity", &["x"], &["z2"]).graph();
    let mut m = outer
        .node_with(
            "cond",
            "If",
            &["c"],
            &["z"],
            vec![
                AttributeProto {
                    name: "then_branch".into(),
                    r#type: 5,
                    g: Some(branch),
                    ..Default::default()
                },
                AttributeProto {
                    name: "else_branch".into(),
                    r#type: 5,
                    g: Some(other),
                    ..Default::default()
                },
            ],
        )
        .model();
    m.graph.as_mut().unwrap().input.push(ValueInfoProto {
        name: "c".into(),
        ..Default::default()
    });
    m
}

#[test]
fn subgraphs_are_checked_with_the_enclosing_facts() {
    let bad_branch = G::new(17)
        .node_with(
            "inner_t",
            "Transpose",
            &["x"],
            &["z1"],
            vec![make_ints("perm", &[1, 1])],
        )
        .graph();
    let m = if_model(bad_branch, G::new(17).input("x", &[2, 3]));
    refused(&m, &["'inner_t'", "repeats axis 1"]);
    // The branch reads the outer initializer as its Reshape target.
    let reads_outer = G::new(17)
        .node("inner_r", "Reshape", &["x", "shape"], &["z1"])
        .graph();
    let m = if_model(
        reads_outer,
        G::new(17).input("x", &[2, 3]).ints("shape", &[4, 2]),
    );
    refused(&m, &["'inner_r'", "8 elements", "has 6"]);
    // The same branch with an outer target that fits.
    let fine = G::new(17)
        .node("inner_r", "Reshape", &["x", "shape"], &["z1"])
        .graph();
    let m = if_model(fine, G::new(17).input("x", &[2, 3]).ints("shape", &[3, 2]));
    accepted(&m);
}

#[test]
fn a_subgraph_input_hides_the_outer_tensor_of_the_same_name() {
    // Scan hands its body one row of x at a time: the body's x has rank 1, whatever the
    // outer x of rank 2 says. Nothing is stated about the body's x, so nothing is checked.
    let body = |perm: &[i64]| {
        let mut g = G::new(17)
            .node_with(
                "inner_t",
                "Transpose",
                &["x"],
                &["t"],
                vec![make_ints("perm", perm)],
            )
            .graph();
        g.input = vec![ValueInfoProto {
            name: "x".into(),
            ..Default::default()
        }];
        g
    };
    let scan = |perm: &[i64]| {
        G::new(17)
            .input("x", &[2, 3])
            .node_with(
                "scan",
                "Scan",
                &["x"],
                &["ys"],
                vec![
                    make_int("num_scan_inputs", 1),
                    AttributeProto {
                        name: "body".into(),
                        r#type: 5,
                        g: Some(body(perm)),
                        ..Default::default()
                    },
                ],
            )
            .model()
    };
    accepted(&scan(&[0]));
    refused(&scan(&[0, 0]), &["'inner_t'", "repeats axis 0"]);
}

// ---------------------------------------------------------------------------------------------
// Through loading, and over the shipped models

#[test]
fn loading_refuses_an_invalid_model_naming_file_node_and_attribute() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("perm.onnx");
    std::fs::write(&path, transpose(&[0, 1, 1, 3]).encode_to_vec()).unwrap();
    let err = format!("{:#}", load_model(&path, &Limits::default()).unwrap_err());
    assert!(
        err.ends_with(
            "perm.onnx: node 't' (Transpose): attribute perm [0, 1, 1, 3] repeats axis 1"
        ),
        "{err}"
    );
    let bytes = transpose(&[2, 2, 1, 0]).encode_to_vec();
    let err = load_model_from_bytes(&bytes, "<bytes>", dir.path(), &Limits::default()).unwrap_err();
    let line = format!("{err:#}");
    assert!(
        line.starts_with("<bytes>: node 't'") && line.contains("perm"),
        "{line}"
    );
    assert!(err.downcast_ref::<ValidationError>().is_some(), "{line}");
}

#[test]
fn every_shipped_model_passes_and_a_repeated_perm_in_one_is_refused() {
    for path in shipped_models() {
        // load_model validates; the check is repeated here to name the failing rule.
        let model = load_model(&path, &Limits::default())
            .unwrap_or_else(|e| panic!("{e:#}"))
            .model;
        attnrt_onnx::op_check::check_model(&model)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    // The fuzzer's finding on a real export: one Transpose's perm repeats an axis.
    let path = models_dir().join("bert_eager.ts.onnx");
    let mut model = load_model(&path, &Limits::default()).unwrap().model;
    let g = model.graph.as_mut().unwrap();
    let t = g
        .node
        .iter_mut()
        .find(|n| n.op_type == "Transpose")
        .expect("BERT has Transposes");
    let perm = t.attribute.iter_mut().find(|a| a.name == "perm").unwrap();
    perm.ints = vec![0, 1, 1, 3];
    let name = t.name.clone();
    let line = refusal(&model).to_string();
    assert_eq!(
        line,
        format!("node '{name}' (Transpose): attribute perm [0, 1, 1, 3] repeats axis 1")
    );
}
