//! What the session changes in the graph tract reads, before tract sees it. Each rewrite keeps
//! every graph input and output (names, types, values up to the rounding stated per rewrite);
//! the model attnrt saves is never changed: this is an execution-time view only.
//!
//! - [`identity`]: nodes that are the identity at inference never reach tract.
//! - [`pow`]: `Pow` by a constant 2, 3 or 4 runs as multiplications.
//! - [`types`]: element types known before run time, which the rewrites need to be exact.

mod identity;
mod pow;
mod types;

use std::collections::HashMap;

use attnrt_onnx::proto::{type_proto, GraphProto};

pub(crate) use identity::{plan_identity_removal, remove_identities};
pub(crate) use pow::{plan_pow_rewrite, rewrite_pows, PowRewrite};

/// Element types the graph declares: inputs, `value_info`, outputs and initializers.
fn declared_types(g: &GraphProto) -> HashMap<&str, i32> {
    let mut types = HashMap::new();
    for v in g.input.iter().chain(&g.value_info).chain(&g.output) {
        if let Some(type_proto::Value::TensorType(t)) =
            v.r#type.as_ref().and_then(|t| t.value.as_ref())
        {
            if t.elem_type != 0 {
                types.insert(v.name.as_str(), t.elem_type);
            }
        }
    }
    for t in &g.initializer {
        types.insert(t.name.as_str(), t.data_type);
    }
    types
}
