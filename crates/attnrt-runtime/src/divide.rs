//! ONNX `Div` and `Mod` on integers with their operands checked: tract divides integers with
//! Rust's `/` and `%`, which panic on a zero divisor and on the one quotient that overflows
//! (`MIN / -1` of a signed type). ONNX leaves both undefined; attnrt refuses them with an error
//! naming the node, through [`CheckedDivision`], which checks the pair of operands each element
//! of the result divides and then hands them, unchanged, to tract's op.
//!
//! A constant divisor with neither 0 nor -1 in it is checked once, when the graph is
//! decluttered, and the check leaves the graph; floating-point division is IEEE's (0 gives an
//! infinity or a NaN) and gets no check.

use tract_onnx::model::ParsingContext;
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::broadcast::multi_broadcast;
use tract_onnx::tract_core::ndarray::IxDyn;
use tract_onnx::tract_hir::internal::*;

use crate::tract_parser::{OnnxParser, Wrapper};

/// Calls `$f::<T>($args)` for the Rust type `T` of the integer datum type `$dt`, else `$other`.
macro_rules! by_integer {
    ($dt:expr, $f:ident($($arg:expr),*), $other:expr) => {
        match $dt {
            DatumType::I8 => $f::<i8>($($arg),*),
            DatumType::I16 => $f::<i16>($($arg),*),
            DatumType::I32 => $f::<i32>($($arg),*),
            DatumType::I64 => $f::<i64>($($arg),*),
            DatumType::U8 => $f::<u8>($($arg),*),
            DatumType::U16 => $f::<u16>($($arg),*),
            DatumType::U32 => $f::<u32>($($arg),*),
            DatumType::U64 => $f::<u64>($($arg),*),
            _ => $other,
        }
    };
}

/// The name under which [`CheckedDivision`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtCheckedDivision";

/// attnrt's `Div` parser, wrapping tract's (registered in every session: a panic is never a
/// choice).
pub(crate) static DIV: OnnxParser = OnnxParser::new("Div", parse_div);

/// attnrt's `Mod` parser, wrapping tract's.
pub(crate) static MOD: OnnxParser = OnnxParser::new("Mod", parse_mod);

fn parse_div(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parse(&DIV, ctx, node)
}

fn parse_mod(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parse(&MOD, ctx, node)
}

fn parse(
    parser: &'static OnnxParser,
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    parser.wrap_expansion(ctx, node, || {
        Ok(Division {
            check: CheckedDivision {
                op_type: parser.op_type,
                node: node.name.clone(),
            },
        })
    })
}

/// The parsed `Div` or `Mod`: tract's shape rules and expansion, wired behind a
/// [`CheckedDivision`] of its operands when they are integers.
#[derive(Debug, Clone)]
struct Division {
    check: CheckedDivision,
}

impl Wrapper for Division {
    fn name(&self) -> StaticName {
        format!("Attnrt{}", self.check.op_type).into()
    }

    fn wire(
        &self,
        tract: &dyn Expansion,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let integers = inputs.len() == 2
            && inputs.iter().all(|&i| {
                model
                    .outlet_fact(i)
                    .is_ok_and(|f| f.datum_type.is_integer())
            });
        if !integers {
            return tract.wire(prefix, model, inputs);
        }
        let checked = model.wire_node(format!("{prefix}.checked"), self.check.clone(), inputs)?;
        tract.wire(prefix, model, &checked)
    }
}

/// Passes an integer division's two operands through after checking that no element of the
/// result would divide by zero or overflow (`MIN / -1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckedDivision {
    /// `Div` or `Mod`.
    pub op_type: &'static str,
    /// ONNX node name, for errors.
    pub node: String,
}

impl CheckedDivision {
    /// The error for the first pair (dividend, divisor) tract's op would panic on.
    fn check(&self, dividend: &Tensor, divisor: &Tensor) -> TractResult<()> {
        let dt = dividend
            .datum_type()
            .common_super_type(divisor.datum_type())
            .with_context(|| {
                format!(
                    "{} node '{}': no common type for {:?} and {:?}",
                    self.op_type,
                    self.node,
                    dividend.datum_type(),
                    divisor.datum_type()
                )
            })?;
        let a = dividend.cast_to_dt(dt)?;
        let b = divisor.cast_to_dt(dt)?;
        let bad = by_integer!(dt, first_undefined(&a, &b), Ok(None))?;
        match bad {
            Some(Undefined::ByZero) => bail!(
                "{} node '{}': an integer division by zero (its divisor has a 0)",
                self.op_type,
                self.node
            ),
            Some(Undefined::Overflow) => bail!(
                "{} node '{}': an integer division overflows ({dt:?}'s minimum divided by -1)",
                self.op_type,
                self.node
            ),
            None => Ok(()),
        }
    }
}

