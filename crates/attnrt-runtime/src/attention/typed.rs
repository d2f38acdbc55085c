//! The op in tract's two forms: the inference form (type and shape rules, for tract's analysis)
//! and the typed (runnable) form that tract plans, checks and evaluates.

use attnrt_kernels::KernelSet;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use super::eval::eval_attention;
use super::semantics::{check_float, AttentionOp};
use crate::kv_store::KvStore;

/// The name under which [`AttentionKernelOp`] appears in a planned graph.
pub const OP_NAME: &str = "AttnrtAttention";

/// The typed (runnable) form of [`AttentionOp`]: evaluates on attnrt's kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionKernelOp {
    /// The node as ONNX defines it.
    pub op: AttentionOp,
    /// The session's kernels.
    pub kernels: KernelSet,
}

impl Op for AttentionKernelOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("node {}", self.op.node)])
    }

    op_as_typed_op!();
}

impl EvalOp for AttentionKernelOp {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        // a generation's in-place cache, installed for the run (`crate::kv_store`)
        let store = ctx
            .shared
            .and_then(|s| s.get::<std::sync::Arc<KvStore>>())
            .map(|s| &**s);
        eval_attention(&self.op, &self.kernels, &inputs, store)
            .with_context(|| format!("Attention node '{}'", self.op.node))
    }
}

impl TypedOp for AttentionKernelOp {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let op = &self.op;
        let ctx = || format!("Attention node '{}'", op.node);
        if inputs.len() != op.input_count() {
            bail!(
                "{}: expected {} inputs, got {}",
                ctx(),
                op.input_count(),
                inputs.len()
            );
        }
        let dt = inputs[0].datum_type;
        check_float(dt, "Q").with_context(ctx)?;
        for (i, what) in [(1, "K"), (2, "V")] {
            if inputs[i].datum_type != dt {
                bail!(
                    "{}: {what} is {:?} but Q is {dt:?}",
                    ctx(),
                    inputs[i].datum_type
                );
            }
        }
        if let Some(m) = op.mask_index() {
            let mdt = inputs[m].datum_type;
            if mdt != DatumType::Bool && mdt != dt {
                bail!(
                    "{}: attn_mask is {mdt:?}; it must be bool or the type of Q ({dt:?})",
                    ctx()
                );
            }
        }
        if let Some(p) = op.past_index() {
            for (i, what) in [(p, "past_key"), (p + 1, "past_value")] {
                if inputs[i].datum_type != dt {
                    bail!(
                        "{}: {what} is {:?} but Q is {dt:?}",
                        ctx(),
                        inputs[i].datum_type
                    );
                }
            }
        }
        if let Some(n) = op.nonpad_index() {
            if inputs[n].datum_type != DatumType::I64 {
                bail!(
                    "{}: input nonpad_kv_seqlen is {:?}; ONNX Attention-24 requires int64",
                    ctx(),
                    inputs[n].datum_type
                );
            }
        }
        let shapes: Vec<&[TDim]> = inputs.iter().map(|f| f.shape.dims()).collect();
        let outs = op.output_shapes(&shapes).with_context(ctx)?;
        Ok(outs.into_iter().map(|s| dt.fact(s)).collect())
    }
}

/// The inference form: tract's type and shape inference on `AttentionOp::output_shapes`,
/// then the typed op in its place.
impl Expansion for AttentionOp {
    fn name(&self) -> StaticName {
        OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: causal={} scale={:?} softcap={} qk_mode={}",
            self.node, self.is_causal, self.scale, self.softcap, self.qk_mode
        )])
    }

    fn nboutputs(&self) -> TractResult<usize> {
        Ok(self.output_count())
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        check_input_arity(inputs, self.input_count())?;
        check_output_arity(outputs, self.output_count())?;
        for o in outputs {
            s.equals(&inputs[0].datum_type, &o.datum_type)?;
        }
        s.equals(&inputs[0].datum_type, &inputs[1].datum_type)?;
        s.equals(&inputs[0].datum_type, &inputs[2].datum_type)?;
        s.equals(&inputs[0].rank, &outputs[0].rank)?;
        for o in &outputs[1..] {
            s.equals(&o.rank, 4)?;
        }
        s.given_all(
            inputs.iter().map(|i| &i.shape),
            move |s, shapes: Vec<TVec<TDim>>| {
                let refs: Vec<&[TDim]> = shapes.iter().map(|s| s.as_slice()).collect();
                let outs = self
                    .output_shapes(&refs)
                    .with_context(|| format!("Attention node '{}'", self.node))?;
                for (o, shape) in outputs.iter().zip(outs) {
                    s.equals(&o.shape, ShapeFactoid::from(shape))?;
                }
                Ok(())
            },
        )
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let op = AttentionKernelOp {
            op: self.clone(),
            kernels: crate::kernels::for_op()?,
        };
        model.wire_node(prefix, op, inputs)
    }
}
