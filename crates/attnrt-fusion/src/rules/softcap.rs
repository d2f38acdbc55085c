//! Softcap: `c · tanh(x / c)` on the scores, which the op applies after the scale and before
//! the mask (ONNX Attention's `softcap`).
//!
//! ```text
//! Mul(Tanh(Div(x, c)), c) | Mul(c, Tanh(Div(x, c)))      c > 0, finite, known before run time
//! ```

use crate::graph::GraphView;

/// A matched softcap layer.
#[derive(Clone, Debug)]
pub struct Softcap {
    /// The cap `c`.
    pub cap: f32,
    /// The `Mul`, `Tanh` and `Div` nodes, and skip-through nodes between them.
    pub nodes: Vec<usize>,
    /// The capped tensor `x`.
    pub inner: String,
}

/// The softcap layer ending at the `Mul` node `mul`, if it is one.
pub fn layer(view: &GraphView, mul: usize) -> Option<Softcap> {
    let mn = view.node(mul);
    if mn.input.len() != 2 {
        return None;
    }
    let known = |t: &str| view.value(t).and_then(|v| v.scalar_f64());
    let (tanh_out, cap) = match (known(&mn.input[0]), known(&mn.input[1])) {
        (None, Some(c)) => (&mn.input[0], c),
        (Some(c), None) => (&mn.input[1], c),
        _ => return None,
    };
    if !(cap.is_finite() && cap > 0.0) {
        return None;
    }
    // Skip-through nodes may stand between the three; they go with the layer.
    let mut nodes = vec![mul];
    let mut producer = |t: &str| {
        let (t, skipped) = view.skip_producers(t);
        nodes.extend(skipped);
        view.producer(&t)
    };
    let t = producer(tanh_out)?;
    let tn = view.node(t);
    if tn.op_type != "Tanh" || !attnrt_onnx::opset::is_default_domain(&tn.domain) {
        return None;
    }
    let d = producer(tn.input.first()?)?;
    let dn = view.node(d);
    if dn.op_type != "Div" || dn.input.len() != 2 || known(&dn.input[1]) != Some(cap) {
        return None;
    }
    nodes.extend([t, d]);
    Some(Softcap {
        cap: cap as f32,
        nodes,
        inner: dn.input[0].clone(),
    })
}
