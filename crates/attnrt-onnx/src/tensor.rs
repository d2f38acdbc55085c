//! Reading and building `TensorProto`s: element types, checked sizes, values as Rust vectors.

use anyhow::{bail, Context, Result};

use crate::proto::{tensor_proto::DataType, TensorProto};

/// Size in bytes of one element of `data_type` when stored in `raw_data`, or `None` for types
/// without a fixed byte size (strings, sub-byte types, undefined).
pub fn element_size(data_type: i32) -> Option<usize> {
    let dt = DataType::try_from(data_type).ok()?;
    use DataType::*;
    Some(match dt {
        Float | Int32 | Uint32 => 4,
        Uint8 | Int8 | Bool | Float8e4m3fn | Float8e4m3fnuz | Float8e5m2 | Float8e5m2fnuz
        | Float8e8m0 => 1,
        Uint16 | Int16 | Float16 | Bfloat16 => 2,
        Int64 | Double | Uint64 | Complex64 => 8,
        Complex128 => 16,
        Undefined | String | Uint4 | Int4 | Float4e2m1 | Uint2 | Int2 => return None,
    })
}

/// A short lowercase name of an ONNX element type (`float`, `int64`, ...), for messages.
pub fn type_name(data_type: i32) -> String {
    match DataType::try_from(data_type) {
        Ok(dt) => dt.as_str_name().to_ascii_lowercase(),
        Err(_) => format!("unknown type {data_type}"),
    }
}

/// The number of elements of a tensor of `dims`, refusing negative dimensions and products
/// above `max_elements` (checked before anything is allocated).
pub fn element_count(dims: &[i64], max_elements: u64) -> Result<u64> {
    let mut n: u64 = 1;
    for &d in dims {
        if d < 0 {
            bail!("negative dimension {d} in shape {dims:?}");
        }
        n = n
            .checked_mul(d as u64)
            .filter(|&n| n <= max_elements)
            .with_context(|| {
                format!("shape {dims:?} has more than the limit of {max_elements} elements")
            })?;
    }
    Ok(n)
}

/// Checks that a tensor's stored data agrees with its dims and type: the element count is
/// within `max_elements` and `raw_data` (or the typed field) holds exactly that many values.
/// External tensors are checked only for their dims; their data is checked when it is read.
pub fn check_tensor(t: &TensorProto, max_elements: u64) -> Result<()> {
    let count = element_count(&t.dims, max_elements)?;
    if t.data_location == crate::proto::tensor_proto::DataLocation::External as i32 {
        return Ok(());
    }
    if t.segment.is_some() {
        bail!("segmented tensors are not supported");
    }
    let stored = stored_count(t)?;
    if let Some(stored) = stored {
        if stored != count {
            bail!(
                "holds {stored} {} values but its dims {:?} need {count}",
                type_name(t.data_type),
                t.dims
            );
        }
    }
    Ok(())
}

/// How many elements the tensor's data fields hold, or `None` when that cannot be told
/// (sub-byte packed types).
fn stored_count(t: &TensorProto) -> Result<Option<u64>> {
    if !t.raw_data.is_empty() {
        return match element_size(t.data_type) {
            Some(size) => {
                if !t.raw_data.len().is_multiple_of(size) {
                    bail!(
                        "raw_data has {} bytes, not a multiple of the {size}-byte {} element",
                        t.raw_data.len(),
                        type_name(t.data_type)
                    );
                }
                Ok(Some((t.raw_data.len() / size) as u64))
            }
            None if t.data_type == DataType::String as i32 => {
                bail!("string tensor with raw_data")
            }
            None => Ok(None),
        };
    }
    let dt = DataType::try_from(t.data_type).ok();
    use DataType::*;
    let n = match dt {
        Some(Float) => t.float_data.len(),
        Some(Complex64) => t.float_data.len() / 2,
        Some(Double) => t.double_data.len(),
        Some(Complex128) => t.double_data.len() / 2,
        Some(Int64) => t.int64_data.len(),
        Some(Uint32) | Some(Uint64) => t.uint64_data.len(),
        Some(String) => t.string_data.len(),
        Some(Int32) | Some(Int16) | Some(Int8) | Some(Uint16) | Some(Uint8) | Some(Bool)
        | Some(Float16) | Some(Bfloat16) | Some(Float8e4m3fn) | Some(Float8e4m3fnuz)
        | Some(Float8e5m2) | Some(Float8e5m2fnuz) | Some(Float8e8m0) => t.int32_data.len(),
        _ => return Ok(None),
    };
    Ok(Some(n as u64))
}

