//! Inputs for a run: values from `.npy`/`.npz` files or seeded random data, and the binding of
//! every symbolic dimension (`--dim`, a file's shape, or a default).
//!
//! Input files are checked before anything is allocated for them (see [`super::npy`]), so a
//! wrong or hostile file gives one error naming the tensor and the file. Inputs are checked
//! against the memory budget ([`InputOptions::budget`]) before they are built: files by their
//! size before they are read, random inputs from their shapes alone.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use attnrt_onnx::budget::tensor_bytes;
use attnrt_onnx::{MemoryBudget, ModelProto};
use attnrt_runtime::{
    declared_inputs, dtype_name, f16, Datum, DatumType, DeclaredDim, DeclaredInput, NamedTensor,
    Tensor,
};
use ndarray::ArrayD;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::npy::{decode_npy, read_bounded, read_npz};

/// Where input values come from, and how unknowns are filled. The default: seeded random
/// values (seed 0) for every input, unbound dims at their defaults, attnrt's default element
/// limit and memory budget.
#[derive(Debug, Clone)]
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
    /// The memory the inputs may take together (one input file may not be larger either).
    pub budget: MemoryBudget,
}

impl Default for InputOptions {
    fn default() -> Self {
        InputOptions {
            npy: Vec::new(),
            npz: None,
            seed: 0,
            dims: BTreeMap::new(),
            vocab: None,
            max_elements: attnrt_onnx::Limits::default().max_tensor_elements,
            budget: MemoryBudget::machine_default(),
        }
    }
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
    /// What a user should know about the feeds: files whose shapes disagree on a dim name
    /// (names are hints; the model runs with the files' shapes, as ONNX Runtime does).
    pub notes: Vec<String>,
}

/// How a symbolic dimension got its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DimBinding {
    /// The value.
    pub value: usize,
    /// `--dim`, `default`, or the input file that fixed it.
    pub from: String,
}

/// The default for a symbolic dim nobody bound: 1 for batch-like names, 0 for a cache's past
/// length (a decoder's first step: the cache is empty), 16 otherwise.
fn default_dim(name: &str) -> usize {
    let lower = name.to_ascii_lowercase();
    if lower.contains("batch") || lower == "b" || lower == "n" {
        1
    } else if is_past(&lower) {
        0
    } else {
        16
    }
}

fn is_past(lower: &str) -> bool {
    lower.contains("past") && !lower.contains('+')
}

/// The default of a dim that sums others, once those are bound: `past + sequence` written out
/// (`past_sequence_length + sequence_length`, as optimum names a mask's axis), or a `total`
/// length (`total_sequence`) when the model has one past and one other sequence dim. A cache
/// model's mask then covers the cache and the new tokens, as the model computes it.
fn derived_dim(
    name: &str,
    symbols: &[String],
    bound: &BTreeMap<String, DimBinding>,
) -> Option<usize> {
    let value = |s: &str| bound.get(s.trim()).map(|b| b.value);
    if name.contains('+') {
        return name
            .split('+')
            .map(|t| value(t).or_else(|| t.trim().parse().ok()))
            .sum();
    }
    if !name.to_ascii_lowercase().contains("total") {
        return None;
    }
    let lower = |s: &String| s.to_ascii_lowercase();
    let pasts: Vec<&String> = symbols.iter().filter(|s| is_past(&lower(s))).collect();
    let news: Vec<&String> = symbols
        .iter()
        .filter(|s| {
            let l = lower(s);
            l.contains("seq") && !is_past(&l) && !l.contains("total") && !l.contains('+')
        })
        .collect();
    match (&pasts[..], &news[..]) {
        ([past], [new]) => Some(value(past)? + value(new)?),
        _ => None,
    }
}

