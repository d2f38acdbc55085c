//! Nodes that pass their first input through unchanged at inference: `Identity`, `Dropout` in
//! inference mode, and `Cast` to the type its input already has.
//!
//! One definition serves the fusion rules (which look through such nodes inside an attention
//! block) and the runtime (which keeps them away from the execution engine). Each answer is
//! either the kind of pass-through or the reason the node is not one, so that `--explain` can
//! say why a block with such a node inside was not fused.

use crate::proto::NodeProto;
use crate::{attr, node_label, opset};

/// How a node passes its first input through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passthrough {
    /// `Identity`.
    Identity,
    /// `Dropout` whose `training_mode` is absent or a constant false (ONNX Dropout-12+), or any
    /// `Dropout` before opset 12 (inference semantics only). Its optional second output, the
    /// mask, is not produced by the pass-through: callers must check it is unused.
    Dropout,
    /// `Cast` whose `to` equals the input's element type.
    SameTypeCast,
}

/// What the caller knows about the graph around a node.
pub trait PassthroughFacts {
    /// The element type (`DataType` number) of a tensor, when known.
    fn elem_type(&self, tensor: &str) -> Option<i32>;
    /// The value of a tensor that is a constant boolean scalar (an initializer or a `Constant`
    /// node), `None` when it is not known before run time.
    fn constant_bool(&self, tensor: &str) -> Option<bool>;
}

/// Classifies `node` (of a model whose default-domain opset is `opset_version`): `Ok` with the
/// kind of pass-through, or `Err` with why it is not one (`None` for op types that never are).
pub fn classify(
    node: &NodeProto,
    opset_version: i64,
    facts: &impl PassthroughFacts,
) -> Result<Passthrough, Option<String>> {
    if !opset::is_default_domain(&node.domain) || node.input.first().is_none_or(String::is_empty) {
        return Err(None);
    }
    match node.op_type.as_str() {
        "Identity" => Ok(Passthrough::Identity),
        "Dropout" => dropout(node, opset_version, facts).map_err(Some),
        "Cast" => same_type_cast(node, facts).map_err(Some),
        _ => Err(None),
    }
}

/// Whether the node's outputs beyond the first (Dropout's mask) are absent or named `""`.
pub fn only_first_output(node: &NodeProto) -> bool {
    node.output.iter().skip(1).all(String::is_empty)
}

fn dropout(
    node: &NodeProto,
    opset_version: i64,
    facts: &impl PassthroughFacts,
) -> Result<Passthrough, String> {
    // Dropout-1 and -6 have `is_test`; without it (default 0) they run in training mode.
    if opset_version < 7 && attr::int(node, "is_test").ok().flatten() != Some(1) {
        return Err(format!(
            "{}: Dropout before opset 7 without is_test=1 runs in training mode",
            node_label(node)
        ));
    }
    // Dropout-12+: `training_mode` is the optional third input, default false.
    match node.input.get(2).filter(|t| !t.is_empty()) {
        None => Ok(Passthrough::Dropout),
        Some(t) => match facts.constant_bool(t) {
            Some(false) => Ok(Passthrough::Dropout),
            Some(true) => Err(format!(
                "{}: Dropout with training_mode = true drops values at random",
                node_label(node)
            )),
            None => Err(format!(
                "{}: Dropout's training_mode '{t}' is not a constant known before run time",
                node_label(node)
            )),
        },
    }
}

fn same_type_cast(node: &NodeProto, facts: &impl PassthroughFacts) -> Result<Passthrough, String> {
    let to = match attr::int(node, "to") {
        Ok(Some(to)) => to,
        Ok(None) => return Err(format!("{}: Cast without 'to'", node_label(node))),
        Err(e) => return Err(e.to_string()),
    };
    let from = facts
        .elem_type(&node.input[0])
        .ok_or_else(|| format!("{}: the Cast's input type is unknown", node_label(node)))?;
    if i64::from(from) != to {
        return Err(format!(
            "{}: casts {} to {}",
            node_label(node),
            crate::tensor::type_name(from),
            i32::try_from(to).map_or_else(|_| format!("type {to}"), crate::tensor::type_name)
        ));
    }
    Ok(Passthrough::SameTypeCast)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tensor_proto::DataType;

    struct Facts;
    impl PassthroughFacts for Facts {
        fn elem_type(&self, tensor: &str) -> Option<i32> {
            (tensor == "x").then_some(DataType::Float as i32)
        }
        fn constant_bool(&self, tensor: &str) -> Option<bool> {
            match tensor {
                "off" => Some(false),
                "on" => Some(true),
                _ => None,
            }
        }
    }

    fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
        NodeProto {
            name: format!("n_{op}"),
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn identity_and_inference_dropout_pass_through() {
        let id = node("Identity", &["x"], &["y"]);
        assert_eq!(classify(&id, 17, &Facts), Ok(Passthrough::Identity));
        let d = node("Dropout", &["x"], &["y"]);
        assert_eq!(classify(&d, 17, &Facts), Ok(Passthrough::Dropout));
        let d = node("Dropout", &["x", "", "off"], &["y"]);
        assert_eq!(classify(&d, 17, &Facts), Ok(Passthrough::Dropout));
        let d = node("Dropout", &["x", "r", "off"], &["y", "mask"]);
        assert_eq!(classify(&d, 17, &Facts), Ok(Passthrough::Dropout));
        assert!(!only_first_output(&d));
    }

    #[test]
    fn training_or_unknown_dropout_is_refused_with_a_reason() {
        let on = node("Dropout", &["x", "", "on"], &["y"]);
        let e = classify(&on, 17, &Facts).unwrap_err().unwrap();
        assert!(e.contains("training_mode = true"), "{e}");
        let unknown = node("Dropout", &["x", "", "flag"], &["y"]);
        let e = classify(&unknown, 17, &Facts).unwrap_err().unwrap();
        assert!(e.contains("not a constant"), "{e}");
        let old = node("Dropout", &["x"], &["y"]);
        assert!(classify(&old, 6, &Facts).is_err());
    }

    #[test]
    fn casts_pass_through_only_to_the_same_type() {
        let mut c = node("Cast", &["x"], &["y"]);
        c.attribute
            .push(attr::make_int("to", DataType::Float as i64));
        assert_eq!(classify(&c, 17, &Facts), Ok(Passthrough::SameTypeCast));
        c.attribute[0] = attr::make_int("to", DataType::Float16 as i64);
        let e = classify(&c, 17, &Facts).unwrap_err().unwrap();
        assert!(e.contains("float16"), "{e}");
        let unknown = node("Cast", &["z"], &["y"]);
        assert!(classify(&unknown, 17, &Facts).is_err());
        assert_eq!(
            classify(&node("Relu", &["x"], &["y"]), 17, &Facts),
            Err(None)
        );
    }
}
