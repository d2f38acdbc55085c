//! Raising a model's default-domain opset so it may hold the `Attention` op (opset 23).
//!
//! The single place fusion calls; the conversion itself (Reduce* `axes` attribute → input and
//! Split `num_outputs` at 18, refusals naming the node for ops whose meaning changed) is
//! `attnrt_onnx::opset::upgrade_to`.

use anyhow::Result;
use attnrt_onnx::ModelProto;

pub use attnrt_onnx::opset::UpgradeReport;

/// Returns a copy of `model` with its default-domain opset raised to at least `target`,
/// converting the nodes whose signature changed; errors name the node that cannot be
/// converted (the input is never modified).
pub fn raise_opset(model: &ModelProto, target: i64) -> Result<(ModelProto, UpgradeReport)> {
    let mut out = model.clone();
    let report = attnrt_onnx::opset::upgrade_to(&mut out, target)?;
    Ok((out, report))
}
