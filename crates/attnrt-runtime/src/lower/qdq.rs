//! The projections of QDQ models (ONNX Runtime's `quantize_static` with `QuantFormat.QDQ`, and
//! other tools' QDQ exports) become one node each: the chain
//!
//! ```text
//! x_d = DequantizeLinear(x_q, x_scale, x_zp)        x_q uint8/int8; x_scale, x_zp one value each
//! W_d = DequantizeLinear(W, w_scale[, w_zp])        W: [K, N] int8/uint8 constant, per tensor or
//!                                                   per column (axis 1)
//! y   = MatMul(x_d, W_d)
//! [y  = Add(y, bias)]                               bias: [N] f32 constant
//! ```
//!
//! is replaced by `y = MatMulIntegerToFloat(x_q, W, x_scale, w_scale, x_zp, w_zp, bias)`
//! (ONNX Runtime's contrib op, `integer_to_float.rs`): the same products, summed exactly in
//! integers and scaled once, where the graph dequantizes both sides to float32 and sums the
//! rounded products in float32. The results agree within float32 rounding of a `K`-term sum.
//! `x_q` is usually the output of the graph's `QuantizeLinear`, which stays: tract computes it,
//! as in the unfused graph.
//!
//! Rewritten only when `W_d` feeds this `MatMul` alone, no intermediate is a graph output, the
//! constants are initializers that are not graph inputs, and `x_zp` is given (its type says
//! whether `x_q` is int8 or uint8). The `DequantizeLinear` of `x_q` stays while anything else
//! reads it (an attention's `MatMul` between activations, say).

use attnrt_onnx::proto::ModelProto;
use tract_onnx::pb::{GraphProto, NodeProto};

use super::quant::{bias_after, op, rewrite_chains, Biased, Chain, Wiring, FLOAT, INT8, UINT8};
use crate::integer_to_float::OP_TYPE;

/// The pass: every chain of `g` (tract's copy of `model`'s graph) becomes one node.
pub(super) fn qdq_matmul(model: &ModelProto, g: &mut GraphProto) {
    rewrite_chains(model, g, "DequantizeLinear", chain);
}

/// The `DequantizeLinear` producing `tensor`, by index, when it has no `block_size`.
fn dequantize<'g>(g: &'g GraphProto, w: &Wiring, tensor: &str) -> Option<(usize, &'g NodeProto)> {
    let at = *w.producer.get(tensor)?;
    let dq = op(g, at, "DequantizeLinear")?;
    let blocked = dq
        .attribute
        .iter()
        .any(|a| a.name == "block_size" && a.i != 0);
    (!blocked && dq.input.len() >= 2).then_some((at, dq))
}

/// The weight's `DequantizeLinear` `dq` when its scale and zero point are per tensor or per
/// column of `W: [K, N]`: `N` for the chain.
fn weight_columns(w: &Wiring, dq: &NodeProto) -> Option<i64> {
    let wt = w.constants.get(dq.input[0].as_str())?;
    let &[_, n] = wt.dims.as_slice() else {
        return None;
    };
    if ![INT8, UINT8].contains(&wt.data_type) || dq.input.len() > 3 {
        return None;
    }
    let scale = w.per_column(&dq.input[1], FLOAT, n)?;
    let zero_point = dq.input.get(2).filter(|z| !z.is_empty());
    if zero_point.is_some_and(|z| w.per_column(z, wt.data_type, n).is_none()) {
        return None;
    }
    // Per column needs axis 1 (the default) or -1; one value per tensor takes any axis.
    let axis = dq
        .attribute
        .iter()
        .find(|a| a.name == "axis")
        .map_or(1, |a| a.i);
    (scale.dims.iter().product::<i64>() == 1 || axis == 1 || axis == -1).then_some(n)
}

/// The activations' `DequantizeLinear` `dq` when its scale and zero point are single
/// constants (the zero point given, so its type names `x_q`'s).
fn activation_quantized(w: &Wiring, dq: &NodeProto) -> bool {
    let one = |name: &str, types: &[i32]| {
        w.constants.get(name).is_some_and(|t| {
            types.contains(&t.data_type) && t.dims.iter().product::<i64>() == 1 && t.dims.len() <= 1
        })
    };
    dq.input.len() == 3 && one(&dq.input[1], &[FLOAT]) && one(&dq.input[2], &[INT8, UINT8])
}

/// The chain (see the module docs) whose `MatMul` is node `at`.
fn chain(g: &GraphProto, w: &Wiring, at: usize) -> Option<Chain> {
    let mm = op(g, at, "MatMul")?;
    let [x_d, w_d] = mm.input.as_slice() else {
        return None;
    };
    let (x_at, x_dq) = dequantize(g, w, x_d)?;
    let (w_at, w_dq) = dequantize(g, w, w_d)?;
    let n = weight_columns(w, w_dq)?;
    if !activation_quantized(w, x_dq)
        || w.only_reader(w_d) != Some(at)
        || w.outputs.contains(x_d.as_str())
    {
        return None;
    }
    let mut removed = vec![at, w_at];
    let (bias, y) = match bias_after(g, w, mm.output.first()?, n) {
        Some(Biased { bias, y, add }) => {
            removed.push(add);
            (bias, y)
        }
        None => (String::new(), mm.output.first()?.clone()),
    };
    let input = |i: usize, of: &NodeProto| of.input.get(i).cloned().unwrap_or_default();
    let node = NodeProto {
        name: mm.name.clone(),
        op_type: OP_TYPE.into(),
        domain: "com.microsoft".into(),
        input: vec![
            input(0, x_dq),
            input(0, w_dq),
            input(1, x_dq),
            input(1, w_dq),
            input(2, x_dq),
            input(2, w_dq),
            bias,
        ],
        output: vec![y],
        ..Default::default()
    };
    Some(Chain {
        removed,
        shared: x_at,
        node,
    })
}