/// Why an integer division has no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undefined {
    ByZero,
    Overflow,
}

/// An integer element type tract divides.
trait Integer: Datum + Copy + PartialEq {
    const ZERO: Self;
    /// Whether `a / b` overflows (`MIN / -1`; never for an unsigned type).
    fn overflows(a: Self, b: Self) -> bool;
    /// Whether a divisor may overflow with some dividend (is -1).
    fn may_overflow(b: Self) -> bool;
}

macro_rules! signed {
    ($($t:ty),*) => {$(
        impl Integer for $t {
            const ZERO: Self = 0;
            fn overflows(a: Self, b: Self) -> bool {
                a == <$t>::MIN && b == -1
            }
            fn may_overflow(b: Self) -> bool {
                b == -1
            }
        }
    )*};
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl Integer for $t {
            const ZERO: Self = 0;
            fn overflows(_: Self, _: Self) -> bool {
                false
            }
            fn may_overflow(_: Self) -> bool {
                false
            }
        }
    )*};
}

signed!(i8, i16, i32, i64);
unsigned!(u8, u16, u32, u64);

/// What a divisor holds that may leave a quotient undefined.
struct DivisorFlags {
    zero: bool,
    minus_one: bool,
}

fn divisor_flags<T: Integer>(divisor: &Tensor) -> TractResult<DivisorFlags> {
    let view = divisor.to_plain_array_view::<T>()?;
    Ok(DivisorFlags {
        zero: view.iter().any(|&d| d == T::ZERO),
        minus_one: view.iter().any(|&d| T::may_overflow(d)),
    })
}

/// The first undefined quotient of `a / b` broadcast together (ONNX's multidirectional
/// broadcasting: ndarray's, once ranks are aligned on the right).
fn first_undefined<T: Integer>(a: &Tensor, b: &Tensor) -> TractResult<Option<Undefined>> {
    let flags = divisor_flags::<T>(b)?;
    if flags.zero {
        return Ok(Some(Undefined::ByZero));
    }
    if !flags.minus_one {
        return Ok(None);
    }
    let shape: TVec<usize> = multi_broadcast(&[a.shape(), b.shape()])?;
    let (a_view, b_view) = (a.to_plain_array_view::<T>()?, b.to_plain_array_view::<T>()?);
    let (Some(a_all), Some(b_all)) = (
        a_view.broadcast(IxDyn(&shape)),
        b_view.broadcast(IxDyn(&shape)),
    ) else {
        bail!(
            "shapes {:?} and {:?} do not broadcast",
            a.shape(),
            b.shape()
        );
    };
    let overflow = a_all
        .iter()
        .zip(b_all.iter())
        .any(|(&x, &y)| T::overflows(x, y));
    Ok(overflow.then_some(Undefined::Overflow))
}

/// Whether a constant divisor needs no check at run time: no 0, and no -1 of a signed type
/// (whatever the dividend, every quotient is then defined).
fn safe_divisor(divisor: &Tensor) -> TractResult<bool> {
    let flags = by_integer!(
        divisor.datum_type(),
        divisor_flags(divisor),
        return Ok(false)
    )?;
    Ok(!flags.zero && !flags.minus_one)
}

impl Op for CheckedDivision {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("node {} ({})", self.node, self.op_type)])
    }

    op_as_typed_op!();
}

impl EvalOp for CheckedDivision {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        self.check(&inputs[0], &inputs[1])?;
        Ok(inputs)
    }
}

impl TypedOp for CheckedDivision {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        Ok(inputs.iter().map(|f| f.without_value().clone()).collect())
    }

    /// A constant divisor that no dividend can make undefined is checked here, once, and the
    /// check leaves the graph.
    fn declutter(
        &self,
        model: &TypedModel,
        node: &TypedNode,
    ) -> TractResult<Option<TypedModelPatch>> {
        let divisor = model.outlet_fact(node.inputs[1])?;
        let Some(konst) = &divisor.konst else {
            return Ok(None);
        };
        if !safe_divisor(konst)? {
            return Ok(None);
        }
        let mut patch = TypedModelPatch::default();
        for (slot, &input) in node.inputs.iter().enumerate() {
            let tapped = patch.tap_model(model, input)?;
            patch.shunt_outside(model, OutletId::new(node.id, slot), tapped)?;
        }
        Ok(Some(patch))
    }
}
