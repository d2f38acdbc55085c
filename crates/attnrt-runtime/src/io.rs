//! Model inputs and outputs: what the model declares, values from `.npy`/`.npz` files or seeded
//! random data, symbolic dimension bindings, and writing outputs to `.npz`.
//!
//! Input files are checked before anything is allocated for them: the `.npy` header (dtype,
//! shape) is parsed here and compared with the model's declaration and with the file size, so a
//! wrong or hostile file gives one error naming the tensor and the file.

use std::collections::{BTreeMap, HashMap};
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use attnrt_onnx::proto::{tensor_shape_proto::dimension, type_proto};
use attnrt_onnx::{DataType, ModelProto};
use ndarray::ArrayD;
use ndarray_npy::{NpzWriter, ReadNpyExt};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tract_onnx::prelude::{f16, DatumType, Tensor};

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

fn onnx_to_datum(elem: i32) -> Option<DatumType> {
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

/// Where input values come from, and how unknowns are filled.
#[derive(Debug, Clone, Default)]
pub struct InputOptions {
    /// `name=file.npy` pairs.
    pub npy: Vec<(String, PathBuf)>,
    /// One `.npz` holding inputs by name (entries that are no input are ignored).
    pub npz: Option<PathBuf>,
    /// Seed for random inputs.
    pub seed: u64,
    /// Symbolic dimension bindings (`--dim NAME=VALUE`).
    pub dims: BTreeMap<String, usize>,
    /// Upper bound (exclusive) for random integer inputs; `None` = inferred per input.
    pub vocab: Option<u64>,
    /// Largest number of elements of one input tensor.
    pub max_elements: u64,
}

/// Inputs ready to run, with how each was obtained.
#[derive(Debug, Clone)]
pub struct PreparedInputs {
    /// One tensor per declared input, in declaration order.
    pub tensors: Vec<NamedTensor>,
    /// The value of every symbolic dim, with where it came from.
    pub dims: BTreeMap<String, DimBinding>,
    /// Per input: where its value came from (file, random with bounds...).
    pub sources: Vec<(String, String)>,
}

/// How a symbolic dimension got its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DimBinding {
    /// The value.
    pub value: usize,
    /// `--dim`, `default`, or the input file that fixed it.
    pub from: String,
}

/// The default for a symbolic dim nobody bound: 1 for batch-like names, 16 otherwise.
fn default_dim(name: &str) -> usize {
    let lower = name.to_ascii_lowercase();
    if lower.contains("batch") || lower == "b" || lower == "n" {
        1
    } else {
        16
    }
}

