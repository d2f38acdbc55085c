//! ONNX `Gather` with its indices checked: tract's `Gather` indexes its data without a bounds
//! check, so an index past the gathered axis (a token id beyond the vocabulary, a position
//! beyond the position table, inputs whose batch sizes disagree) panics inside tract. ONNX
//! Runtime reports such an index as an error naming the node; so does attnrt, through
//! [`CheckedGather`], which checks every index against the axis and then runs tract's op.
//!
//! Indices that are constants once the graph is typed are checked once, when the graph is
//! decluttered, and the node becomes tract's own `Gather` (which tract may fold into a slice);
//! only indices computed at run time (embedding lookups) are checked on every run, one pass
//! over a few integers.

use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::array::{Gather, GatherElements};
use tract_onnx::tract_core::ops::cast::cast;
use tract_onnx::tract_hir::internal::*;

use crate::tract_parser::{axis_in_rank, OnnxParser, Wrapper};

/// The name under which [`CheckedGather`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtGather";

/// attnrt's `Gather` parser, wrapping tract's (registered by the op registry in every session,
/// whatever its switches: an unchecked index is a panic, never a choice).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("Gather", parse_rows);

/// The same for `GatherElements`, whose tract op indexes without a bounds check too.
pub(crate) static ELEMENTS_PARSER: OnnxParser = OnnxParser::new("GatherElements", parse_elements);

fn parse_rows(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parse(&PARSER, ctx, node)
}

fn parse_elements(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parse(&ELEMENTS_PARSER, ctx, node)
}

fn parse(
    parser: &'static OnnxParser,
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parser.wrap_expansion(ctx, node, || {
        Ok(GatherRows {
            op_type: parser.op_type,
            node: node.name.clone(),
            axis: node.get_attr_opt("axis")?.unwrap_or(0),
        })
    })
}

/// The parsed `Gather`: tract's shape rules, wired as [`CheckedGather`].
#[derive(Debug, Clone)]
struct GatherRows {
    /// `Gather` or `GatherElements`.
    op_type: &'static str,
    node: String,
    axis: i64,
}

impl Wrapper for GatherRows {
    fn name(&self) -> StaticName {
        "AttnrtGatherRows".into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
    ) -> InferenceResult {
        check_input_arity(inputs, 2)?;
        s.given(&inputs[0].rank, move |_, rank| {
            axis_in_rank(
                self.op_type,
                &self.node,
                self.axis,
                rank as usize,
                "its data",
            )
            .map(drop)
        })
    }

    fn wire(
        &self,
        _tract: &dyn Expansion,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let rank = model.outlet_fact(inputs[0])?.rank();
        let axis = axis_in_rank(self.op_type, &self.node, self.axis, rank, "its data")?;
        let indices = model.wire_node(
            format!("{prefix}.cast_to_i64"),
            cast(i64::datum_type()),
            &[inputs[1]],
        )?[0];
        let gather = match self.op_type {
            "GatherElements" => Gathered::Elements(GatherElements::new(axis)),
            _ => Gathered::Rows(Gather::new(axis)),
        };
        let op = CheckedGather {
            node: self.node.clone(),
            gather,
        };
        model.wire_node(prefix, op, &[inputs[0], indices])
    }
}

/// tract's `Gather`, run after checking that every index lies in `[-n, n)` for the extent `n`
/// of the gathered axis.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckedGather {
    /// ONNX node name, for errors.
    pub node: String,
    gather: Gathered,
}

/// The tract op a [`CheckedGather`] runs once the indices are checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Gathered {
    /// ONNX `Gather`: whole slices of the data along the axis.
    Rows(Gather),
    /// ONNX `GatherElements`: one element per index.
    Elements(GatherElements),
}

impl Gathered {
    fn axis(&self) -> usize {
        match self {
            Gathered::Rows(g) => g.axis,
            Gathered::Elements(g) => g.axis,
        }
    }

    fn op_type(&self) -> &'static str {
        match self {
            Gathered::Rows(_) => "Gather",
            Gathered::Elements(_) => "GatherElements",
        }
    }

    fn typed(&self) -> Box<dyn TypedOp> {
        match self {
            Gathered::Rows(g) => Box::new(g.clone()),
            Gathered::Elements(g) => Box::new(g.clone()),
        }
    }
}

impl CheckedGather {
    fn check(&self, indices: &Tensor, extent: usize) -> TractResult<()> {
        let (op_type, axis) = (self.gather.op_type(), self.gather.axis());
        check_indices(op_type, &self.node, axis, indices, extent)
    }
}

/// Refuses the first of the int64 `indices` outside `[-extent, extent)`, naming `op_type`'s
/// node `node` and the gathered `axis`.
pub(crate) fn check_indices(
    op_type: &str,
    node: &str,
    axis: usize,
    indices: &Tensor,
    extent: usize,
) -> TractResult<()> {
    let n = extent as i64;
    let bad = indices
        .try_as_plain_ram()?
        .as_slice::<i64>()?
        .iter()
        .find(|&&i| !(-n..n).contains(&i));
    match bad {
        Some(i) => bail!(
            "{op_type} node '{node}': index {i} is outside [-{n}, {n}), the extent of axis {axis} of its data"
        ),
        None => Ok(()),
    }
}

/// The ONNX node name of `node` when it is a `Gather` of whole rows (axis 0 of data of `rank`)
/// reading its data from input `slot`: an embedding lookup, if that data is a table.
pub(crate) fn row_gather(node: &InferenceNode, slot: usize, rank: usize) -> Option<String> {
    let rows = crate::tract_parser::wrapper_of::<GatherRows>(&*node.op)?;
    let row_axis = rows.axis == 0 || rows.axis == -(rank as i64);
    (rows.op_type == "Gather" && row_axis && slot == 0 && node.inputs.len() == 2)
        .then(|| rows.node.clone())
}

impl Op for CheckedGather {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: axis {}",
            self.node,
            self.gather.axis()
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for CheckedGather {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let extent = inputs[0].shape()[self.gather.axis()];
        self.check(&inputs[1], extent)?;
        match &self.gather {
            Gathered::Rows(g) => EvalOp::eval(g, ctx, inputs),
            Gathered::Elements(g) => EvalOp::eval(g, ctx, inputs),
        }
    }
}

impl TypedOp for CheckedGather {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        self.gather.typed().output_facts(inputs)
    }

    /// Constant indices are checked here, once; the node then becomes tract's `Gather`.
    fn declutter(
        &self,
        model: &TypedModel,
        node: &TypedNode,
    ) -> TractResult<Option<TypedModelPatch>> {
        let data = model.outlet_fact(node.inputs[0])?;
        let indices = model.outlet_fact(node.inputs[1])?;
        let (Some(konst), Ok(extent)) = (&indices.konst, data.shape[self.gather.axis()].to_usize())
        else {
            return Ok(None);
        };
        self.check(konst, extent)?;
        TypedModelPatch::replace_single_op(model, node, &node.inputs, self.gather.typed()).map(Some)
    }
}
