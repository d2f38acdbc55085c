//! Loading a model: decode the protobuf, check it is a model, read its external data from
//! files inside the model's own folder only, and check every tensor against its dims.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use prost::Message;

use crate::proto::{
    tensor_proto::DataLocation, FunctionProto, GraphProto, ModelProto, NodeProto, TensorProto,
};
use crate::tensor::{check_tensor, element_count, element_size, type_name};
use crate::validate::validate_model_with;
use crate::Limits;

/// A model read from disk, with every external tensor's data inlined into `raw_data`: slices of
/// the mapped model file and external data files (see [`crate::mapped`]), not copies.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// The model, self-contained: no tensor refers to external data any more.
    pub model: ModelProto,
    /// The file it was read from.
    pub path: PathBuf,
    /// The external data files that were read, relative to the model's folder, in first-use order.
    pub external_files: Vec<String>,
}

/// Decodes a model from bytes, checking that it really is an ONNX model (a graph, an IR
/// version, opset imports) and that it stays within `limits`. External data is not resolved;
/// `what` names the source in error messages. The model owns copies of its tensors' data;
/// [`decode_model_shared`] shares them with the buffer instead.
pub fn decode_model(bytes: &[u8], what: &str, limits: &Limits) -> Result<ModelProto> {
    check_model_size(bytes.len(), what, limits)?;
    let model = ModelProto::decode(bytes).map_err(|e| decode_error(what, &e))?;
    check_decoded(model, what, limits)
}

/// [`decode_model`] on a shared buffer (a mapped file, see [`crate::mapped`]): every tensor's
/// `raw_data` is a slice of `bytes`, not a copy.
pub fn decode_model_shared(bytes: Bytes, what: &str, limits: &Limits) -> Result<ModelProto> {
    check_model_size(bytes.len(), what, limits)?;
    let model = ModelProto::decode(bytes).map_err(|e| decode_error(what, &e))?;
    check_decoded(model, what, limits)
}

fn check_model_size(len: usize, what: &str, limits: &Limits) -> Result<()> {
    if len as u64 > limits.max_model_bytes {
        bail!(
            "{what}: {len} bytes is over the model size limit of {} bytes",
            limits.max_model_bytes
        );
    }
    if len == 0 {
        bail!("{what}: empty file, not an ONNX model");
    }
    Ok(())
}

/// The checks of [`decode_model`] after decoding.
fn check_decoded(model: ModelProto, what: &str, limits: &Limits) -> Result<ModelProto> {
    let Some(graph) = model.graph.as_ref() else {
        bail!("{what}: not an ONNX model: it has no graph");
    };
    if model.ir_version <= 0 {
        bail!(
            "{what}: not an ONNX model: ir_version is {}",
            model.ir_version
        );
    }
    if model.ir_version > crate::opset::MAX_KNOWN_IR_VERSION {
        bail!(
            "{what}: IR version {} is newer than the newest attnrt knows ({})",
            model.ir_version,
            crate::opset::MAX_KNOWN_IR_VERSION
        );
    }
    if model.opset_import.is_empty() {
        bail!("{what}: not an ONNX model: it imports no operator set");
    }
    check_depth_and_size(graph, what, limits)?;
    Ok(model)
}

/// prost nests at most this many messages (its default recursion limit), which bounds the
/// stack used by decoding, validation and every later walk over subgraphs.
pub const PROTOBUF_NESTING_LIMIT: usize = 100;

