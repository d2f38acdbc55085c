//! Typed access to node attributes, with errors that name the node and attribute.

use anyhow::{bail, Result};

use crate::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto, TensorProto};

/// The attribute `name` of `node`, if present.
pub fn find<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

fn expect<'a>(
    node: &'a NodeProto,
    name: &str,
    ty: AttributeType,
) -> Result<Option<&'a AttributeProto>> {
    match find(node, name) {
        None => Ok(None),
        Some(a) if a.r#type == ty as i32 => Ok(Some(a)),
        // Old exporters sometimes leave `type` unset; accept the attribute when the field for
        // the expected type is the one filled in.
        Some(a) if a.r#type == AttributeType::Undefined as i32 && holds(a, ty) => Ok(Some(a)),
        Some(a) => bail!(
            "node {}: attribute '{name}' is {:?}, expected {:?}",
            crate::node_label(node),
            AttributeType::try_from(a.r#type).unwrap_or(AttributeType::Undefined),
            ty
        ),
    }
}

fn holds(a: &AttributeProto, ty: AttributeType) -> bool {
    match ty {
        AttributeType::Ints => !a.ints.is_empty(),
        AttributeType::Floats => !a.floats.is_empty(),
        AttributeType::Tensor => a.t.is_some(),
        AttributeType::String => !a.s.is_empty(),
        _ => false,
    }
}

/// An `INT` attribute.
pub fn int(node: &NodeProto, name: &str) -> Result<Option<i64>> {
    Ok(expect(node, name, AttributeType::Int)?.map(|a| a.i))
}

/// A `FLOAT` attribute.
pub fn float(node: &NodeProto, name: &str) -> Result<Option<f32>> {
    Ok(expect(node, name, AttributeType::Float)?.map(|a| a.f))
}

/// An `INTS` attribute.
pub fn ints<'a>(node: &'a NodeProto, name: &str) -> Result<Option<&'a [i64]>> {
    Ok(expect(node, name, AttributeType::Ints)?.map(|a| a.ints.as_slice()))
}

/// A `STRING` attribute, as UTF-8.
pub fn string(node: &NodeProto, name: &str) -> Result<Option<String>> {
    match expect(node, name, AttributeType::String)? {
        None => Ok(None),
        Some(a) => match String::from_utf8(a.s.clone()) {
            Ok(s) => Ok(Some(s)),
            Err(_) => bail!(
                "node {}: attribute '{name}' is not valid UTF-8",
                crate::node_label(node)
            ),
        },
    }
}

/// A `TENSOR` attribute.
pub fn tensor<'a>(node: &'a NodeProto, name: &str) -> Result<Option<&'a TensorProto>> {
    Ok(expect(node, name, AttributeType::Tensor)?.and_then(|a| a.t.as_ref()))
}

/// Builds an `INT` attribute.
pub fn make_int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i: value,
        ..Default::default()
    }
}

/// Builds a `FLOAT` attribute.
pub fn make_float(name: &str, value: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Float as i32,
        f: value,
        ..Default::default()
    }
}

/// Builds a `STRING` attribute.
pub fn make_string(name: &str, value: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::String as i32,
        s: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// Builds an `INTS` attribute.
pub fn make_ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: values.to_vec(),
        ..Default::default()
    }
}

/// Builds a `TENSOR` attribute.
pub fn make_tensor(name: &str, value: TensorProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Tensor as i32,
        t: Some(value),
        ..Default::default()
    }
}