/// Builds the inputs of `model` from files or seeded random data, following `options`.
pub fn prepare_inputs(model: &ModelProto, options: &InputOptions) -> Result<PreparedInputs> {
    let declared = declared_inputs(model)?;
    let known: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
    let symbols: Vec<String> = {
        let mut s: Vec<String> = declared
            .iter()
            .flat_map(|d| d.dims.iter())
            .filter_map(|d| match d {
                DeclaredDim::Symbol(s) => Some(s.clone()),
                DeclaredDim::Fixed(_) => None,
            })
            .collect();
        s.sort();
        s.dedup();
        s
    };
    for name in options.dims.keys() {
        if !symbols.contains(name) {
            bail!(
                "--dim {name}: the model has no symbolic dimension of that name (it has: {})",
                if symbols.is_empty() {
                    "none".to_string()
                } else {
                    symbols.join(", ")
                }
            );
        }
    }
    let mut bindings: BTreeMap<String, DimBinding> = options
        .dims
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                DimBinding {
                    value: *v,
                    from: "--dim".into(),
                },
            )
        })
        .collect();

    // Values from files first: they fix symbolic dims for the random ones.
    let mut from_files: HashMap<String, (Tensor, String)> = HashMap::new();
    for (name, path) in &options.npy {
        if !known.contains(&name.as_str()) {
            bail!(
                "--input {name}={}: the model has no input named '{name}' (inputs: {})",
                path.display(),
                known.join(", ")
            );
        }
        if from_files.contains_key(name) {
            bail!("--input {name}: given twice");
        }
        let decl = declared
            .iter()
            .find(|d| &d.name == name)
            .expect("checked above");
        let what = path.display().to_string();
        let bytes = read_bounded(path, options.max_elements)?;
        let t = decode_npy(&bytes, decl.dtype, options.max_elements)
            .with_context(|| format!("{what}: input '{name}'"))?;
        from_files.insert(name.clone(), (t, what));
    }
    if let Some(npz) = &options.npz {
        let what = npz.display().to_string();
        let entries = read_npz(npz, options.max_elements)?;
        for decl in &declared {
            if from_files.contains_key(&decl.name) {
                continue; // --input overrides the npz
            }
            let Some(bytes) = entries.get(&decl.name) else {
                let mut have: Vec<&str> = entries.keys().map(String::as_str).collect();
                have.sort();
                bail!(
                    "{what}: no array named '{}' for model input '{}' (it has: {})",
                    decl.name,
                    decl.name,
                    if have.is_empty() {
                        "nothing".to_string()
                    } else {
                        have.join(", ")
                    }
                );
            };
            let t = decode_npy(bytes, decl.dtype, options.max_elements)
                .with_context(|| format!("{what}: array '{}'", decl.name))?;
            from_files.insert(decl.name.clone(), (t, what.clone()));
        }
    }
    if !from_files.is_empty() {
        let missing: Vec<&str> = known
            .iter()
            .copied()
            .filter(|n| !from_files.contains_key(*n))
            .collect();
        if !missing.is_empty() {
            bail!(
                "no value given for input(s) {} (give every input with --input NAME=FILE.npy or --input-npz, or none to use random data)",
                missing.join(", ")
            );
        }
    }

    // Check every file tensor against the declaration, binding symbols as we go.
    for decl in &declared {
        let Some((t, what)) = from_files.get(&decl.name) else {
            continue;
        };
        let shape = t.shape();
        if shape.len() != decl.dims.len() {
            bail!(
                "{what}: input '{}' has shape {shape:?} (rank {}), the model expects rank {} ({})",
                decl.name,
                shape.len(),
                decl.dims.len(),
                show_dims(&decl.dims)
            );
        }
        for (axis, (d, &n)) in decl.dims.iter().zip(shape).enumerate() {
            match d {
                DeclaredDim::Fixed(v) if *v != n => bail!(
                    "{what}: input '{}' has shape {shape:?}, the model expects {} (axis {axis} must be {v})",
                    decl.name,
                    show_dims(&decl.dims)
                ),
                DeclaredDim::Fixed(_) => {}
                DeclaredDim::Symbol(s) => match bindings.get(s) {
                    Some(b) if b.value != n => bail!(
                        "{what}: input '{}' has shape {shape:?}, but dimension '{s}' (axis {axis}) is {} from {}",
                        decl.name,
                        b.value,
                        b.from
                    ),
                    Some(_) => {}
                    None => {
                        bindings.insert(s.clone(), DimBinding { value: n, from: what.clone() });
                    }
                },
            }
        }
    }
    for s in &symbols {
        bindings.entry(s.clone()).or_insert_with(|| DimBinding {
            value: default_dim(s),
            from: "default".into(),
        });
    }

    let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
    let mut tensors = Vec::new();
    let mut sources = Vec::new();
    for decl in &declared {
        if let Some((t, what)) = from_files.remove(&decl.name) {
            tensors.push(NamedTensor {
                name: decl.name.clone(),
                tensor: t,
            });
            sources.push((decl.name.clone(), what));
            continue;
        }
        let shape: Vec<usize> = decl
            .dims
            .iter()
            .map(|d| match d {
                DeclaredDim::Fixed(v) => *v,
                DeclaredDim::Symbol(s) => bindings[s].value,
            })
            .collect();
        let count = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
            .filter(|c| *c <= options.max_elements)
            .with_context(|| {
                format!(
                    "input '{}' of shape {shape:?} would have more than the limit of {} elements",
                    decl.name, options.max_elements
                )
            })? as usize;
        let (tensor, how) = random_tensor(model, decl, &shape, count, options.vocab, &mut rng)?;
        tensors.push(NamedTensor {
            name: decl.name.clone(),
            tensor,
        });
        sources.push((decl.name.clone(), how));
    }
    Ok(PreparedInputs {
        tensors,
        dims: bindings,
        sources,
    })
}