/// Turns a prost decode error into one line that says what is wrong with the file.
///
/// prost reports `failed to decode Protobuf message: Outer.field: Inner.field: description`
/// with the innermost field first; the path is bounded by the nesting limit, but a hundred
/// fields of path help nobody, so it is shortened to its two innermost fields.
fn decode_error(what: &str, e: &prost::DecodeError) -> anyhow::Error {
    let text = e.to_string();
    let body = text
        .strip_prefix("failed to decode Protobuf message: ")
        .unwrap_or(&text);
    // The path entries are `Message.field`; the description is the rest (it may hold ": ").
    let mut parts: Vec<&str> = Vec::new();
    let mut rest = body;
    while let Some((head, tail)) = rest.split_once(": ") {
        let is_path = head.contains('.')
            && head
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        if !is_path {
            break;
        }
        parts.push(head);
        rest = tail;
    }
    let description = rest;
    if description.contains("recursion limit") {
        return anyhow::anyhow!(
            "{what}: not a valid ONNX model: messages nested more than {PROTOBUF_NESTING_LIMIT} deep \
             (such as If/Loop subgraphs nested about {} levels or more); refused before decoding further",
            PROTOBUF_NESTING_LIMIT / 3
        );
    }
    let at = match parts.len() {
        0 => String::new(),
        1 | 2 => format!(" at {}", parts.join(" in ")),
        n => format!(" at {} in {} (nested {n} deep)", parts[0], parts[1]),
    };
    let hint = if description.contains("buffer underflow") || description.contains("invalid varint")
    {
        " (the file is truncated or corrupt)"
    } else {
        ""
    };
    anyhow::anyhow!("{what}: not a valid ONNX model: protobuf error: {description}{at}{hint}")
}

/// Refuses graphs nested deeper than the limit or with more nodes than the limit; the walk
/// itself is bounded by the depth limit, so a hostile file cannot overflow the stack here.
fn check_depth_and_size(graph: &GraphProto, what: &str, limits: &Limits) -> Result<()> {
    fn walk(
        g: &GraphProto,
        owner: Option<&NodeProto>,
        depth: usize,
        count: &mut usize,
        what: &str,
        limits: &Limits,
    ) -> Result<()> {
        if depth > limits.max_subgraph_depth {
            bail!(
                "{what}: subgraphs nested more than the limit of {} deep (graph '{}' of node {})",
                limits.max_subgraph_depth,
                g.name,
                owner.map(crate::node_label).unwrap_or_default()
            );
        }
        *count = count.saturating_add(g.node.len());
        if *count > limits.max_nodes {
            bail!(
                "{what}: more than the limit of {} nodes (main graph and subgraphs)",
                limits.max_nodes
            );
        }
        for n in &g.node {
            for a in &n.attribute {
                for sub in a.g.iter().chain(a.graphs.iter()) {
                    walk(sub, Some(n), depth + 1, count, what, limits)?;
                }
            }
        }
        Ok(())
    }
    let mut count = 0;
    walk(graph, None, 0, &mut count, what, limits)
}

/// Loads the model at `path`: reads and decodes it, resolves external data relative to the
/// model's folder (refusing absolute paths, `..`, and links that lead outside the folder),
/// checks every tensor's data against its dims and `limits`, validates the model
/// ([`crate::validate::validate_model_with`]: structure and operator rules), and refuses
/// tensors the run would create over the limit ([`crate::check_static_allocation`]).
pub fn load_model(path: &Path, limits: &Limits) -> Result<LoadedModel> {
    let what = path.display().to_string();
    let meta = std::fs::metadata(path).with_context(|| format!("{what}: cannot read"))?;
    if !meta.is_file() {
        bail!("{what}: not a file");
    }
    if meta.len() > limits.max_model_bytes {
        bail!(
            "{what}: {} bytes is over the model size limit of {} bytes",
            meta.len(),
            limits.max_model_bytes
        );
    }
    // Mapped, not read: the decoded model's tensors are slices of the file's pages.
    let bytes = crate::mapped::read_path(path, &what)?;
    let dir = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .unwrap_or(Path::new("."));
    let mut model = decode_model_shared(bytes, &what, limits)?;
    let external_files = resolve_external(&mut model, &what, dir, limits)?;
    // Nothing invalid goes further: fusion and tract may hang or exhaust memory on it.
    validate_model_with(&model, limits).with_context(|| what.clone())?;
    // Last, the tensors the run would create with sizes fixed by the file: a 100-byte model
    // can ask for a 4 TB ConstantOfShape, and every user of a loaded model must be safe.
    crate::limits::check_static_allocation(&model, limits).with_context(|| what.clone())?;
    Ok(LoadedModel {
        model,
        path: path.to_path_buf(),
        external_files,
    })
}

