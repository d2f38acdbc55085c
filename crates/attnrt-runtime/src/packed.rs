//! The projections whose weight `weights.rs` packed once per session: `MatMul` and `Gemm` as
//! parsed, minus their weight input, holding the packed weight instead; typed as
//! [`ProjectionOp`] on it, as `projection.rs` types them when the weight is a constant.

use std::sync::Arc;

use attnrt_kernels::projection::PackedWeight;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use crate::projection::{add_beta_c, bias_row, ProjectionGemm, ProjectionOp};
use crate::projection_core;

/// A projection `MatMul` whose constant weight is packed already: `x · W` for `x: [..., K]`
/// float32 and the packed `W: [K, N]`.
#[derive(Debug, Clone)]
pub(crate) struct PackedProjection {
    /// The ONNX node name.
    pub(crate) node: String,
    /// `W`, packed.
    pub(crate) weight: Arc<PackedWeight>,
}

impl Expansion for PackedProjection {
    fn name(&self) -> StaticName {
        "AttnrtPackedMatMul".into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        check_input_arity(inputs, 1)?;
        check_output_arity(outputs, 1)?;
        s.equals(&inputs[0].datum_type, DatumType::F32)?;
        s.equals(&outputs[0].datum_type, DatumType::F32)?;
        let (k, n) = (self.weight.k().to_dim(), self.weight.n().to_dim());
        projection_core::rules(s, &inputs[0], &outputs[0], k, n)
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let op = ProjectionOp::for_packed(&self.node, self.weight.clone())?;
        if model.outlet_fact(inputs[0])?.rank() >= 2 {
            return model.wire_node(prefix, op, &inputs[..1]);
        }
        // `[K] · W` is the one row `[1, K] · W` without its row axis.
        let row = model.wire_node(format!("{prefix}.row"), AxisOp::Add(0), &inputs[..1])?;
        let y = model.wire_node(format!("{prefix}.product"), op, &row)?;
        model.wire_node(prefix, AxisOp::Rm(0), &y)
    }
}

/// A projection `Gemm` (without `transA`) whose `B` is packed already: `alpha · A · B' + beta·C`
/// for `A: [M, K]` float32, the packed `B': [K, N]` and the optional `C`, its only input after
/// `A`.
#[derive(Debug, Clone)]
pub(crate) struct PackedGemm {
    /// The `Gemm` as parsed (its `trans_b` says how `B` was packed).
    pub(crate) gemm: ProjectionGemm,
    /// `B'`, packed.
    pub(crate) weight: Arc<PackedWeight>,
}

impl Expansion for PackedGemm {
    fn name(&self) -> StaticName {
        "AttnrtPackedGemm".into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        if !(1..=2).contains(&inputs.len()) {
            bail!(
                "Gemm node '{}' has {} inputs besides B, needs A and an optional C",
                self.gemm.node,
                inputs.len()
            );
        }
        check_output_arity(outputs, 1)?;
        s.equals(&inputs[0].rank, 2)?;
        s.equals(&outputs[0].rank, 2)?;
        s.equals(&inputs[0].datum_type, DatumType::F32)?;
        s.equals(&outputs[0].datum_type, DatumType::F32)?;
        if inputs.len() == 2 {
            s.equals(&inputs[1].datum_type, DatumType::F32)?;
        }
        let (k, n) = (self.weight.k().to_dim(), self.weight.n().to_dim());
        projection_core::rules(s, &inputs[0], &outputs[0], k, n)
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let mut op = ProjectionOp::for_packed(&self.gemm.node, self.weight.clone())?;
        op.alpha = self.gemm.alpha;
        let beta = self.gemm.beta;
        let Some(&c) = inputs.get(1).filter(|_| beta != 0.0) else {
            return model.wire_node(prefix, op, &inputs[..1]);
        };
        // `C` broadcast along rows is the op's bias; any other is added after it.
        let row = model
            .outlet_fact(c)?
            .konst
            .as_ref()
            .and_then(|ct| bias_row(ct, self.weight.n(), 2));
        if let Some(row) = row {
            let row: Vec<f32> = row.iter().map(|&v| beta * v).collect();
            op.bias = Some(tensor1(&row).into_arc_tensor());
            return model.wire_node(prefix, op, &inputs[..1]);
        }
        let y = model.wire_node(format!("{prefix}.ab"), op, &inputs[..1])?[0];
        Ok(tvec!(add_beta_c(prefix, model, y, c, beta)?))
    }
}