/// Binds every symbolic dim no flag or file bound: [`default_dim`], then the dims that sum
/// others ([`derived_dim`]).
fn bind_defaults(symbols: &[String], bindings: &mut BTreeMap<String, DimBinding>) {
    let unbound: Vec<&String> = symbols
        .iter()
        .filter(|s| !bindings.contains_key(*s))
        .collect();
    let mut derived = Vec::new();
    for s in unbound {
        let sums = s.contains('+') || s.to_ascii_lowercase().contains("total");
        if sums {
            derived.push(s);
            continue;
        }
        let value = default_dim(s);
        bindings.insert(
            s.clone(),
            DimBinding {
                value,
                from: "default".into(),
            },
        );
    }
    for s in derived {
        let (value, from) = match derived_dim(s, symbols, bindings) {
            Some(v) => (v, "default: the sum of the dims it names".to_string()),
            None => (default_dim(s), "default".to_string()),
        };
        bindings.insert(s.clone(), DimBinding { value, from });
    }
}

/// Builds the inputs of `model` from files or seeded random data, following `options`.
pub fn prepare_inputs(model: &ModelProto, options: &InputOptions) -> Result<PreparedInputs> {
    let declared = declared_inputs(model)?;
    let symbols = symbolic_dims(&declared);
    let mut bindings = flag_bindings(options, &symbols)?;
    // Values from files first: they fix symbolic dims for the random ones.
    let mut from_files = read_input_files(&declared, options)?;
    let mut notes = Vec::new();
    for decl in &declared {
        if let Some((t, what)) = from_files.get(&decl.name) {
            notes.extend(bind_file_shape(decl, t.shape(), what, &mut bindings)?);
        }
    }
    bind_defaults(&symbols, &mut bindings);

    check_memory(&declared, &bindings, &from_files, &options.budget)?;
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
    let mut tensors = Vec::new();
    let mut sources = Vec::new();
    for decl in &declared {
        let (tensor, how) = match from_files.remove(&decl.name) {
            Some(file) => file,
            None => random_input(model, decl, &bindings, options, &mut rng)?,
        };
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
        notes,
    })
}

/// The shape of a declared input at the bound dims.
fn bound_shape(decl: &DeclaredInput, bindings: &BTreeMap<String, DimBinding>) -> Vec<usize> {
    decl.dims
        .iter()
        .map(|d| match d {
            DeclaredDim::Fixed(v) => *v,
            DeclaredDim::Symbol(s) => bindings[s].value,
        })
        .collect()
}

/// Refuses inputs over `budget` before any random one is made: each input on its own (its
/// shape and element type), then all of them together.
fn check_memory(
    declared: &[DeclaredInput],
    bindings: &BTreeMap<String, DimBinding>,
    from_files: &HashMap<String, (Tensor, String)>,
    budget: &MemoryBudget,
) -> Result<()> {
    let mut total = 0u64;
    for decl in declared {
        let shape = match from_files.get(&decl.name) {
            Some((t, _)) => t.shape().to_vec(),
            None => bound_shape(decl, bindings),
        };
        let bytes = tensor_bytes(shape.iter().map(|&d| d as u64), decl.dtype.size_of() as u64);
        budget.check(bytes, || {
            format!("input '{}' {shape:?} {}", decl.name, dtype_name(decl.dtype))
        })?;
        total = total.saturating_add(bytes);
    }
    budget.check(total, || {
        let names: Vec<String> = declared.iter().map(|d| format!("'{}'", d.name)).collect();
        format!("the sum of the inputs ({})", names.join(", "))
    })
}

/// Refuses an input file larger than `budget` before reading it.
fn check_file_size(path: &Path, budget: &MemoryBudget) -> Result<()> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("{}: cannot read the input file", path.display()))?
        .len();
    budget.check(len, || format!("input file {}", path.display()))
}

/// Every symbolic dimension name of the declared inputs, sorted, once each.
fn symbolic_dims(declared: &[DeclaredInput]) -> Vec<String> {
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
}

/// The `--dim` bindings, each checked to name a symbolic dimension of the model.
fn flag_bindings(
    options: &InputOptions,
    symbols: &[String],
) -> Result<BTreeMap<String, DimBinding>> {
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
    Ok(options
        .dims
        .iter()
        .map(|(k, v)| {
            let from = "--dim".to_string();
            (k.clone(), DimBinding { value: *v, from })
        })
        .collect())
}