/// [`load_model`] on bytes already in memory: decodes them (see [`decode_model`]), reads
/// external data from files inside `dir` only, checks every tensor against its dims and
/// `limits`, validates the model, and runs [`crate::check_static_allocation`]. `what` names the source in error messages. Returns the self-contained model and
/// the external data files read (relative to `dir`, in first-use order).
pub fn load_model_from_bytes(
    bytes: &[u8],
    what: &str,
    dir: &Path,
    limits: &Limits,
) -> Result<(ModelProto, Vec<String>)> {
    let mut model = decode_model(bytes, what, limits)?;
    let files = resolve_external(&mut model, what, dir, limits)?;
    validate_model_with(&model, limits).with_context(|| what.to_string())?;
    crate::limits::check_static_allocation(&model, limits).with_context(|| what.to_string())?;
    Ok((model, files))
}

/// Inlines every external tensor of `model` from files inside `dir` and checks every tensor.
fn resolve_external(
    model: &mut ModelProto,
    what: &str,
    dir: &Path,
    limits: &Limits,
) -> Result<Vec<String>> {
    let mut ctx = ExternalCtx {
        dir,
        model_path: what,
        limits,
        read_bytes: 0,
        files: Vec::new(),
        contents: HashMap::new(),
    };
    let graph = model
        .graph
        .as_mut()
        .expect("decode_model checked the graph");
    resolve_graph(graph, &mut ctx)?;
    for f in &mut model.functions {
        resolve_function(f, &mut ctx)?;
    }
    Ok(ctx.files)
}

struct ExternalCtx<'a> {
    dir: &'a Path,
    model_path: &'a str,
    limits: &'a Limits,
    read_bytes: u64,
    files: Vec<String>,
    /// Each external data file's contents (mapped), by location, read once.
    contents: HashMap<String, Bytes>,
}

fn resolve_graph(g: &mut GraphProto, ctx: &mut ExternalCtx) -> Result<()> {
    let graph_name = g.name.clone();
    for t in &mut g.initializer {
        resolve_tensor(t, ctx)
            .with_context(|| format!("{}: initializer '{}'", ctx.model_path, t.name))?;
    }
    for s in &mut g.sparse_initializer {
        for t in s.values.iter_mut().chain(s.indices.iter_mut()) {
            resolve_tensor(t, ctx)
                .with_context(|| format!("{}: sparse initializer '{}'", ctx.model_path, t.name))?;
        }
    }
    for n in &mut g.node {
        resolve_node(n, ctx).with_context(|| format!("in graph '{graph_name}'"))?;
    }
    Ok(())
}

fn resolve_node(n: &mut NodeProto, ctx: &mut ExternalCtx) -> Result<()> {
    let label = crate::node_label(n);
    for a in &mut n.attribute {
        for t in a.t.iter_mut().chain(a.tensors.iter_mut()) {
            resolve_tensor(t, ctx).with_context(|| {
                format!("{}: node {label}, attribute '{}'", ctx.model_path, a.name)
            })?;
        }
        for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
            resolve_graph(sub, ctx)?;
        }
    }
    Ok(())
}

fn resolve_function(f: &mut FunctionProto, ctx: &mut ExternalCtx) -> Result<()> {
    let name = f.name.clone();
    for n in &mut f.node {
        resolve_node(n, ctx).with_context(|| format!("in function '{name}'"))?;
    }
    Ok(())
}

