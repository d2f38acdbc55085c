//! Float32 `Add`, `Sub`, `Mul` and `Div` whose operands broadcast in a way tract's fast kernels
//! do not take, on attnrt's broadcast kernel ([`attnrt_kernels::broadcast`]).
//!
//! tract 0.23.9 gives an element-wise op its own kernel when `b` is `a` repeated along `b`'s
//! leading unit axes (`OptBinUnicast`) or one value per block of `a` (`OptBinByScalar`);
//! anything else stays a `TypedBinOp`, evaluated through ndarray's generic broadcast at about
//! 2 ns a value. A decoder's rotary embedding at batch 4 is such a case: `q · cos` is
//! `[4, 12, 1, 64] × [4, 1, 1, 64]` (unicast at batch 1), 48 of them per step, ≈ 6 µs each.
//!
//! `take_over_generic_binops` runs on tract's optimized plan: each `TypedBinOp` it still holds
//! for one of those four operations on float32 operands and result (`takes_over`, the one
//! place that decides) becomes a [`BroadcastBinaryOp`]; whatever tract optimized or fused is
//! left as it is. The values are tract's: one IEEE operation per element, operands in their
//! order. Without attnrt's ops the plan is tract's alone (the op registry's switch).

use attnrt_kernels::broadcast::{binary, binary_in_a, binary_in_b, BinaryOp, Broadcast};
use attnrt_kernels::KernelSet;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::binary::TypedBinOp;
use tract_onnx::tract_core::ops::math::{Add, Div, Mul, Sub};
use tract_onnx::tract_hir::internal::*;

use crate::tensor::{f32_data, f32_data_mut};

/// The name under which [`BroadcastBinaryOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtBroadcastBinary";

/// `c = a ∘ b` for float32 `a`, `b` of any shapes that broadcast, on attnrt's kernel; tract's
/// op, kept, evaluates inputs the kernel does not read (not laid out in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BroadcastBinaryOp {
    /// The operation.
    pub op: BinaryOp,
    /// tract's op this one took the place of.
    tract: TypedBinOp,
    /// The session's kernels (their thread policy splits large results).
    kernels: KernelSet,
}

/// The operation of tract's `node` that a [`BroadcastBinaryOp`] takes over, if it does: a
/// generic `TypedBinOp` (neither of tract's optimized forms, nor anything fused) of `Add`,
/// `Sub`, `Mul` or `Div` with two float32 operands of the same rank and a float32 result.
fn takes_over(model: &TypedModel, node: &TypedNode) -> TractResult<Option<BinaryOp>> {
    let Some(TypedBinOp(mini, out_dt)) = node.op_as::<TypedBinOp>() else {
        return Ok(None);
    };
    let op = if mini.is::<Add>() {
        BinaryOp::Add
    } else if mini.is::<Sub>() {
        BinaryOp::Sub
    } else if mini.is::<Mul>() {
        BinaryOp::Mul
    } else if mini.is::<Div>() {
        BinaryOp::Div
    } else {
        return Ok(None);
    };
    let inputs = model.node_input_facts(node.id)?;
    let f32_operands = inputs.len() == 2
        && inputs.iter().all(|f| f.datum_type == DatumType::F32)
        && inputs[0].rank() == inputs[1].rank();
    let f32_result = out_dt.is_none_or(|dt| dt == DatumType::F32)
        && node.outputs.len() == 1
        && node.outputs[0].fact.datum_type == DatumType::F32;
    Ok((f32_operands && f32_result).then_some(op))
}

/// Puts a [`BroadcastBinaryOp`] in place of every op of `model` (tract's optimized plan) that
/// [`takes_over`] chooses, on the kernels of the plan being built.
pub(crate) fn take_over_generic_binops(model: &mut TypedModel) -> TractResult<()> {
    let mut chosen = Vec::new();
    for node in model.nodes() {
        if let Some(op) = takes_over(model, node)? {
            chosen.push((node.id, op));
        }
    }
    if chosen.is_empty() {
        return Ok(());
    }
    let kernels = crate::kernels::for_op()?;
    for (id, op) in chosen {
        let node = model.node_mut(id);
        let tract = node
            .op_as::<TypedBinOp>()
            .context("a chosen node is no longer tract's binary op")?
            .clone();
        node.op = Box::new(BroadcastBinaryOp { op, tract, kernels });
    }
    Ok(())
}

