//! `Gelu` (both forms) runs on attnrt's op split over threads (`Backend::Attnrt`) and gives
//! tract's values bit for bit, whatever the split.

use attnrt_onnx::attr::make_string;
use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{Backend, NamedTensor, Session, Tensor, Threads};
use attnrt_testkit::{model, node_with_attrs, seeded_values, value_info, GraphBuilder};

fn gelu_model(dims: &[i64], approximate: &str) -> ModelProto {
    let mut g = GraphBuilder::new("gelu");
    g.input(value_info("x", DataType::Float, dims));
    g.node(node_with_attrs(
        "/mlp/act/Gelu",
        "Gelu",
        &["x"],
        &["y"],
        vec![make_string("approximate", approximate)],
    ));
    g.output(value_info("y", DataType::Float, dims));
    model(g.finish(), 20)
}

fn session(
    m: &ModelProto,
    x: &NamedTensor,
    backend: Backend,
    threads: usize,
) -> anyhow::Result<Session> {
    let threads = Threads::new(Some(threads))?;
    Session::build_with(m, std::slice::from_ref(x), &threads, "gelu.onnx", backend)
}

#[test]
fn both_forms_give_tracts_values_on_one_and_two_threads() {
    for dims in [[1usize, 3, 5], [2, 200, 384]] {
        let n = dims.iter().product();
        // wide enough to reach both tails of erf and tanh
        let values: Vec<f32> = seeded_values(n, 3).iter().map(|v| 8.0 * v).collect();
        let x = NamedTensor {
            name: "x".into(),
            tensor: Tensor::from_shape(&dims, &values).unwrap(),
        };
        let dims_i64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        for approximate in ["none", "tanh"] {
            let m = gelu_model(&dims_i64, approximate);
            let tract = session(&m, &x, Backend::Tract, 2).unwrap();
            let want = tract.run(std::slice::from_ref(&x)).unwrap();
            let want = want[0].tensor.to_plain_array_view::<f32>().unwrap();
            for threads in [1, 2] {
                let s = session(&m, &x, Backend::Attnrt, threads).unwrap();
                assert!(
                    s.op_names().iter().any(|o| o == "AttnrtGelu"),
                    "{:?}",
                    s.op_names()
                );
                let got = s.run(std::slice::from_ref(&x)).unwrap();
                let got = got[0].tensor.to_plain_array_view::<f32>().unwrap();
                assert_eq!(got.shape(), want.shape());
                for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{approximate} {dims:?} threads {threads}: y[{i}] = {g}, tract {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn an_unknown_approximation_names_the_node() {
    let m = gelu_model(&[4], "erf");
    let x = NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&[4], &[0.0f32, 1.0, 2.0, 3.0]).unwrap(),
    };
    let err = format!(
        "{:#}",
        session(&m, &x, Backend::Attnrt, 1).expect_err("an error")
    );
    assert!(err.contains("/mlp/act/Gelu"), "{err}");
    assert!(err.contains("approximate"), "{err}");
}