/// Reads one tensor's external data (if it has any) into `raw_data` and checks the tensor.
fn resolve_tensor(t: &mut TensorProto, ctx: &mut ExternalCtx) -> Result<()> {
    if t.data_location != DataLocation::External as i32 {
        return check_tensor(t, ctx.limits.max_tensor_elements);
    }
    let count = element_count(&t.dims, ctx.limits.max_tensor_elements)?;
    let Some(size) = element_size(t.data_type) else {
        bail!(
            "external data of type {} is not supported",
            type_name(t.data_type)
        );
    };
    let expected = count
        .checked_mul(size as u64)
        .context("tensor byte size overflows")?;
    let mut location = None;
    let mut offset: u64 = 0;
    let mut length: Option<u64> = None;
    for e in &t.external_data {
        match e.key.as_str() {
            "location" => location = Some(e.value.clone()),
            "offset" => {
                offset = e.value.parse().with_context(|| {
                    format!("external data offset '{}' is not a number", e.value)
                })?
            }
            "length" => {
                length = Some(e.value.parse().with_context(|| {
                    format!("external data length '{}' is not a number", e.value)
                })?)
            }
            _ => {}
        }
    }
    let location = location.context("external data without a 'location'")?;
    let length = length.unwrap_or(expected);
    if length != expected {
        bail!(
            "external data length {length} does not match the {expected} bytes its dims {:?} of {} need",
            t.dims,
            type_name(t.data_type)
        );
    }
    if ctx.read_bytes.saturating_add(length) > ctx.limits.max_external_bytes {
        bail!(
            "external data totals more than the limit of {} bytes",
            ctx.limits.max_external_bytes
        );
    }
    let data = external_file(ctx, &location)?;
    let file_len = data.len() as u64;
    if offset.checked_add(length).is_none_or(|end| end > file_len) {
        bail!(
            "external data '{location}': offset {offset} + length {length} is past the end of the file ({file_len} bytes)"
        );
    }
    ctx.read_bytes += length;
    if !ctx.files.contains(&location) {
        ctx.files.push(location);
    }
    // A slice of the mapped file: no copy.
    t.raw_data = data.slice(offset as usize..(offset + length) as usize);
    t.external_data.clear();
    t.data_location = DataLocation::Default as i32;
    Ok(())
}

/// The contents of the external data file at `location` (confined to the model's folder),
/// mapped on first use and shared by every tensor stored in it.
fn external_file(ctx: &mut ExternalCtx, location: &str) -> Result<Bytes> {
    if let Some(data) = ctx.contents.get(location) {
        return Ok(data.clone());
    }
    let file = confined_path(ctx.dir, location)?;
    let f = File::open(&file)
        .with_context(|| format!("cannot open external data file '{location}'"))?;
    let file_len = f
        .metadata()
        .with_context(|| format!("cannot stat external data file '{location}'"))?
        .len();
    let data = crate::mapped::file_bytes(f, file_len, &format!("external data file '{location}'"))?;
    ctx.contents.insert(location.to_string(), data.clone());
    Ok(data)
}

/// Resolves an external data `location` inside `dir`: it must be a relative path without
/// `..`, and after following links it must still lie inside `dir`.
pub fn confined_path(dir: &Path, location: &str) -> Result<PathBuf> {
    let rel = Path::new(location);
    if location.is_empty() {
        bail!("external data location is empty");
    }
    if location.contains('\0') {
        bail!("external data location contains a NUL byte");
    }
    if rel.is_absolute() || location.starts_with('/') || location.starts_with('\\') {
        bail!("external data location '{location}' is absolute; it must be relative to the model's folder");
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                bail!("external data location '{location}' contains '..'; it must stay inside the model's folder")
            }
            Component::RootDir | Component::Prefix(_) => {
                bail!("external data location '{location}' is absolute")
            }
        }
    }
    let base = dir
        .canonicalize()
        .with_context(|| format!("cannot resolve the model's folder {}", dir.display()))?;
    let joined = base.join(rel);
    let real = joined
        .canonicalize()
        .with_context(|| format!("external data file '{location}' not found next to the model"))?;
    if !real.starts_with(&base) {
        bail!(
            "external data location '{location}' leads outside the model's folder (to {})",
            real.display()
        );
    }
    if !real.is_file() {
        bail!("external data location '{location}' is not a file");
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confined_path_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("w.bin"), [0u8; 8]).unwrap();
        assert!(confined_path(dir.path(), "w.bin").is_ok());
        assert!(confined_path(dir.path(), "./w.bin").is_ok());
        for bad in ["/etc/passwd", "../w.bin", "a/../../w.bin", ""] {
            assert!(confined_path(dir.path(), bad).is_err(), "{bad}");
        }
        #[cfg(unix)]
        {
            let outside = tempfile::tempdir().unwrap();
            std::fs::write(outside.path().join("secret"), [1u8; 8]).unwrap();
            std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link"))
                .unwrap();
            let err = confined_path(dir.path(), "link").unwrap_err().to_string();
            assert!(err.contains("outside the model's folder"), "{err}");
        }
    }
}
