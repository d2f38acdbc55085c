//! Named tensors and what a model declares as its inputs (names, element types, fixed and
//! symbolic axes): the values a session takes and gives.

use anyhow::{bail, Context, Result};
use attnrt_onnx::proto::{tensor_shape_proto::dimension, type_proto};
use attnrt_onnx::{DataType, ModelProto};
use serde::Serialize;
use tract_onnx::prelude::{DatumType, Tensor};

/// A tensor with the graph input/output name it belongs to.
#[derive(Debug, Clone)]
pub struct NamedTensor {
    /// Graph input or output name.
    pub name: String,
    /// The value.
    pub tensor: Tensor,
}

/// One axis of a declared graph input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum DeclaredDim {
    /// A fixed extent.
    Fixed(usize),
    /// A symbolic extent: `dim_param`, or `<input>:<axis>` for an unnamed one.
    Symbol(String),
}

/// A graph input as the model declares it (initializers excluded).
#[derive(Debug, Clone, Serialize)]
pub struct DeclaredInput {
    /// Input name.
    pub name: String,
    /// Element type, as tract names it.
    #[serde(serialize_with = "ser_dt")]
    pub dtype: DatumType,
    /// Axes.
    pub dims: Vec<DeclaredDim>,
}

fn ser_dt<S: serde::Serializer>(dt: &DatumType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(dtype_name(*dt))
}

/// The numpy name of a tract element type (`float32`, `int64`, ...).
pub fn dtype_name(dt: DatumType) -> &'static str {
    match dt {
        DatumType::Bool => "bool",
        DatumType::U8 => "uint8",
        DatumType::U16 => "uint16",
        DatumType::U32 => "uint32",
        DatumType::U64 => "uint64",
        DatumType::I8 => "int8",
        DatumType::I16 => "int16",
        DatumType::I32 => "int32",
        DatumType::I64 => "int64",
        DatumType::F16 => "float16",
        DatumType::F32 => "float32",
        DatumType::F64 => "float64",
        _ => "other",
    }
}

/// tract's element type of an ONNX one, when tract has it.
pub(crate) fn onnx_to_datum(elem: i32) -> Option<DatumType> {
    Some(match DataType::try_from(elem).ok()? {
        DataType::Float => DatumType::F32,
        DataType::Uint8 => DatumType::U8,
        DataType::Int8 => DatumType::I8,
        DataType::Uint16 => DatumType::U16,
        DataType::Int16 => DatumType::I16,
        DataType::Int32 => DatumType::I32,
        DataType::Int64 => DatumType::I64,
        DataType::Bool => DatumType::Bool,
        DataType::Float16 => DatumType::F16,
        DataType::Double => DatumType::F64,
        DataType::Uint32 => DatumType::U32,
        DataType::Uint64 => DatumType::U64,
        _ => return None,
    })
}

/// The graph inputs that need values (graph inputs that are not initializers), in order.
pub fn declared_inputs(model: &ModelProto) -> Result<Vec<DeclaredInput>> {
    let graph = model.graph.as_ref().context("the model has no graph")?;
    let inits: std::collections::HashSet<&str> =
        graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let mut out = Vec::new();
    for input in &graph.input {
        if inits.contains(input.name.as_str()) {
            continue;
        }
        let Some(type_proto::Value::TensorType(t)) =
            input.r#type.as_ref().and_then(|t| t.value.as_ref())
        else {
            bail!(
                "graph input '{}' is not a tensor (or has no type)",
                input.name
            );
        };
        let dtype = onnx_to_datum(t.elem_type).with_context(|| {
            format!(
                "graph input '{}' has element type {}, which attnrt cannot feed",
                input.name,
                attnrt_onnx::tensor::type_name(t.elem_type)
            )
        })?;
        let shape = t.shape.as_ref().with_context(|| {
            format!(
                "graph input '{}' has no shape (not even a rank)",
                input.name
            )
        })?;
        let dims = shape
            .dim
            .iter()
            .enumerate()
            .map(|(axis, d)| match &d.value {
                Some(dimension::Value::DimValue(v)) if *v >= 0 => {
                    Ok(DeclaredDim::Fixed(*v as usize))
                }
                Some(dimension::Value::DimValue(v)) => {
                    bail!(
                        "graph input '{}' declares a negative dim {v} on axis {axis}",
                        input.name
                    )
                }
                Some(dimension::Value::DimParam(p)) if !p.is_empty() => {
                    Ok(DeclaredDim::Symbol(p.clone()))
                }
                _ => Ok(DeclaredDim::Symbol(format!("{}:{axis}", input.name))),
            })
            .collect::<Result<Vec<_>>>()?;
        out.push(DeclaredInput {
            name: input.name.clone(),
            dtype,
            dims,
        });
    }
    Ok(out)
}

/// The values of a plain f32 tensor (an op's input).
pub(crate) fn f32_data(t: &Tensor) -> Result<&[f32]> {
    t.try_as_plain_ram()?.as_slice::<f32>()
}

/// The values of a contiguous f32 tensor, to write (an op's output).
pub(crate) fn f32_data_mut(t: &mut Tensor) -> Result<&mut [f32]> {
    t.to_plain_array_view_mut::<f32>()?
        .into_slice()
        .context("an output tensor is not contiguous")
}