/// Whether the kernel can read `t`: plain float32 values, in order (tract leaves other
/// strides on a unit axis after some of its axis insertions, which do not move a value).
fn in_order(t: &Tensor) -> bool {
    let shape = t.shape();
    t.datum_type() == DatumType::F32
        && t.len() == shape.iter().product::<usize>()
        && shape
            .iter()
            .zip(t.strides())
            .zip(Tensor::natural_strides(shape).iter())
            .all(|((&d, &s), &n)| d <= 1 || s == n)
        && t.try_as_plain_ram().is_ok()
}

impl Op for BroadcastBinaryOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("{:?}", self.op)])
    }

    op_as_typed_op!();
}

impl EvalOp for BroadcastBinaryOp {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        if inputs.len() != 2 || !inputs.iter().all(|t| in_order(t)) {
            return self.tract.eval(ctx, inputs);
        }
        let (a, b) = args_2!(inputs);
        let layout = Broadcast::new(a.shape(), b.shape()).with_context(|| {
            format!(
                "{:?}: shapes {:?} and {:?} do not broadcast (or their result is too large)",
                self.op,
                a.shape(),
                b.shape()
            )
        })?;
        let threads = self.kernels.threads();
        // The result over an operand nothing else reads, as tract's own op does with `a`.
        if layout.covers_a() && a.shape() == layout.shape() && a.is_exclusive() {
            let mut c = a.into_tensor();
            binary_in_a(
                self.op,
                &layout,
                f32_data_mut(&mut c)?,
                f32_data(&b)?,
                threads,
            );
            return Ok(tvec!(c.into_tvalue()));
        }
        if layout.covers_b() && b.shape() == layout.shape() && b.is_exclusive() {
            let mut c = b.into_tensor();
            binary_in_b(
                self.op,
                &layout,
                f32_data(&a)?,
                f32_data_mut(&mut c)?,
                threads,
            );
            return Ok(tvec!(c.into_tvalue()));
        }
        // SAFETY: f32 has no invalid bit patterns, and `binary` writes every value of the
        // result before it is read.
        let mut c = unsafe { Tensor::uninitialized::<f32>(layout.shape())? };
        binary(
            self.op,
            &layout,
            f32_data(&a)?,
            f32_data(&b)?,
            f32_data_mut(&mut c)?,
            threads,
        );
        Ok(tvec!(c.into_tvalue()))
    }
}