/// The values of a float-like tensor (float, double, float16, bfloat16) as `f32`.
pub fn to_f32(t: &TensorProto) -> Result<Vec<f32>> {
    check_tensor(t, u64::MAX)?;
    let dt = DataType::try_from(t.data_type).ok();
    let raw = &t.raw_data;
    Ok(match dt {
        Some(DataType::Float) if !raw.is_empty() => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Some(DataType::Float) => t.float_data.clone(),
        Some(DataType::Double) if !raw.is_empty() => raw
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        Some(DataType::Double) => t.double_data.iter().map(|&v| v as f32).collect(),
        Some(DataType::Float16) | Some(DataType::Bfloat16) => {
            let bits: Vec<u16> = if raw.is_empty() {
                t.int32_data.iter().map(|&v| v as u16).collect()
            } else {
                raw.chunks_exact(2)
                    .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            };
            if t.data_type == DataType::Float16 as i32 {
                bits.into_iter().map(f16_to_f32).collect()
            } else {
                bits.into_iter()
                    .map(|b| f32::from_bits((b as u32) << 16))
                    .collect()
            }
        }
        _ => bail!("expected a float tensor, found {}", type_name(t.data_type)),
    })
}

/// The values of an integer tensor (int8..int64, uint8..uint32, bool) as `i64`.
pub fn to_i64(t: &TensorProto) -> Result<Vec<i64>> {
    check_tensor(t, u64::MAX)?;
    let dt = DataType::try_from(t.data_type).ok();
    let raw = &t.raw_data;
    use DataType::*;
    Ok(match dt {
        Some(Int64) if !raw.is_empty() => raw
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Some(Int64) => t.int64_data.clone(),
        Some(Int32) if !raw.is_empty() => raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        Some(Uint32) if !raw.is_empty() => raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        Some(Int16) if !raw.is_empty() => raw
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        Some(Uint16) if !raw.is_empty() => raw
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        Some(Int8) if !raw.is_empty() => raw.iter().map(|&b| b as i8 as i64).collect(),
        Some(Uint8) | Some(Bool) if !raw.is_empty() => raw.iter().map(|&b| b as i64).collect(),
        Some(Uint32) => t.uint64_data.iter().map(|&v| v as i64).collect(),
        Some(Int32) | Some(Int16) | Some(Uint16) | Some(Int8) | Some(Uint8) | Some(Bool) => {
            t.int32_data.iter().map(|&v| v as i64).collect()
        }
        _ => bail!(
            "expected an integer tensor, found {}",
            type_name(t.data_type)
        ),
    })
}

/// Builds a float tensor with `raw_data`.
pub fn from_f32(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        raw_data: values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
        ..Default::default()
    }
}

/// Builds an int64 tensor with `raw_data`.
pub fn from_i64(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.to_vec(),
        data_type: DataType::Int64 as i32,
        raw_data: values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
        ..Default::default()
    }
}

/// IEEE half to single precision.
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits >> 15) as u32) << 31;
    let exp = ((bits >> 10) & 0x1f) as u32;
    let frac = (bits & 0x3ff) as u32;
    let magnitude = match (exp, frac) {
        (0, 0) => 0,
        (0, f) => {
            // Subnormal half: value = f * 2^-24; renormalise into an f32.
            let v = f as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => 0x7f80_0000,
        (0x1f, f) => 0x7f80_0000 | (f << 13),
        (e, f) => ((e + 112) << 23) | (f << 13),
    };
    f32::from_bits(sign | magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_count_refuses_negative_and_huge() {
        assert_eq!(element_count(&[2, 3, 4], 100).unwrap(), 24);
        assert_eq!(element_count(&[], 100).unwrap(), 1);
        assert!(element_count(&[2, -1], 100)
            .unwrap_err()
            .to_string()
            .contains("negative"));
        let err = element_count(&[1_000_000, 1_000_000], 1 << 32).unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
        assert!(element_count(&[i64::MAX, i64::MAX], u64::MAX).is_err());
    }

    #[test]
    fn raw_data_length_must_match_dims() {
        let mut t = from_f32("w", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        assert!(check_tensor(&t, 1 << 20).is_ok());
        t.raw_data.truncate(12);
        let err = check_tensor(&t, 1 << 20).unwrap_err().to_string();
        assert!(
            err.contains("holds 3 float values") && err.contains("need 4"),
            "{err}"
        );
        t.raw_data.truncate(11);
        assert!(check_tensor(&t, 1 << 20).is_err());
    }

    #[test]
    fn values_round_trip() {
        let t = from_f32("w", &[3], &[1.5, -2.0, 0.25]);
        assert_eq!(to_f32(&t).unwrap(), vec![1.5, -2.0, 0.25]);
        let t = from_i64("s", &[2], &[-1, 7]);
        assert_eq!(to_i64(&t).unwrap(), vec![-1, 7]);
        let typed = TensorProto {
            dims: vec![2],
            data_type: DataType::Int32 as i32,
            int32_data: vec![3, -4],
            ..Default::default()
        };
        assert_eq!(to_i64(&typed).unwrap(), vec![3, -4]);
        assert!(to_f32(&typed).is_err());
    }

    #[test]
    fn half_precision() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
    }
}
