//! Saving a model atomically: write to a temporary file in the destination folder, sync, then
//! rename over the destination, so a reader never sees a partial model.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
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

    let mut model = model.clone();
    let mut data_file = None;
    if let Some(threshold) = options.external_threshold {
        let location = format!("{file_name}.data");
        let mut blob = Vec::new();
        if let Some(g) = model.graph.as_mut() {
            externalize_graph(g, threshold, &location, &mut blob);
        }
        if !blob.is_empty() {
            data_file = Some((dir.join(&location), blob));
        }
    }
    let bytes = model.encode_to_vec();
    if bytes.len() > PROTOBUF_MAX {
        bail!(
            "{what}: the model is {} bytes, over the 2 GiB protobuf limit; save with external data",
            bytes.len()
        );
    }
    let mut written_data = None;
    if let Some((data_path, blob)) = &data_file {
        write_atomic(data_path, blob)?;
        written_data = Some(data_path.clone());
    }
    if let Err(e) = write_atomic(path, &bytes) {
        if let Some(p) = written_data {
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
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
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("{what}: cannot write"))?;
    tmp.persist(path)
        .map_err(|e| anyhow::anyhow!("{what}: cannot replace the file: {}", e.error))?;
    Ok(())
}

fn externalize_graph(g: &mut GraphProto, threshold: usize, location: &str, blob: &mut Vec<u8>) {
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

fn externalize_tensor(t: &mut TensorProto, threshold: usize, location: &str, blob: &mut Vec<u8>) {
    if t.raw_data.len() < threshold || t.raw_data.is_empty() {
        return;
    }
    // Align each tensor to 4 KiB so readers may map it.
    let pad = (4096 - blob.len() % 4096) % 4096;
    blob.resize(blob.len() + pad, 0);
    let offset = blob.len();
    let data = std::mem::take(&mut t.raw_data);
    blob.extend_from_slice(&data);
    let entry = |k: &str, v: String| StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    t.external_data = vec![
        entry("location", location.to_string()),
        entry("offset", offset.to_string()),
        entry("length", data.len().to_string()),
    ];
    t.data_location = DataLocation::External as i32;
}
