//! `.npy` and `.npz` files: headers parsed and checked against the expected element type and
//! the file size before anything is allocated, tensors read by name, outputs written.

use std::collections::HashMap;
use std::io::{Cursor, Read};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use attnrt_runtime::f16;
use attnrt_runtime::{dtype_name, DatumType, NamedTensor, Tensor};
use ndarray::ArrayD;
use ndarray_npy::{NpzWriter, ReadNpyExt};

/// Reads a file whose size is bounded by what `max_elements` 8-byte elements (plus headers) need.
pub(crate) fn read_bounded(path: &Path, max_elements: u64) -> Result<Vec<u8>> {
    let what = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("{what}: cannot read"))?;
    if !meta.is_file() {
        bail!("{what}: not a file");
    }
    let cap = max_elements.saturating_mul(16).saturating_add(1 << 20);
    if meta.len() > cap {
        bail!(
            "{what}: {} bytes is larger than the input limit allows",
            meta.len()
        );
    }
    std::fs::read(path).with_context(|| format!("{what}: cannot read"))
}

/// The parts of an `.npy` header attnrt checks before decoding.
#[derive(Debug, Clone, PartialEq)]
struct NpyHeader {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
    data_offset: usize,
}

/// Parses the header of an `.npy` file (format versions 1–3).
fn parse_npy_header(bytes: &[u8]) -> Result<NpyHeader> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        bail!("not a .npy file (bad magic)");
    }
    let (len, start): (usize, usize) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => bail!("unsupported .npy format version {v}"),
    };
    let end = start
        .checked_add(len)
        .filter(|e| *e <= bytes.len())
        .context("truncated .npy header")?;
    let text = std::str::from_utf8(&bytes[start..end]).context(".npy header is not text")?;
    let field = |key: &str| -> Result<&str> {
        let pat = format!("'{key}':");
        let i = text
            .find(&pat)
            .with_context(|| format!(".npy header has no '{key}'"))?;
        Ok(text[i + pat.len()..].trim_start())
    };
    let descr = {
        let rest = field("descr")?;
        let q = rest
            .chars()
            .next()
            .filter(|c| *c == '\'' || *c == '"')
            .context("bad 'descr' in .npy header")?;
        let close = rest[1..].find(q).context("bad 'descr' in .npy header")?;
        rest[1..1 + close].to_string()
    };
    let shape = {
        let rest = field("shape")?;
        let rest = rest
            .strip_prefix('(')
            .context("bad 'shape' in .npy header")?;
        let close = rest.find(')').context("bad 'shape' in .npy header")?;
        rest[..close]
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.trim_end_matches('L')
                    .parse::<usize>()
                    .context("bad 'shape' in .npy header")
            })
            .collect::<Result<Vec<_>>>()?
    };
    let fortran_order = field("fortran_order")?.starts_with("True");
    Ok(NpyHeader {
        descr,
        fortran_order,
        shape,
        data_offset: end,
    })
}

/// numpy's name of a dtype descriptor, for messages.
fn descr_name(descr: &str) -> String {
    let name = match descr.trim_start_matches(['<', '>', '|', '=']) {
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "b1" => "bool",
        _ => return format!("'{descr}'"),
    };
    format!("{name} ('{descr}')")
}

fn item_size(dt: DatumType) -> usize {
    dt.size_of()
}

