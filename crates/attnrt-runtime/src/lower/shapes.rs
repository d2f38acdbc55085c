//! The shapes the file declares for outputs and intermediate values are dropped (`value_info`
//! cleared, output shapes removed), element types kept. The inputs' real shapes are set from
//! the given tensors, and tract infers every other shape from them; declared symbolic dims
//! (`batch`, `sequence`) would otherwise have to unify with the concrete ones, which tract
//! refuses ("Impossible to unify Sym(batch) with Val(2)"), and exporters sometimes declare wrong
//! output shapes (ViT). Subgraphs too.

use attnrt_onnx::proto::ModelProto;
use tract_onnx::pb::{type_proto, GraphProto};

/// The pass: drops the declared shapes of `g` (tract's copy of `_model`'s graph).
pub(super) fn forget_declared_shapes(_model: &ModelProto, g: &mut GraphProto) {
    forget(g);
}

fn forget(g: &mut GraphProto) {
    g.value_info.clear();
    for o in &mut g.output {
        if let Some(type_proto::Value::TensorType(t)) =
            o.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            t.shape = None;
        }
    }
    for n in &mut g.node {
        for a in &mut n.attribute {
            for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                forget(sub);
            }
        }
    }
}
