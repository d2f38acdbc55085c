//! Saving a model atomically: write to a temporary file in the destination folder, sync, then
//! rename over the destination, so a reader never sees a partial model. The model is encoded
//! straight into the file and external data is written from the tensors' own bytes, so saving
//! holds no second copy of the weights.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use prost::Message;

use crate::proto::{
    tensor_proto::DataLocation, GraphProto, ModelProto, StringStringEntryProto, TensorProto,
};

/// How to save a model.
#[derive(Debug, Clone, Default)]
pub struct SaveOptions {
    /// Move tensors whose data has at least this many bytes to one external data file
    /// beside the model (named `<model file name>.data`). `None` keeps everything inline.
    pub external_threshold: Option<usize>,
    /// Skip the structural validation that otherwise refuses to write an invalid model.
    pub skip_validation: bool,
}

/// The largest protobuf a reader can parse (2 GiB - 1); larger models need external data.
const PROTOBUF_MAX: usize = i32::MAX as usize;

/// Writes `model` to `path` atomically. Refuses a model that fails [`crate::validate_model`]
/// unless told otherwise, and never leaves a partial file behind on error.
pub fn save_model(model: &ModelProto, path: &Path, options: &SaveOptions) -> Result<()> {
    let what = path.display().to_string();
    if !options.skip_validation {
        crate::validate_model(model)
            .with_context(|| format!("refusing to write {what}: the model is not valid"))?;
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .with_context(|| format!("{what}: not a file path"))?
        .to_string_lossy()
        .into_owned();

    // A clone shares every tensor's bytes (`raw_data` is a `Bytes`): no weight is copied.
    let mut model = model.clone();
    let mut data_file = None;
    if let Some(threshold) = options.external_threshold {
        let location = format!("{file_name}.data");
        let mut blob = Blob::default();
        if let Some(g) = model.graph.as_mut() {
            externalize_graph(g, threshold, &location, &mut blob);
        }
        if !blob.pieces.is_empty() {
            data_file = Some((dir.join(&location), blob));
        }
    }
    let size = model.encoded_len();
    if size > PROTOBUF_MAX {
        bail!(
            "{what}: the model is {size} bytes, over the 2 GiB protobuf limit; save with external data"
        );
    }
    let mut written_data = None;
    if let Some((data_path, blob)) = &data_file {
        write_atomic_with(data_path, |w| blob.write_to(w))?;
        written_data = Some(data_path.clone());
    }
    // Streamed into the file: the encoded model is never held in memory whole.
    let written = write_atomic_with(path, |w| {
        let mut out = crate::stream::WriteBuf::new(w);
        model
            .encode(&mut out)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        out.finish()
    });
    if let Err(e) = written {
        if let Some(p) = written_data {
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// Writes what `write` writes to `path` through a temporary file in the same folder and a
/// rename (buffered; synced before the rename).
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let what = path.display();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".attnrt-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| {
            format!(
                "{what}: cannot create a temporary file in {}",
                dir.display()
            )
        })?;
    {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
        write(&mut out)
            .and_then(|_| out.flush())
            .with_context(|| format!("{what}: cannot write"))?;
    }
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("{what}: cannot write"))?;
    tmp.persist(path)
        .map_err(|e| anyhow::anyhow!("{what}: cannot replace the file: {}", e.error))?;
    Ok(())
}

/// The external data file being laid out: each tensor's bytes (shared, not copied) at its
/// offset, each offset aligned to 4 KiB so readers may map it.
#[derive(Default)]
struct Blob {
    pieces: Vec<(u64, Bytes)>,
    len: u64,
}

impl Blob {
    /// Places `data` at the next aligned offset and returns that offset.
    fn push(&mut self, data: Bytes) -> u64 {
        let offset = self.len.div_ceil(4096) * 4096;
        self.len = offset + data.len() as u64;
        self.pieces.push((offset, data));
        offset
    }

    /// Writes the file: each piece after the zeros that pad it to its offset.
    fn write_to(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let zeros = [0u8; 4096];
        let mut at = 0u64;
        for (offset, data) in &self.pieces {
            w.write_all(&zeros[..(offset - at) as usize])?;
            w.write_all(data)?;
            crate::mapped::release(data);
            at = offset + data.len() as u64;
        }
        Ok(())
    }
}

fn externalize_graph(g: &mut GraphProto, threshold: usize, location: &str, blob: &mut Blob) {
    for t in &mut g.initializer {
        externalize_tensor(t, threshold, location, blob);
    }
    for n in &mut g.node {
        for a in &mut n.attribute {
            for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                externalize_graph(sub, threshold, location, blob);
            }
        }
    }
}

fn externalize_tensor(t: &mut TensorProto, threshold: usize, location: &str, blob: &mut Blob) {
    if t.raw_data.len() < threshold || t.raw_data.is_empty() {
        return;
    }
    let data = std::mem::take(&mut t.raw_data);
    let length = data.len();
    let offset = blob.push(data);
    let entry = |k: &str, v: String| StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    t.external_data = vec![
        entry("location", location.to_string()),
        entry("offset", offset.to_string()),
        entry("length", length.to_string()),
    ];
    t.data_location = DataLocation::External as i32;
}