fn show_dims(dims: &[DeclaredDim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            DeclaredDim::Fixed(v) => v.to_string(),
            DeclaredDim::Symbol(s) => s.clone(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn is_mask_name(name: &str) -> bool {
    name.to_ascii_lowercase().contains("mask")
}

fn random_tensor(
    model: &ModelProto,
    decl: &DeclaredInput,
    shape: &[usize],
    count: usize,
    vocab: Option<u64>,
    rng: &mut ChaCha8Rng,
) -> Result<(Tensor, String)> {
    let mask = is_mask_name(&decl.name);
    let dt = decl.dtype;
    if dt.is_float() {
        let (data, how): (Vec<f32>, String) = if mask {
            (vec![1.0; count], "ones (mask)".into())
        } else {
            (
                (0..count).map(|_| rng.gen_range(-1.0f32..1.0)).collect(),
                "random uniform [-1, 1)".into(),
            )
        };
        let t = Tensor::from(ArrayD::from_shape_vec(shape.to_vec(), data)?);
        return Ok((t.cast_to_dt(dt)?.into_owned(), how));
    }
    if dt == DatumType::Bool {
        let (data, how): (Vec<bool>, String) = if mask {
            (vec![true; count], "all true (mask)".into())
        } else {
            (
                (0..count).map(|_| rng.gen_bool(0.5)).collect(),
                "random bool".into(),
            )
        };
        return Ok((
            Tensor::from(ArrayD::from_shape_vec(shape.to_vec(), data)?),
            how,
        ));
    }
    if mask {
        let t = Tensor::from(ArrayD::from_shape_vec(shape.to_vec(), vec![1i64; count])?);
        return Ok((t.cast_to_dt(dt)?.into_owned(), "ones (mask)".into()));
    }
    let (bound, why) = match vocab {
        Some(v) => (v, "--vocab".to_string()),
        None => match vocab_bound(model, &decl.name) {
            Some((rows, table)) => (rows, format!("rows of embedding table '{table}'")),
            None => (2, "no embedding table found; safe default".to_string()),
        },
    };
    let type_max: u64 = match dt {
        DatumType::U8 => u8::MAX as u64 + 1,
        DatumType::I8 => i8::MAX as u64 + 1,
        DatumType::U16 => u16::MAX as u64 + 1,
        DatumType::I16 => i16::MAX as u64 + 1,
        DatumType::U32 => u32::MAX as u64 + 1,
        DatumType::I32 => i32::MAX as u64 + 1,
        _ => i64::MAX as u64,
    };
    let bound = bound.clamp(1, type_max);
    let data: Vec<i64> = (0..count).map(|_| rng.gen_range(0..bound) as i64).collect();
    let t = Tensor::from(ArrayD::from_shape_vec(shape.to_vec(), data)?);
    Ok((
        t.cast_to_dt(dt)?.into_owned(),
        format!("random integers in [0, {bound}) ({why})"),
    ))
}

/// The smallest row count of an embedding table (`Gather` whose data is an initializer or a
/// `Constant`) that the integer input `input` indexes, following it through shape-only ops.
pub fn vocab_bound(model: &ModelProto, input: &str) -> Option<(u64, String)> {
    let graph = model.graph.as_ref()?;
    let mut rows: HashMap<&str, (u64, String)> = graph
        .initializer
        .iter()
        .filter(|t| !t.dims.is_empty() && t.dims[0] > 0)
        .map(|t| (t.name.as_str(), (t.dims[0] as u64, t.name.clone())))
        .collect();
    for n in &graph.node {
        if n.op_type == "Constant" && n.domain.is_empty() {
            if let (Some(out), Some(t)) = (
                n.output.first(),
                n.attribute.iter().find_map(|a| a.t.as_ref()),
            ) {
                if !t.dims.is_empty() && t.dims[0] > 0 {
                    rows.insert(out.as_str(), (t.dims[0] as u64, attnrt_onnx::node_label(n)));
                }
            }
        }
    }
    // Ops that carry index values through unchanged.
    const PASS: [&str; 8] = [
        "Cast",
        "Identity",
        "Reshape",
        "Unsqueeze",
        "Squeeze",
        "Flatten",
        "Expand",
        "Clip",
    ];
    let mut frontier = vec![input.to_string()];
    let mut seen = std::collections::HashSet::new();
    let mut best: Option<(u64, String)> = None;
    while let Some(t) = frontier.pop() {
        if !seen.insert(t.clone()) || seen.len() > 64 {
            continue;
        }
        for n in &graph.node {
            if n.op_type == "Gather" && n.input.get(1) == Some(&t) {
                if let Some((r, name)) = n.input.first().and_then(|d| rows.get(d.as_str())) {
                    if best.as_ref().is_none_or(|(b, _)| r < b) {
                        best = Some((*r, name.clone()));
                    }
                }
            } else if PASS.contains(&n.op_type.as_str()) && n.input.first() == Some(&t) {
                frontier.extend(n.output.iter().cloned());
            }
        }
    }
    best
}

/// Reads a file whose size is bounded by what `max_elements` 8-byte elements (plus headers) need.
fn read_bounded(path: &Path, max_elements: u64) -> Result<Vec<u8>> {
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
fn decode_npy(bytes: &[u8], want: DatumType, max_elements: u64) -> Result<Tensor> {
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
fn read_npz(path: &Path, max_elements: u64) -> Result<HashMap<String, Vec<u8>>> {
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

/// Min, max and mean of a tensor's values (NaNs counted apart), for the run report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TensorSummary {
    /// Smallest non-NaN value.
    pub min: f64,
    /// Largest non-NaN value.
    pub max: f64,
    /// Mean of the non-NaN values.
    pub mean: f64,
    /// Number of NaN values.
    pub nan: usize,
}

/// Summarizes a numeric or bool tensor; `None` for types without a numeric view.
pub fn summarize(t: &Tensor) -> Option<TensorSummary> {
    let c = t.cast_to::<f64>().ok()?;
    let data = c.try_as_plain_ram().ok()?.as_slice::<f64>().ok()?;
    let (mut min, mut max, mut sum, mut n, mut nan) =
        (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0usize, 0usize);
    for &x in data {
        if x.is_nan() {
            nan += 1;
            continue;
        }
        min = min.min(x);
        max = max.max(x);
        sum += x;
        n += 1;
    }
    if n == 0 {
        return Some(TensorSummary {
            min: f64::NAN,
            max: f64::NAN,
            mean: f64::NAN,
            nan,
        });
    }
    Some(TensorSummary {
        min,
        max,
        mean: sum / n as f64,
        nan,
    })
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

    #[test]
    fn default_dims() {
        assert_eq!(default_dim("batch"), 1);
        assert_eq!(default_dim("batch_size"), 1);
        assert_eq!(default_dim("sequence"), 16);
    }
}
