//! ONNX `Mul` of a tensor by a symbolic constant (a dimension the graph read with `Shape`, e.g.
//! `arange(batch) * total_length`, a TorchScript decoder's offsets into its flattened mask):
//! tract's simplification of a product by a uniform operand reads the operand as a number and
//! fails on an unbound symbol, so such a graph cannot be planned with that dimension open. The
//! dimension operands are cast to `i64` in front of tract's op (the cast evaluates a dimension
//! when the plan runs, its symbols bound by the inputs' shapes), the product is tract's, and
//! it is cast back to dimensions, the node's type.

use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::cast::cast;
use tract_onnx::tract_hir::internal::*;

use crate::tract_parser::{OnnxParser, Wrapper};

/// The name of the parsed node before wiring; it is gone from planned graphs (tract's cast and
/// product take its place).
pub(crate) const OP_NAME: &str = "AttnrtMul";

/// attnrt's `Mul` parser, wrapping tract's (registered in every session).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("Mul", parse);

fn parse(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    PARSER.wrap_expansion(ctx, node, || Ok(SymbolicProduct))
}

/// The parsed `Mul`: tract's shape rules and expansion; when one operand is a symbolic
/// constant and the other is not constant, the dimensions cast to `i64` in front of tract's
/// product, and the product cast back to dimensions (the node's type in tract's rules).
#[derive(Debug, Clone)]
struct SymbolicProduct;

/// Whether `fact` is a constant of dimensions at least one of which is symbolic.
fn symbolic_constant(fact: &TypedFact) -> bool {
    fact.datum_type == TDim::datum_type()
        && fact
            .konst
            .as_ref()
            .is_some_and(|k| k.cast_to_dt(i64::datum_type()).is_err())
}

impl Wrapper for SymbolicProduct {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn wire(
        &self,
        tract: &dyn Expansion,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let facts = inputs
            .iter()
            .map(|&i| model.outlet_fact(i).cloned())
            .collect::<TractResult<Vec<_>>>()?;
        let all_constant = facts.iter().all(|f| f.konst.is_some());
        if all_constant || !facts.iter().any(symbolic_constant) {
            return tract.wire(prefix, model, inputs);
        }
        let mut wires: TVec<OutletId> = inputs.into();
        for (ix, fact) in facts.iter().enumerate() {
            if fact.datum_type == TDim::datum_type() {
                let name = format!("{prefix}.evaluated.{ix}");
                wires[ix] = model.wire_node(name, cast(i64::datum_type()), &[wires[ix]])?[0];
            }
        }
        let product = tract.wire(&format!("{prefix}.product"), model, &wires)?;
        // the node's type is tract's for a product of dimensions
        model.wire_node(prefix, cast(TDim::datum_type()), &product)
    }
}