/// Inputs given as files (`--input NAME=FILE.npy` first, then the `.npz`), by input name, with
/// the file they came from. Either every input has a file or none does.
fn read_input_files(
    declared: &[DeclaredInput],
    options: &InputOptions,
) -> Result<HashMap<String, (Tensor, String)>> {
    let known: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
    let mut from_files: HashMap<String, (Tensor, String)> = HashMap::new();
    for (name, path) in &options.npy {
        let Some(decl) = declared.iter().find(|d| &d.name == name) else {
            bail!(
                "--input {name}={}: the model has no input named '{name}' (inputs: {})",
                path.display(),
                known.join(", ")
            );
        };
        if from_files.contains_key(name) {
            bail!("--input {name}: given twice");
        }
        let what = path.display().to_string();
        check_file_size(path, &options.budget)?;
        let bytes = read_bounded(path, options.max_elements)?;
        let t = decode_npy(&bytes, decl.dtype, options.max_elements)
            .with_context(|| format!("{what}: input '{name}'"))?;
        from_files.insert(name.clone(), (t, what));
    }
    if let Some(npz) = &options.npz {
        check_file_size(npz, &options.budget)?;
        read_npz_inputs(npz, declared, options.max_elements, &mut from_files)?;
    }
    let missing: Vec<&str> = known
        .iter()
        .copied()
        .filter(|n| !from_files.contains_key(*n))
        .collect();
    if !from_files.is_empty() && !missing.is_empty() {
        bail!(
            "no value given for input(s) {} (give every input with --input NAME=FILE.npy or --input-npz, or none to use random data)",
            missing.join(", ")
        );
    }
    Ok(from_files)
}

/// The inputs an `.npz` holds by name, for those not already given with `--input`.
fn read_npz_inputs(
    npz: &Path,
    declared: &[DeclaredInput],
    max_elements: u64,
    from_files: &mut HashMap<String, (Tensor, String)>,
) -> Result<()> {
    let what = npz.display().to_string();
    let entries = read_npz(npz, max_elements)?;
    for decl in declared {
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
        let t = decode_npy(bytes, decl.dtype, max_elements)
            .with_context(|| format!("{what}: array '{}'", decl.name))?;
        from_files.insert(decl.name.clone(), (t, what.clone()));
    }
    Ok(())
}

/// Checks a file tensor's shape against the declaration (its rank and fixed dims), binding its
/// symbolic dims; a symbolic dim another file bound to another size is a note, not an error.
fn bind_file_shape(
    decl: &DeclaredInput,
    shape: &[usize],
    what: &str,
    bindings: &mut BTreeMap<String, DimBinding>,
) -> Result<Vec<String>> {
    let mut notes = Vec::new();
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
                Some(b) if b.value != n => notes.push(format!(
                    "{what}: input '{}' has shape {shape:?}, where dimension '{s}' (axis {axis}) is {} from {}; dim names are hints, the run uses the shapes given",
                    decl.name,
                    b.value,
                    b.from
                )),
                Some(_) => {}
                None => {
                    let from = what.to_string();
                    bindings.insert(s.clone(), DimBinding { value: n, from });
                }
            },
        }
    }
    Ok(notes)
}