/// Decodes `.npy` bytes as a tensor of element type `want`, refusing other dtypes and checking
/// the element count against the limit and the data length before decoding.
pub(crate) fn decode_npy(bytes: &[u8], want: DatumType, max_elements: u64) -> Result<Tensor> {
    let h = parse_npy_header(bytes)?;
    let count = h
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .filter(|c| *c <= max_elements)
        .with_context(|| {
            format!(
                "shape {:?} has more than the limit of {max_elements} elements",
                h.shape
            )
        })?;
    let expected_bytes = count.saturating_mul(item_size(want) as u64);
    let have = (bytes.len() - h.data_offset) as u64;
    macro_rules! read_as {
        ($t:ty) => {{
            if have != expected_bytes {
                // Wrong dtype shows up here as a length mismatch too; name the dtype first.
                check_descr(&h.descr, want)?;
                bail!(
                    "data is {have} bytes, shape {:?} of {} needs {expected_bytes} (truncated file?)",
                    h.shape,
                    dtype_name(want)
                );
            }
            check_descr(&h.descr, want)?;
            let a = ArrayD::<$t>::read_npy(Cursor::new(bytes)).map_err(|e| anyhow!("cannot decode: {e}"))?;
            Tensor::from(a.as_standard_layout().into_owned())
        }};
    }
    Ok(match want {
        DatumType::F32 => read_as!(f32),
        DatumType::F64 => read_as!(f64),
        DatumType::I64 => read_as!(i64),
        DatumType::I32 => read_as!(i32),
        DatumType::I16 => read_as!(i16),
        DatumType::I8 => read_as!(i8),
        DatumType::U8 => read_as!(u8),
        DatumType::U16 => read_as!(u16),
        DatumType::U32 => read_as!(u32),
        DatumType::U64 => read_as!(u64),
        DatumType::Bool => read_as!(bool),
        DatumType::F16 => {
            // The npy reader has no half type: decode the little-endian bits here.
            check_descr(&h.descr, want)?;
            if have != expected_bytes {
                bail!("data is {have} bytes, shape {:?} of float16 needs {expected_bytes} (truncated file?)", h.shape);
            }
            if h.fortran_order {
                bail!("Fortran-ordered float16 arrays are not supported; save with C order");
            }
            let data: Vec<f16> = bytes[h.data_offset..]
                .chunks_exact(2)
                .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                .collect();
            Tensor::from(ArrayD::from_shape_vec(h.shape.clone(), data)?)
        }
        other => bail!(
            "attnrt cannot read {} inputs from .npy files",
            dtype_name(other)
        ),
    })
}

fn check_descr(descr: &str, want: DatumType) -> Result<()> {
    let code = descr.trim_start_matches(['<', '|', '=']);
    let ok = match want {
        DatumType::F32 => code == "f4",
        DatumType::F64 => code == "f8",
        DatumType::I64 => code == "i8",
        DatumType::I32 => code == "i4",
        DatumType::I16 => code == "i2",
        DatumType::I8 => code == "i1",
        DatumType::U8 => code == "u1",
        DatumType::U16 => code == "u2",
        DatumType::U32 => code == "u4",
        DatumType::U64 => code == "u8",
        DatumType::Bool => code == "b1",
        DatumType::F16 => code == "f2",
        _ => false,
    };
    if !ok || descr.starts_with('>') {
        bail!(
            "dtype is {}, the model expects {}",
            descr_name(descr),
            dtype_name(want)
        );
    }
    Ok(())
}

/// Reads every `.npy` entry of an `.npz` into memory (bounded by the limit), by array name.
pub(crate) fn read_npz(path: &Path, max_elements: u64) -> Result<HashMap<String, Vec<u8>>> {
    let what = path.display().to_string();
    let bytes = read_bounded(path, max_elements)?;
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| anyhow!("{what}: not a valid .npz (zip) file: {e}"))?;
    let cap = max_elements.saturating_mul(16).saturating_add(1 << 20);
    let mut total = 0u64;
    let mut out = HashMap::new();
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| anyhow!("{what}: cannot read entry {i}: {e}"))?;
        let name = entry.name().to_string();
        let Some(array) = name.strip_suffix(".npy") else {
            continue;
        };
        total = total.saturating_add(entry.size());
        if total > cap {
            bail!("{what}: the arrays are larger than the input limit allows");
        }
        let mut data = Vec::with_capacity(entry.size() as usize);
        (&mut entry)
            .take(cap)
            .read_to_end(&mut data)
            .map_err(|e| anyhow!("{what}: cannot read array '{array}': {e}"))?;
        out.insert(array.to_string(), data);
    }
    Ok(out)
}

