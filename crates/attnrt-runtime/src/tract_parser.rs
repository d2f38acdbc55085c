//! tract-onnx's own parser for an op type, kept when attnrt registers its parser in its place:
//! attnrt's parsers call it for the shape rules and the expansion they fall back to.

use std::sync::OnceLock;

use tract_onnx::model::{OnnxOpRegister, ParsingContext};
use tract_onnx::pb::NodeProto;
use tract_onnx::tract_hir::internal::*;

/// An ONNX parser as tract-onnx registers them.
pub(crate) type Parser =
    fn(&ParsingContext, &NodeProto) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)>;

/// What [`Kept::parse`] returns: tract's op, the extra outputs it names, and its expansion
/// (when tract expands the op).
pub(crate) type Parsed = (
    Box<dyn InferenceOp>,
    Vec<String>,
    Option<Box<dyn Expansion>>,
);

/// One op type's parser from tract, kept in `slot`.
pub(crate) struct Kept {
    op_type: &'static str,
    slot: OnceLock<Parser>,
}

impl Kept {
    /// An empty slot for `op_type`'s parser.
    pub(crate) const fn new(op_type: &'static str) -> Self {
        Kept {
            op_type,
            slot: OnceLock::new(),
        }
    }

    /// Keeps tract's parser of the op type and registers `ours` in its place (nothing when
    /// tract has none). Every registry tract-onnx builds holds the same parser, so the first
    /// one kept serves all.
    pub(crate) fn replace(&'static self, ops: &mut OnnxOpRegister, ours: Parser) {
        if let Some(&tract) = ops.0.get(self.op_type) {
            let _ = self.slot.set(tract);
            ops.insert(self.op_type, ours);
        }
    }

    /// tract's parse of `node`, and its expansion when tract expands the op.
    pub(crate) fn parse(&self, ctx: &ParsingContext, node: &NodeProto) -> TractResult<Parsed> {
        let tract = self
            .slot
            .get()
            .with_context(|| format!("tract's {} parser was not kept", self.op_type))?;
        let (op, extra) = tract(ctx, node)?;
        let expansion = op.as_op().downcast_ref::<Box<dyn Expansion>>().cloned();
        Ok((op, extra, expansion))
    }
}