/// A seeded random value for `decl` at the bound dims, and how it was made.
fn random_input(
    model: &ModelProto,
    decl: &DeclaredInput,
    bindings: &BTreeMap<String, DimBinding>,
    options: &InputOptions,
    rng: &mut ChaCha8Rng,
) -> Result<(Tensor, String)> {
    let shape = bound_shape(decl, bindings);
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
    random_tensor(model, decl, &shape, count, options.vocab, rng)
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

/// A tensor of `shape` (`count` elements) whose values `next` gives, one after the other.
fn filled<T: Datum>(shape: &[usize], count: usize, next: impl FnMut() -> T) -> Result<Tensor> {
    let data: Vec<T> = std::iter::repeat_with(next).take(count).collect();
    Ok(Tensor::from(ArrayD::from_shape_vec(shape.to_vec(), data)?))
}

/// A float tensor of element type `dt` from `f32` values, made in that type (no staging copy
/// the size of the input; the values are those of a cast).
fn floats(
    dt: DatumType,
    shape: &[usize],
    count: usize,
    mut next: impl FnMut() -> f32,
) -> Result<Tensor> {
    Ok(match dt {
        DatumType::F32 => filled(shape, count, next)?,
        DatumType::F16 => filled(shape, count, || f16::from_f32(next()))?,
        DatumType::F64 => filled(shape, count, || f64::from(next()))?,
        other => filled(shape, count, next)?.cast_to_dt(other)?.into_owned(),
    })
}

/// An integer tensor of element type `dt` from values that fit it, made in that type.
fn ints(
    dt: DatumType,
    shape: &[usize],
    count: usize,
    mut next: impl FnMut() -> i64,
) -> Result<Tensor> {
    Ok(match dt {
        DatumType::I64 => filled(shape, count, next)?,
        DatumType::I32 => filled(shape, count, || next() as i32)?,
        DatumType::I16 => filled(shape, count, || next() as i16)?,
        DatumType::I8 => filled(shape, count, || next() as i8)?,
        DatumType::U64 => filled(shape, count, || next() as u64)?,
        DatumType::U32 => filled(shape, count, || next() as u32)?,
        DatumType::U16 => filled(shape, count, || next() as u16)?,
        DatumType::U8 => filled(shape, count, || next() as u8)?,
        other => filled(shape, count, next)?.cast_to_dt(other)?.into_owned(),
    })
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
        return Ok(if mask {
            (floats(dt, shape, count, || 1.0)?, "ones (mask)".into())
        } else {
            let t = floats(dt, shape, count, || rng.gen_range(-1.0f32..1.0))?;
            (t, "random uniform [-1, 1)".into())
        });
    }
    if dt == DatumType::Bool {
        return Ok(if mask {
            (filled(shape, count, || true)?, "all true (mask)".into())
        } else {
            (
                filled(shape, count, || rng.gen_bool(0.5))?,
                "random bool".into(),
            )
        });
    }
    if mask {
        return Ok((ints(dt, shape, count, || 1)?, "ones (mask)".into()));
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
    let t = ints(dt, shape, count, || rng.gen_range(0..bound) as i64)?;
    Ok((t, format!("random integers in [0, {bound}) ({why})")))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_dims() {
        assert_eq!(default_dim("batch"), 1);
        assert_eq!(default_dim("batch_size"), 1);
        assert_eq!(default_dim("sequence"), 16);
        assert_eq!(default_dim("past_sequence_length"), 0);
    }

    fn defaults(symbols: &[&str], given: &[(&str, usize)]) -> Vec<(String, usize)> {
        let symbols: Vec<String> = symbols.iter().map(|s| s.to_string()).collect();
        let mut b: BTreeMap<String, DimBinding> = given
            .iter()
            .map(|&(s, v)| {
                (
                    s.to_string(),
                    DimBinding {
                        value: v,
                        from: "--dim".into(),
                    },
                )
            })
            .collect();
        bind_defaults(&symbols, &mut b);
        b.into_iter().map(|(k, v)| (k, v.value)).collect()
    }

    #[test]
    fn a_cache_models_mask_covers_the_past_and_the_new_tokens() {
        let pairs = |v: &[(&str, usize)]| -> Vec<(String, usize)> {
            v.iter().map(|&(s, n)| (s.to_string(), n)).collect()
        };
        // attnrt's exports: total_sequence
        let syms = ["batch", "sequence", "past_sequence", "total_sequence"];
        assert_eq!(
            defaults(&syms, &[]),
            pairs(&[
                ("batch", 1),
                ("past_sequence", 0),
                ("sequence", 16),
                ("total_sequence", 16)
            ])
        );
        assert_eq!(
            defaults(&syms, &[("past_sequence", 5), ("sequence", 3)]),
            pairs(&[
                ("batch", 1),
                ("past_sequence", 5),
                ("sequence", 3),
                ("total_sequence", 8)
            ])
        );
        // optimum's: the sum written out
        let syms = [
            "batch_size",
            "sequence_length",
            "past_sequence_length",
            "past_sequence_length + 1",
        ];
        assert_eq!(
            defaults(&syms, &[("past_sequence_length", 7)]),
            pairs(&[
                ("batch_size", 1),
                ("past_sequence_length", 7),
                ("past_sequence_length + 1", 8),
                ("sequence_length", 16)
            ])
        );
        // a total with no past to sum: the plain default
        assert_eq!(defaults(&["total"], &[]), pairs(&[("total", 16)]));
    }
}