/// Writes `tensors` to an `.npz` atomically (no partial file on error). f16 tensors are stored
/// as float32 (the npy writer has no half type); the returned notes say so.
pub fn write_npz(path: &Path, tensors: &[NamedTensor]) -> Result<Vec<String>> {
    let what = path.display();
    let mut notes = Vec::new();
    let mut w = NpzWriter::new(Cursor::new(Vec::new()));
    for t in tensors {
        let err = |e: ndarray_npy::WriteNpzError| anyhow!("{what}: cannot write '{}': {e}", t.name);
        macro_rules! add {
            ($ty:ty) => {{
                let view = t.tensor.to_plain_array_view::<$ty>()?;
                w.add_array(t.name.as_str(), &view).map_err(err)?
            }};
        }
        match t.tensor.datum_type() {
            DatumType::F32 => add!(f32),
            DatumType::F64 => add!(f64),
            DatumType::I64 => add!(i64),
            DatumType::I32 => add!(i32),
            DatumType::I16 => add!(i16),
            DatumType::I8 => add!(i8),
            DatumType::U8 => add!(u8),
            DatumType::U16 => add!(u16),
            DatumType::U32 => add!(u32),
            DatumType::U64 => add!(u64),
            DatumType::Bool => add!(bool),
            DatumType::F16 => {
                let c = t.tensor.cast_to::<f32>()?;
                let view = c.to_plain_array_view::<f32>()?;
                w.add_array(t.name.as_str(), &view).map_err(err)?;
                notes.push(format!("{}: float16 stored as float32", t.name));
            }
            other => bail!(
                "{what}: cannot store '{}' of type {other:?} in .npz",
                t.name
            ),
        }
    }
    let bytes = w.finish().map_err(|e| anyhow!("{what}: {e}"))?.into_inner();
    attnrt_onnx::save::write_atomic(path, &bytes)?;
    Ok(notes)
}

/// Reads every array of an `.npz` as a tensor (for `--expect`), in the file's order.
pub fn read_npz_tensors(path: &Path, max_elements: u64) -> Result<Vec<NamedTensor>> {
    let what = path.display().to_string();
    let entries = read_npz(path, max_elements)?;
    let mut names: Vec<&String> = entries.keys().collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let bytes = &entries[name];
        let h = parse_npy_header(bytes).with_context(|| format!("{what}: array '{name}'"))?;
        let code = h.descr.trim_start_matches(['<', '|', '=']);
        let dt = match code {
            "f4" => DatumType::F32,
            "f8" => DatumType::F64,
            "i8" => DatumType::I64,
            "i4" => DatumType::I32,
            "i2" => DatumType::I16,
            "i1" => DatumType::I8,
            "u1" => DatumType::U8,
            "u2" => DatumType::U16,
            "u4" => DatumType::U32,
            "u8" => DatumType::U64,
            "b1" => DatumType::Bool,
            "f2" => DatumType::F16,
            _ => bail!(
                "{what}: array '{name}' has dtype {}, which attnrt cannot read",
                descr_name(&h.descr)
            ),
        };
        let tensor = decode_npy(bytes, dt, max_elements)
            .with_context(|| format!("{what}: array '{name}'"))?;
        out.push(NamedTensor {
            name: name.clone(),
            tensor,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_testkit::npy_bytes;

    #[test]
    fn npy_header_is_parsed() {
        let b = npy_bytes("<f4", &[2, 3], &[0u8; 24]);
        let h = parse_npy_header(&b).unwrap();
        assert_eq!(h.descr, "<f4");
        assert_eq!(h.shape, vec![2, 3]);
        let t = decode_npy(&b, DatumType::F32, 1000).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        let scalar = npy_bytes("<i8", &[], &7i64.to_le_bytes());
        let t = decode_npy(&scalar, DatumType::I64, 1000).unwrap();
        assert_eq!(t.shape(), &[] as &[usize]);
    }

    #[test]
    fn npy_wrong_dtype_truncation_and_huge_shapes_are_refused() {
        let b = npy_bytes("<i8", &[2, 3], &[0u8; 48]);
        let e = decode_npy(&b, DatumType::F32, 1000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("int64") && e.contains("float32"), "{e}");
        let b = npy_bytes("<f4", &[2, 3], &[0u8; 20]);
        let e = decode_npy(&b, DatumType::F32, 1000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        let b = npy_bytes("<f4", &[1000000, 1000000], &[0u8; 4]);
        let e = decode_npy(&b, DatumType::F32, 1 << 32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("limit"), "{e}");
        assert!(parse_npy_header(b"garbage").is_err());
    }

    #[test]
    fn npz_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.npz");
        let a = NamedTensor {
            name: "a".into(),
            tensor: Tensor::from(
                ArrayD::from_shape_vec(vec![2, 2], vec![1f32, 2., 3., 4.]).unwrap(),
            ),
        };
        let b = NamedTensor {
            name: "b".into(),
            tensor: Tensor::from(ArrayD::from_shape_vec(vec![3], vec![1i64, 2, 3]).unwrap()),
        };
        write_npz(&path, &[a.clone(), b.clone()]).unwrap();
        let back = read_npz_tensors(&path, 1000).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].tensor, a.tensor);
        assert_eq!(back[1].tensor, b.tensor);
    }
}
