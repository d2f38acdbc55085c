//! attnrt's parser for one ONNX op type, registered in tract-onnx's op register in place of
//! tract's, with tract's own parser kept: attnrt's parsers that wrap tract's op call it for the
//! shape rules and the expansion they fall back to. The one way attnrt registers a parser (the
//! op registry, `registry.rs`, lists every one).

use std::sync::OnceLock;

use tract_onnx::model::{OnnxOpRegister, ParsingContext};
use tract_onnx::pb::NodeProto;
use tract_onnx::tract_hir::internal::*;

/// An ONNX parser as tract-onnx registers them.
pub(crate) type Parser =
    fn(&ParsingContext, &NodeProto) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)>;

/// What [`OnnxParser::parse_as_tract`] returns: tract's op, the extra outputs it names, and its
/// expansion (when tract expands the op).
pub(crate) type Parsed = (
    Box<dyn InferenceOp>,
    Vec<String>,
    Option<Box<dyn Expansion>>,
);

/// attnrt's parser of one op type, and the slot where tract's is kept when it is replaced.
pub(crate) struct OnnxParser {
    /// The ONNX op type (tract-onnx's register is keyed by op type only: every node of this
    /// type, whatever its domain, is parsed here).
    pub(crate) op_type: &'static str,
    /// attnrt's parser.
    pub(crate) ours: Parser,
    tract: OnceLock<Parser>,
}

impl OnnxParser {
    /// attnrt's parser `ours` for `op_type`, not registered yet.
    pub(crate) const fn new(op_type: &'static str, ours: Parser) -> Self {
        OnnxParser {
            op_type,
            ours,
            tract: OnceLock::new(),
        }
    }

    /// Keeps tract's parser of the op type (when tract has one) and registers attnrt's in its
    /// place. Every register tract-onnx builds holds the same parser, so the first one kept
    /// serves all.
    pub(crate) fn register(&'static self, ops: &mut OnnxOpRegister) {
        if let Some(&tract) = ops.0.get(self.op_type) {
            let _ = self.tract.set(tract);
        }
        ops.insert(self.op_type, self.ours);
    }

    /// tract's parse of `node`, and its expansion when tract expands the op.
    pub(crate) fn parse_as_tract(
        &self,
        ctx: &ParsingContext,
        node: &NodeProto,
    ) -> TractResult<Parsed> {
        let tract = self
            .tract
            .get()
            .with_context(|| format!("tract's {} parser was not kept", self.op_type))?;
        let (op, extra) = tract(ctx, node)?;
        let expansion = op.as_op().downcast_ref::<Box<dyn Expansion>>().cloned();
        Ok((op, extra, expansion))
    }

    /// tract's parse of `node` with its expansion wrapped by the [`Wrapper`] `wrapper` makes
    /// (attnrt's checks and wiring around tract's rules and expansion); an op tract does not
    /// expand is kept as tract made it, and `wrapper` is not called.
    pub(crate) fn wrap_expansion<W: Wrapper>(
        &self,
        ctx: &ParsingContext,
        node: &NodeProto,
        wrapper: impl FnOnce() -> TractResult<W>,
    ) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
        let (op, extra, expansion) = self.parse_as_tract(ctx, node)?;
        match expansion {
            Some(tract) => {
                let wrapper = wrapper()?;
                Ok((expand(Wrapped { wrapper, tract }), extra))
            }
            None => Ok((op, extra)),
        }
    }
}

/// attnrt's part of an op whose parser wraps tract's expansion ([`OnnxParser::wrap_expansion`]):
/// checks made before tract's shape rules, and how the node is wired, given tract's expansion
/// (attnrt's op in its place, a check in front of it, or tract's alone).
pub(crate) trait Wrapper: std::fmt::Debug + Clone + Send + Sync + 'static {
    /// The parsed op's name.
    fn name(&self) -> StaticName;

    /// Rules checked before tract's (none unless a wrapper has some).
    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        _s: &mut Solver<'r>,
        _inputs: &'p [TensorProxy],
    ) -> InferenceResult {
        Ok(())
    }

    /// The node's shape rules: [`Wrapper::rules`] then tract's (`tract`), unless a wrapper
    /// states its own in their place (where tract's cannot be solved).
    fn all_rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        tract: &'s dyn Expansion,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        self.rules(s, inputs)?;
        tract.rules(s, inputs, outputs)
    }

    /// Wires the node into `model`; `tract` is tract's expansion of it.
    fn wire(
        &self,
        tract: &dyn Expansion,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>>;
}

/// The wrapper of `op` when `op` is a [`Wrapper`] of type `W` around tract's expansion (as
/// [`OnnxParser::wrap_expansion`] parses it).
pub(crate) fn wrapper_of<W: Wrapper>(op: &dyn InferenceOp) -> Option<&W> {
    let expansion = op.as_op().downcast_ref::<Box<dyn Expansion>>()?;
    let wrapped = expansion.as_any().downcast_ref::<Wrapped<W>>()?;
    Some(&wrapped.wrapper)
}

/// A [`Wrapper`] around tract's expansion: tract's outputs, the wrapper's shape rules
/// ([`Wrapper::all_rules`]: tract's after its own checks, unless it replaces them) and wiring.
#[derive(Debug, Clone)]
struct Wrapped<W> {
    wrapper: W,
    tract: Box<dyn Expansion>,
}

impl<W: Wrapper> Expansion for Wrapped<W> {
    fn name(&self) -> StaticName {
        self.wrapper.name()
    }

    fn nboutputs(&self) -> TractResult<usize> {
        Expansion::nboutputs(&*self.tract)
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        self.wrapper.all_rules(&*self.tract, s, inputs, outputs)
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        self.wrapper.wire(&*self.tract, prefix, model, inputs)
    }
}

/// A node's `axis` attribute counted from 0 when inside `[-rank, rank)` of the input it indexes
/// (`of`, e.g. "X"), else the error ONNX's shape inference gives, naming the node (`op_type`,
/// `node`). Checked by attnrt's parsers before tract's shape rules see the axis (they do not end
/// for an axis far outside the rank).
pub(crate) fn axis_in_rank(
    op_type: &str,
    node: &str,
    axis: i64,
    rank: usize,
    of: &str,
) -> TractResult<usize> {
    let r = rank as i64;
    if !(-r..r).contains(&axis) {
        bail!("{op_type} node '{node}': axis {axis} is outside [-{r}, {r}), the rank of {of}");
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}
