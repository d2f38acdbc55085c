//! A run that fails inside a node names the node: an index out of range (what a decoder given
//! more positions than its table holds runs into) is an error, not a panic, and says where.

use attnrt_onnx::DataType;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{float_value, node, tensor_f32, value_info, GraphBuilder};

/// A position table of 4 rows of 2: row i holds 2i and 2i + 1.
fn table() -> attnrt_onnx::proto::TensorProto {
    tensor_f32("table", &[4, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
}

/// `y = Gather(table[4, 2], ids)`: a position-embedding lookup.
fn lookup_session() -> Session {
    let mut g = GraphBuilder::new("lookup");
    g.input(value_info("ids", DataType::Int64, &[1i64]));
    g.initializer(table());
    g.node(node("/wpe/Gather", "Gather", &["table", "ids"], &["y"]));
    g.output(float_value("y", &[1, 2]));
    let model = g.into_model(17);
    let threads = Threads::new(Some(1)).unwrap();
    Session::new(&model, &threads, "lookup.onnx", &SessionOptions::default()).unwrap()
}

fn ids(i: i64) -> NamedTensor {
    NamedTensor {
        name: "ids".into(),
        tensor: Tensor::from_shape(&[1], &[i]).unwrap(),
    }
}

/// The values of the first output, a float32 tensor.
fn first_f32(outputs: &[NamedTensor]) -> Vec<f32> {
    let plain = outputs[0].tensor.try_as_plain_ram().unwrap();
    plain.as_slice::<f32>().unwrap().to_vec()
}

#[test]
fn an_index_past_the_table_names_the_node() {
    let s = lookup_session();
    let y = s.run(&[ids(3)]).unwrap();
    let got = first_f32(&y);
    assert_eq!(got, [6.0, 7.0]);
    for (bad, range) in [
        (9, "index 9 is outside [-4, 4)"),
        (4, "index 4"),
        (-5, "index -5"),
    ] {
        let err = format!("{:#}", s.run(&[ids(bad)]).unwrap_err());
        assert!(err.contains("/wpe/Gather"), "{err}");
        assert!(err.contains("lookup.onnx"), "{err}");
        // checked before tract indexes (tract's Gather has no bounds check and panicked)
        assert!(err.contains(range) && !err.contains("panic"), "{err}");
    }
    // the last row from the end is in range
    let y = s.run(&[ids(-1)]).unwrap();
    let got = first_f32(&y);
    assert_eq!(got, [6.0, 7.0]);
}

/// A constant index is checked once, while the graph is optimized, and the node then runs as
/// tract's own `Gather`.
#[test]
fn a_constant_index_past_the_table_fails_the_build_naming_the_node() {
    use attnrt_testkit::tensor_i64;
    for (index, ok) in [(3i64, true), (-4, true), (4, false)] {
        let mut g = GraphBuilder::new("lookup");
        g.input(float_value("x", &[1, 2]));
        g.initializer(table());
        g.initializer(tensor_i64("ids", &[1], &[index]));
        g.node(node("/wpe/Gather", "Gather", &["table", "ids"], &["row"]));
        g.node(node("/add", "Add", &["row", "x"], &["y"]));
        g.output(float_value("y", &[1, 2]));
        let model = g.into_model(17);
        let threads = Threads::new(Some(1)).unwrap();
        let built = Session::new(&model, &threads, "lookup.onnx", &SessionOptions::default());
        match (built, ok) {
            (Ok(s), true) => {
                let x = NamedTensor {
                    name: "x".into(),
                    tensor: Tensor::from_shape(&[1, 2], &[0.0f32, 0.0]).unwrap(),
                };
                let y = s.run(&[x]).unwrap();
                let got = first_f32(&y);
                let row = index.rem_euclid(4) as f32;
                assert_eq!(got, [2.0 * row, 2.0 * row + 1.0], "index {index}");
            }
            (Err(e), false) => {
                let err = format!("{e:#}");
                assert!(
                    err.contains("/wpe/Gather") && !err.contains("panic"),
                    "{err}"
                );
            }
            (built, _) => panic!("index {index}: built = {:?}", built.err()),
        }
    }
}

/// `GatherElements` indexes without a bounds check in tract too (seed 43 case 29, a Concat
/// turned into GatherElements over an empty cache, panicked): its indices are checked the same
/// way, and good ones give ONNX's values.
#[test]
fn a_gather_elements_index_out_of_range_names_the_node() {
    let mut g = GraphBuilder::new("elements");
    g.initializer(tensor_f32("data", &[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
    g.input(value_info("idx", DataType::Int64, &[2i64, 2]));
    let mut n = node("/ge", "GatherElements", &["data", "idx"], &["y"]);
    n.attribute.push(attnrt_onnx::attr::make_int("axis", 1));
    g.node(n);
    g.output(float_value("y", &[2, 2]));
    let threads = Threads::new(Some(1)).unwrap();
    let s = Session::new(
        &g.into_model(17),
        &threads,
        "ge.onnx",
        &SessionOptions::default(),
    )
    .unwrap();
    let feed = |v: [i64; 4]| NamedTensor {
        name: "idx".into(),
        tensor: Tensor::from_shape(&[2, 2], &v).unwrap(),
    };
    let y = s.run(&[feed([2, 0, -1, 1])]).unwrap();
    assert_eq!(first_f32(&y), [2.0, 0.0, 5.0, 4.0]);
    let err = format!("{:#}", s.run(&[feed([0, 3, 0, 0])]).unwrap_err());
    assert!(err.contains("GatherElements node '/ge'"), "{err}");
    assert!(
        err.contains("index 3 is outside [-3, 3)") && !err.contains("panic"),
        "{err}"
    );
}
