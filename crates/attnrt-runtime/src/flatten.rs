//! ONNX `Flatten` with symbolic dimensions on both sides of its axis: tract's shape rule refuses
//! an input with more than one symbolic dimension ("square of symbols"), so a TorchScript
//! decoder, which flattens its `[batch, total length]` attention mask, cannot be planned with
//! its batch and its lengths both symbolic. The output is `[product of the dimensions before the
//! axis, product of those from it]`, exact with symbols (a product of symbols is a dimension
//! tract plans with), wired as tract's expansion wires it (the same axis ops, for that shape).

use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::tract_core::ops::change_axes::to_axis_ops_with_tf_rules;
use tract_onnx::tract_hir::internal::*;

use crate::tract_parser::{OnnxParser, Wrapper};

/// The name of the parsed node before wiring; it is gone from planned graphs (tract's reshapes
/// take its place).
pub(crate) const OP_NAME: &str = "AttnrtFlatten";

/// attnrt's `Flatten` parser, wrapping tract's (registered in every session).
pub(crate) static PARSER: OnnxParser = OnnxParser::new("Flatten", parse);

fn parse(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let axis = node.get_attr_opt("axis")?.unwrap_or(1);
    PARSER.wrap_expansion(ctx, node, || {
        Ok(Flatten {
            node: node.name.clone(),
            axis,
        })
    })
}

/// The parsed `Flatten`: its own shape rules in place of tract's, and tract's wiring for the
/// output shape they give.
#[derive(Debug, Clone)]
struct Flatten {
    /// ONNX node name, for errors.
    node: String,
    /// The `axis` attribute as given (ONNX allows `[-rank, rank]`).
    axis: i64,
}

impl Flatten {
    /// The axis counted from 0, or an error naming the node when it is outside `[-rank, rank]`.
    fn axis_from_0(&self, rank: usize) -> TractResult<usize> {
        let r = rank as i64;
        if !(-r..=r).contains(&self.axis) {
            bail!(
                "Flatten node '{}': axis {} is outside [-{r}, {r}], the rank of its input",
                self.node,
                self.axis
            );
        }
        Ok(if self.axis < 0 {
            self.axis + r
        } else {
            self.axis
        } as usize)
    }

    /// The output shape of an input of shape `shape`.
    fn output_shape<D: DimLike>(&self, shape: &[D]) -> TractResult<[D; 2]> {
        let axis = self.axis_from_0(shape.len())?;
        Ok([
            shape[..axis].iter().cloned().product(),
            shape[axis..].iter().cloned().product(),
        ])
    }
}

impl Wrapper for Flatten {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn all_rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        _tract: &'s dyn Expansion,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        check_input_arity(inputs, 1)?;
        check_output_arity(outputs, 1)?;
        s.equals(&outputs[0].datum_type, &inputs[0].datum_type)?;
        s.equals(&outputs[0].rank, 2)?;
        s.given(&inputs[0].shape, move |s, shape| {
            let [rows, columns] = self.output_shape(&shape)?;
            s.equals(&outputs[0].shape, ShapeFactoid::from(vec![rows, columns]))
        })
    }

    fn wire(
        &self,
        _tract: &dyn Expansion,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let shape = model.outlet_fact(inputs[0])?.shape.to_tvec();
        let output = self.output_shape(&shape)?;
        let mut wire = tvec!(inputs[0]);
        for (ix, op) in to_axis_ops_with_tf_rules(&shape, &output)?
            .into_iter()
            .enumerate()
        {
            wire = model.wire_node(format!("{prefix}.{ix}"), op, &wire)?;
        }
        Ok(wire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flatten(axis: i64) -> Flatten {
        Flatten {
            node: "f".into(),
            axis,
        }
    }

    #[test]
    fn symbols_on_both_sides_of_the_axis_multiply() {
        let table = SymbolScope::default();
        let (b, s) = (table.sym("B"), table.sym("S"));
        let shape = [TDim::from(b.clone()), TDim::from(s.clone()), 4.into()];
        let [rows, columns] = flatten(1).output_shape(&shape).unwrap();
        assert_eq!(rows, TDim::from(b.clone()));
        assert_eq!(columns, TDim::from(s.clone()) * 4);
        let [rows, columns] = flatten(0).output_shape(&shape).unwrap();
        assert_eq!(rows, 1.into());
        assert_eq!(columns, TDim::from(b) * TDim::from(s) * 4);
        let [rows, columns] = flatten(-1).output_shape(&[2usize, 3, 5]).unwrap();
        assert_eq!((rows, columns), (6, 5));
        let [rows, columns] = flatten(3).output_shape(&[2usize, 3, 5]).unwrap();
        assert_eq!((rows, columns), (30, 1));
    }

    #[test]
    fn an_axis_outside_the_rank_is_an_error_naming_the_node() {
        let e = flatten(4).output_shape(&[2usize, 3, 5]).unwrap_err();
        assert!(format!("{e}").contains("Flatten node 'f': axis 4"), "{e}");
        assert!(flatten(-4).output_shape(&[2usize, 3, 5]).is_err());
    }
}
