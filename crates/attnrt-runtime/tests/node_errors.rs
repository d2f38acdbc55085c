//! A run that fails inside a node names the node: an index out of range (what a decoder given
//! more positions than its table holds runs into) is an error, not a panic, and says where.

use attnrt_onnx::DataType;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{float_value, node, tensor_f32, value_info, GraphBuilder};

/// `y = Gather(table[4, 2], ids)`: a position-embedding lookup.
fn lookup_session() -> Session {
    let mut g = GraphBuilder::new("lookup");
    g.input(value_info("ids", DataType::Int64, &[1i64]));
    g.initializer(tensor_f32(
        "table",
        &[4, 2],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
    ));
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

#[test]
fn an_index_past_the_table_names_the_node() {
    let s = lookup_session();
    let y = s.run(&[ids(3)]).unwrap();
    let got = y[0]
        .tensor
        .try_as_plain_ram()
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
        .to_vec();
    assert_eq!(got, [6.0, 7.0]);
    let err = format!("{:#}", s.run(&[ids(9)]).unwrap_err());
    assert!(err.contains("/wpe/Gather"), "{err}");
    assert!(err.contains("lookup.onnx"), "{err}");
}
