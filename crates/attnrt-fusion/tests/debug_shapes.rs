//! Development aid (ignored by default): prints the inferred shape/value of every tensor of the
//! model named by ATTNRT_MODEL. `cargo test -p attnrt-fusion --test debug_shapes -- --ignored --nocapture`
use attnrt_fusion::graph::{shape_str, GraphView};

#[test]
#[ignore]
fn print_inferred_shapes() {
    let Ok(path) = std::env::var("ATTNRT_MODEL") else {
        return;
    };
    let m = attnrt_onnx::load_model(std::path::Path::new(&path), &Default::default())
        .unwrap()
        .model;
    let g = m.graph.as_ref().unwrap();
    let order = attnrt_onnx::validate::topo_order(g).unwrap();
    let opset = attnrt_onnx::opset::default_version(&m).unwrap_or(1);
    let view = GraphView::new(g, &order, opset);
    for &i in &order {
        let n = &g.node[i];
        for o in &n.output {
            println!(
                "{:12} {:40} {} {:?}",
                n.op_type,
                o,
                view.shape(o).map(shape_str).unwrap_or("?".into()),
                view.value(o).filter(|_| n.op_type != "Constant")
            );
        }
    }
}