impl TypedOp for BroadcastBinaryOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        self.tract.output_facts(inputs)
    }

    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.tract.cost(inputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NamedTensor, Session, SessionOptions, Threads};
    use attnrt_onnx::proto::ModelProto;
    use attnrt_onnx::DataType;
    use attnrt_testkit::{node, seeded_values, value_info, GraphBuilder};
    use proptest::prelude::*;
    use tract_onnx::tract_core::ops::binary::BinMiniOp;

    const OPS: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];

    fn tract_op(op: BinaryOp) -> TypedBinOp {
        let mini: Box<dyn BinMiniOp> = match op {
            BinaryOp::Add => Box::new(Add),
            BinaryOp::Sub => Box::new(Sub),
            BinaryOp::Mul => Box::new(Mul),
            BinaryOp::Div => Box::new(Div),
        };
        TypedBinOp(mini, None)
    }

    fn ours(op: BinaryOp) -> BroadcastBinaryOp {
        BroadcastBinaryOp {
            op,
            tract: tract_op(op),
            kernels: KernelSet::resolve().unwrap(),
        }
    }

    /// testkit's seeded values, every seventh replaced by NaN, an infinity, a signed zero or a
    /// subnormal.
    fn tensor(shape: &[usize], seed: u32) -> Tensor {
        let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-40];
        let mut v = seeded_values(shape.iter().product(), seed);
        for (k, x) in v.iter_mut().step_by(7).enumerate() {
            *x = special[(k + seed as usize) % special.len()];
        }
        Tensor::from_shape(shape, &v).unwrap()
    }

    /// A tensor's shape and the bits of its values.
    type Bits = (Vec<usize>, Vec<u32>);

    fn bits(t: &Tensor) -> Bits {
        let v = f32_data(t).unwrap().iter().map(|x| x.to_bits()).collect();
        (t.shape().to_vec(), v)
    }

    /// attnrt's op against tract's own evaluation of the same `TypedBinOp`, with the operands
    /// owned by the op (the result over either) and shared (a new result).
    fn check(op: BinaryOp, a: &Tensor, b: &Tensor) {
        let ctx = EvalContext::out_of_plan();
        let tract = tract_op(op);
        let inputs = || tvec!(a.clone().into_tvalue(), b.clone().into_tvalue());
        let want = tract.eval(&ctx, inputs()).unwrap().remove(0);
        let ours = ours(op);
        let owned = ours.eval(&ctx, inputs()).unwrap().remove(0);
        let held = inputs();
        let shared = ours.eval(&ctx, held.clone()).unwrap().remove(0);
        let what = format!("{op:?} {:?} {:?}", a.shape(), b.shape());
        assert_eq!(bits(&owned), bits(&want), "{what}, operands owned");
        assert_eq!(bits(&shared), bits(&want), "{what}, operands shared");
    }

    /// Two shapes of one rank that broadcast (tract's typed ops align ranks with unit axes):
    /// the result's axes, each kept or made 1 in `a` and in `b`.
    fn shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        (0usize..=5)
            .prop_flat_map(|rank| {
                (
                    prop::collection::vec(0usize..=5, rank),
                    prop::collection::vec(0u8..4, rank),
                )
            })
            .prop_map(|(shape, pattern)| {
                let pick = |bit: u8| {
                    shape
                        .iter()
                        .zip(&pattern)
                        .map(|(&d, &p)| if p & bit != 0 { 1 } else { d })
                        .collect::<Vec<_>>()
                };
                (pick(1), pick(2))
            })
    }

    proptest! {
        #[test]
        fn equals_tracts_evaluation_bit_for_bit(
            (sa, sb) in shapes(),
            op in prop::sample::select(OPS.to_vec()),
            seed in any::<u32>(),
        ) {
            let (a, b) = (tensor(&sa, seed), tensor(&sb, seed / 2 + 1));
            check(op, &a, &b);
            check(op, &b, &a);
        }
    }

    #[test]
    fn large_results_split_over_the_pool_equal_tracts() {
        let threads = Threads::new(Some(2)).unwrap();
        threads.install(|| {
            for op in OPS {
                let (a, b) = (tensor(&[4, 12, 128, 64], 3), tensor(&[4, 1, 128, 64], 4));
                check(op, &a, &b);
                check(op, &b, &a);
                let (a, b) = (tensor(&[2, 300, 1], 5), tensor(&[1, 1, 200], 6));
                check(op, &a, &b);
            }
        });
    }

    /// `y = q · cos` and `z = cos − q` with `cos` shared over the heads: at batch 4 neither of
    /// tract's fast forms applies; at batch 1 both are unicast.
    fn rope_model() -> ModelProto {
        let q = ["batch", "12", "1", "64"];
        let mut g = GraphBuilder::new("rope");
        g.input(value_info("q", DataType::Float, &q));
        g.input(value_info(
            "cos",
            DataType::Float,
            &["batch", "1", "1", "64"],
        ));
        g.node(node("mul", "Mul", &["q", "cos"], &["y"]));
        g.node(node("sub", "Sub", &["cos", "q"], &["z"]));
        for out in ["y", "z"] {
            g.output(value_info(out, DataType::Float, &q));
        }
        g.into_model(17)
    }

    fn run(batch: usize, attnrt_ops: bool) -> (Vec<Bits>, Vec<String>) {
        let input = |name: &str, heads: usize, seed: u32| NamedTensor {
            name: name.into(),
            tensor: tensor(&[batch, heads, 1, 64], seed),
        };
        let inputs = [input("q", 12, 1), input("cos", 1, 2)];
        let options = SessionOptions {
            attnrt_ops,
            ..SessionOptions::per_shape()
        };
        let threads = Threads::new(Some(1)).unwrap();
        let s = Session::build_with_options(&rope_model(), &inputs, &threads, "rope", &options)
            .unwrap();
        let out = s.run(&inputs).unwrap();
        (out.iter().map(|t| bits(&t.tensor)).collect(), s.op_names())
    }

    #[test]
    fn a_batched_rope_product_plans_attnrts_op_only_with_attnrt_ops() {
        let (on, on_ops) = run(4, true);
        let (off, off_ops) = run(4, false);
        assert_eq!(on, off);
        let count = |ops: &[String]| ops.iter().filter(|o| *o == OP_NAME).count();
        assert_eq!(count(&on_ops), 2, "{on_ops:?}");
        assert_eq!(count(&off_ops), 0, "{off_ops:?}");
        assert!(off_ops.iter().any(|o| o == "Mul"), "{off_ops:?}");
        // At batch 1 both are tract's unicast forms (the `Sub` with its operands swapped).
        let (_, one_ops) = run(1, true);
        assert_eq!(count(&one_ops), 0, "{one_ops:?}");
        assert!(one_ops.iter().any(|o| o == "OptMulUnicast"), "{one_ops:?}");
    }
}
