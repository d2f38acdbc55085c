//! What the session changes in the graph tract reads, before tract sees it: the graph rewrites,
//! in one ordered list ([`PASSES`]). Each keeps every graph input and output (names, types,
//! values up to the rounding stated per rewrite); the model attnrt saves is never changed: this
//! is an execution-time view only.
//!
//! - [`shapes`]: the declared shapes of outputs and intermediates are dropped (tract infers
//!   them from the inputs).
//! - [`identity`]: nodes that are the identity at inference never reach tract.
//! - [`pow`]: `Pow` by a constant 2, 3 or 4 runs as multiplications.
//! - [`pad`]: `Pad`'s `constant_value` is made a scalar, as tract reads it.
//! - [`quant`]: each projection of a dynamically quantized model (`DynamicQuantizeLinear →
//!   MatMulInteger → Cast → Mul`, bias `Add`) becomes one `DynamicQuantizeMatMul` node, which
//!   runs on attnrt's integer kernels.
//! - [`half`]: a float16/bfloat16 graph's arithmetic runs in float32 (its inputs and outputs
//!   keep their types), so the float32 kernels apply.
//! - [`types`]: element types known before run time, which the rewrites need to be exact.
//!
//! The execution ops attnrt registers in tract's parser are listed in `registry.rs`.

mod half;
mod identity;
mod pad;
mod pow;
mod qdq;
mod quant;
mod shapes;
mod types;

use std::collections::HashMap;

use anyhow::Result;
use attnrt_onnx::proto::{type_proto, GraphProto, ModelProto};
use prost::Message;

use crate::options::{SessionOptions, Switch};
use crate::weights::HeldWeight;

pub use half::{half_as_float_report, HalfAsFloat};

/// One rewrite of the graph tract reads.
pub(crate) struct Pass {
    /// What it is called (in the docs; the tests check that no two passes share a name).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) name: &'static str,
    /// When it runs.
    pub(crate) switch: Switch,
    /// The rewrite of `g`, tract's copy of `model`'s graph as the passes before it left it.
    /// It reads its facts (declared types, constants, the opset) from `model`, which keeps
    /// everything the file declares.
    pub(crate) run: fn(model: &ModelProto, g: &mut tract_onnx::pb::GraphProto),
}

/// Every rewrite, in the order they run. `remove-identities` matches tract's copy to `model`
/// node for node, so no pass before it adds or removes nodes; `pow-as-mul` finds its nodes by
/// output name, which `remove-identities` keeps. `half-as-float` runs last, so it widens every
/// half-precision tensor the passes before it made or kept.
pub(crate) static PASSES: &[Pass] = &[
    Pass {
        name: "forget-declared-shapes",
        switch: Switch::Always,
        run: shapes::forget_declared_shapes,
    },
    Pass {
        name: "remove-identities",
        switch: Switch::Always,
        run: identity::remove_identities,
    },
    Pass {
        name: "pow-as-mul",
        switch: Switch::PowAsMul,
        run: pow::pow_as_mul,
    },
    Pass {
        name: "scalar-pad-values",
        switch: Switch::Always,
        run: pad::scalar_pad_values,
    },
    Pass {
        name: "dynamic-quantize-matmul",
        switch: Switch::AttnrtOps,
        run: quant::dynamic_quantize_matmul,
    },
    Pass {
        name: "qdq-matmul",
        switch: Switch::AttnrtOps,
        run: qdq::qdq_matmul,
    },
    Pass {
        name: "half-as-float",
        switch: Switch::HalfAsFloat,
        run: half::half_as_float,
    },
];

/// `model` as tract's protobuf types, rewritten by every pass of [`PASSES`] that `options`
/// switch on, in order; its large initializers are not in it but returned apart, their bytes
/// shared with `model` (declared as graph inputs, for `weights::place` after parsing).
pub(crate) fn tract_proto(
    model: &ModelProto,
    options: &SessionOptions,
) -> Result<(tract_onnx::pb::ModelProto, Vec<HeldWeight>)> {
    // A clone shares the tensors' bytes; the held ones are not encoded at all.
    let mut light = model.clone();
    let held = crate::weights::hold_large(&mut light);
    let bytes = light.encode_to_vec();
    drop(light);
    let mut proto = tract_onnx::pb::ModelProto::decode(bytes.as_slice())?;
    drop(bytes);
    if let Some(g) = proto.graph.as_mut() {
        // Declared first, so the passes see every name the graph uses.
        crate::weights::declare(g, &held);
        for pass in PASSES.iter().filter(|p| p.switch.is_on(options)) {
            (pass.run)(model, g);
        }
    }
    Ok((proto, held))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_onnx::DataType;
    use attnrt_testkit::{node, tensor_f32, value_info, GraphBuilder};

    #[test]
    fn every_pass_is_named_once() {
        let mut names = std::collections::HashSet::new();
        for p in PASSES {
            assert!(names.insert(p.name), "{} is listed twice", p.name);
        }
    }

    /// `y = Pow(Identity(x), 3)`, x and y float32 with declared shapes.
    fn cube() -> ModelProto {
        let mut g = GraphBuilder::new("g");
        g.input(value_info("x", DataType::Float, &["4"]));
        g.initializer(tensor_f32("e", &[], &[3.0]));
        g.node(node("id", "Identity", &["x"], &["t"]));
        g.node(node("pow", "Pow", &["t", "e"], &["y"]));
        g.output(value_info("y", DataType::Float, &["4"]));
        g.into_model(17)
    }

    fn op_types(options: &SessionOptions) -> Vec<String> {
        let (proto, _) = tract_proto(&cube(), options).unwrap();
        proto
            .graph
            .unwrap()
            .node
            .into_iter()
            .map(|n| n.op_type)
            .collect()
    }

    #[test]
    fn the_passes_run_as_their_switches_say() {
        assert_eq!(op_types(&SessionOptions::default()), ["Mul", "Mul"]);
        let no_pow = SessionOptions {
            pow_as_mul: false,
            ..SessionOptions::default()
        };
        assert_eq!(op_types(&no_pow), ["Pow"]);
        let (proto, _) = tract_proto(&cube(), &no_pow).unwrap();
        let y = &proto.graph.unwrap().output[0];
        let Some(tract_onnx::pb::type_proto::Value::TensorType(t)) =
            y.r#type.as_ref().and_then(|t| t.value.as_ref())
        else {
            panic!("y has no tensor type")
        };
        assert!(t.shape.is_none(), "the declared shape of y is dropped");
        assert_eq!(t.elem_type, DataType::Float as i32);
    }
}
