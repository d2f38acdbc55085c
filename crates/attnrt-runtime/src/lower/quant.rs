//! The projections of dynamically quantized models (ONNX Runtime's `quantize_dynamic`, QOperator
//! form) become one node each: the chain
//!
//! ```text
//! x_q, x_scale, x_zp = DynamicQuantizeLinear(x)
//! s   = Mul(x_scale, w_scale)                      w_scale: [], [1] or [N] f32 constant
//! y   = Mul(Cast<float>(MatMulInteger(x_q, W, x_zp[, w_zp])), s)
//! [y  = Add(y, bias)]                              bias: [N] f32 constant
//! ```
//!
//! with `W: [K, N]` an int8 or uint8 constant and `w_zp` absent or a constant of its type
//! (`[]`, `[1]` or `[N]`), is replaced by `y = DynamicQuantizeMatMul(x, W, w_scale, w_zp, bias)`
//! (ONNX Runtime's contrib op, whose definition is the chain's), which the op registry runs on
//! attnrt's integer kernels (`quant_projection.rs`; its docs say why the numbers are the
//! graph's own). The `DynamicQuantizeLinear` stays while anything else reads it.
//!
//! Rewritten only when every intermediate (`x_q`, `x_zp`, the integer product, its cast, `s`)
//! feeds this chain alone (`x_q`/`x_zp`/`x_scale` may feed other chains: Q, K and V share one
//! quantization), none is a graph output, and the constants are initializers that are not graph
//! inputs (a caller could override those). Graphs with subgraphs are left alone (a body may read
//! any outer name).

use std::collections::{HashMap, HashSet};

use attnrt_onnx::opset;
use attnrt_onnx::proto::ModelProto;
use tract_onnx::pb::{GraphProto, NodeProto};

use crate::quant_projection::OP_TYPE;

/// ONNX's element types the chain needs (`TensorProto.DataType`).
pub(super) const FLOAT: i32 = 1;
pub(super) const UINT8: i32 = 2;
pub(super) const INT8: i32 = 3;

/// The graph's wiring: who produces and who reads each tensor.
pub(super) struct Wiring<'a> {
    pub(super) producer: HashMap<&'a str, usize>,
    pub(super) readers: HashMap<&'a str, Vec<usize>>,
    pub(super) outputs: HashSet<&'a str>,
    pub(super) constants: HashMap<&'a str, Constant>,
}

/// What the chain needs to know of a constant: its element type and dims.
pub(super) struct Constant {
    pub(super) data_type: i32,
    pub(super) dims: Vec<i64>,
}

impl<'a> Wiring<'a> {
    /// The wiring of `g`; its constants are its initializers and the large initializers of
    /// `model` that tract's graph declares as inputs (held apart: `weights.rs`), but never a
    /// graph input of the model itself.
    pub(super) fn new(g: &'a GraphProto, model: &'a ModelProto) -> Wiring<'a> {
        let mut w = Wiring {
            producer: HashMap::new(),
            readers: HashMap::new(),
            outputs: g.output.iter().map(|o| o.name.as_str()).collect(),
            constants: HashMap::new(),
        };
        let inputs: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
        for t in g
            .initializer
            .iter()
            .filter(|t| !inputs.contains(t.name.as_str()))
        {
            let c = Constant {
                data_type: t.data_type,
                dims: t.dims.clone(),
            };
            w.constants.insert(t.name.as_str(), c);
        }
        if let Some(mg) = model.graph.as_ref() {
            let model_inputs: HashSet<&str> = mg.input.iter().map(|i| i.name.as_str()).collect();
            for t in mg.initializer.iter().filter(|t| {
                inputs.contains(t.name.as_str()) && !model_inputs.contains(t.name.as_str())
            }) {
                let c = Constant {
                    data_type: t.data_type,
                    dims: t.dims.clone(),
                };
                w.constants.insert(t.name.as_str(), c);
            }
        }
        for (i, n) in g.node.iter().enumerate() {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                w.producer.insert(o.as_str(), i);
            }
            for r in n.input.iter().filter(|r| !r.is_empty()) {
                w.readers.entry(r.as_str()).or_default().push(i);
            }
        }
        w
    }

    /// The one node reading `tensor`, when exactly one does and it is not a graph output.
    pub(super) fn only_reader(&self, tensor: &str) -> Option<usize> {
        match self.readers.get(tensor).map(Vec::as_slice) {
            Some(&[r]) if !self.outputs.contains(tensor) => Some(r),
            _ => None,
        }
    }

    /// The constant `tensor` when its type is `elem_type` and its shape `[]`, `[1]` or `[n]`.
    pub(super) fn per_column(&self, tensor: &str, elem_type: i32, n: i64) -> Option<&Constant> {
        let t = self.constants.get(tensor)?;
        let shape_ok = matches!(t.dims.as_slice(), [] | [1]) || t.dims == [n];
        (t.data_type == elem_type && shape_ok).then_some(t)
    }
}

/// One chain to replace.
pub(super) struct Chain {
    /// Nodes that go (by index); the new node takes the place of the last.
    pub(super) removed: Vec<usize>,
    /// The node quantizing `x` (here the `DynamicQuantizeLinear`), which goes when no node that
    /// stays reads it.
    pub(super) shared: usize,
    /// The node put in the chain's place.
    pub(super) node: NodeProto,
}

/// The node of `g` at `at` when it is a default-domain `op_type`.
pub(super) fn op<'g>(g: &'g GraphProto, at: usize, op_type: &str) -> Option<&'g NodeProto> {
    let n = &g.node[at];
    (n.op_type == op_type && opset::is_default_domain(&n.domain)).then_some(n)
}

/// The other input of the binary node `n`, besides `tensor`.
pub(super) fn other_input<'n>(n: &'n NodeProto, tensor: &str) -> Option<&'n str> {
    match n.input.as_slice() {
        [a, b] if a == tensor && b != tensor => Some(b),
        [a, b] if b == tensor && a != tensor => Some(a),
        _ => None,
    }
}

/// A bias `Add` after a product.
pub(super) struct Biased {
    /// the bias, a float32 `[N]` constant
    pub(super) bias: String,
    /// the sum
    pub(super) y: String,
    /// the `Add`
    pub(super) add: usize,
}

/// The `Add` of a float32 `[n]` constant that alone reads `product`, when there is one.
pub(super) fn bias_after(g: &GraphProto, w: &Wiring, product: &str, n: i64) -> Option<Biased> {
    let add = w.only_reader(product)?;
    let bias = other_input(op(g, add, "Add")?, product)?;
    let t = w.constants.get(bias)?;
    (t.data_type == FLOAT && t.dims == [n]).then(|| Biased {
        bias: bias.to_string(),
        y: g.node[add].output.first().cloned().unwrap_or_default(),
        add,
    })
}

/// The chain (see the module docs) whose `MatMulInteger` is node `at`.
fn chain(g: &GraphProto, w: &Wiring, at: usize) -> Option<Chain> {
    let mmi = op(g, at, "MatMulInteger")?;
    let (x_q, weight, x_zp) = (mmi.input.first()?, mmi.input.get(1)?, mmi.input.get(2)?);
    let w_zp = mmi.input.get(3).filter(|z| !z.is_empty());
    let quantize = *w.producer.get(x_q.as_str())?;
    let dql = op(g, quantize, "DynamicQuantizeLinear")?;
    if dql.output.len() != 3 || dql.output[0] != *x_q || dql.output[2] != *x_zp {
        return None;
    }
    let wt = w.constants.get(weight.as_str())?;
    let &[_, n] = wt.dims.as_slice() else {
        return None;
    };
    if ![INT8, UINT8].contains(&wt.data_type) || mmi.input.len() > 4 {
        return None;
    }
    if w_zp.is_some_and(|z| w.per_column(z, wt.data_type, n).is_none()) {
        return None;
    }
    let cast_at = w.only_reader(mmi.output.first()?)?;
    let cast = op(g, cast_at, "Cast")?;
    let to = cast.attribute.iter().find(|a| a.name == "to")?;
    if to.i != i64::from(FLOAT) {
        return None;
    }
    let mul_at = w.only_reader(cast.output.first()?)?;
    let mul = op(g, mul_at, "Mul")?;
    let scales = other_input(mul, &cast.output[0])?;
    let scales_at = *w.producer.get(scales)?;
    let scales_mul = op(g, scales_at, "Mul")?;
    let w_scale = other_input(scales_mul, &dql.output[1])?;
    w.per_column(w_scale, FLOAT, n)?;
    if w.outputs.contains(scales)
        || w.outputs.contains(x_q.as_str())
        || w.outputs.contains(x_zp.as_str())
    {
        return None;
    }
    let mut removed = vec![at, cast_at, mul_at];
    if w.only_reader(scales) == Some(mul_at) {
        removed.push(scales_at);
    }
    let (bias, y) = match bias_after(g, w, mul.output.first()?, n) {
        Some(Biased { bias, y, add }) => {
            removed.push(add);
            (bias, y)
        }
        None => (String::new(), mul.output.first()?.clone()),
    };
    let node = NodeProto {
        name: mmi.name.clone(),
        op_type: OP_TYPE.into(),
        domain: "com.microsoft".into(),
        input: vec![
            dql.input.first()?.clone(),
            weight.clone(),
            w_scale.to_string(),
            w_zp.cloned().unwrap_or_default(),
            bias,
        ],
        output: vec![y],
        ..Default::default()
    };
    Some(Chain {
        removed,
        shared: quantize,
        node,
    })
}

/// The pass: every chain of `g` (tract's copy of `model`'s graph) becomes one node.
pub(super) fn dynamic_quantize_matmul(model: &ModelProto, g: &mut GraphProto) {
    rewrite_chains(model, g, "MatMulInteger", chain);
}

/// Replaces every chain `find` sees at a node of `g` (by index; only graphs with an
/// `anchor` node and no subgraph are looked at: a body may read any outer name).
pub(super) fn rewrite_chains(
    model: &ModelProto,
    g: &mut GraphProto,
    anchor: &str,
    find: fn(&GraphProto, &Wiring, usize) -> Option<Chain>,
) {
    let has_subgraph = g.node.iter().any(|n| {
        n.attribute
            .iter()
            .any(|a| a.g.is_some() || !a.graphs.is_empty())
    });
    if has_subgraph || !g.node.iter().any(|n| n.op_type == anchor) {
        return;
    }
    let (removed, mut placed) = plan(g, model, find);
    if placed.is_empty() {
        return;
    }
    let nodes = std::mem::take(&mut g.node);
    for (i, n) in nodes.into_iter().enumerate() {
        match placed.remove(&i) {
            Some(fused) => g.node.push(fused),
            None if !removed[i] => g.node.push(n),
            None => {}
        }
    }
}

/// Which nodes of `g` go, and the new node put in place of each chain's last one.
fn plan(
    g: &GraphProto,
    model: &ModelProto,
    find: fn(&GraphProto, &Wiring, usize) -> Option<Chain>,
) -> (Vec<bool>, HashMap<usize, NodeProto>) {
    let w = Wiring::new(g, model);
    let chains: Vec<Chain> = (0..g.node.len()).filter_map(|at| find(g, &w, at)).collect();
    let mut removed = vec![false; g.node.len()];
    let mut placed = HashMap::new();
    let mut shared = HashSet::new();
    for c in chains {
        for &r in &c.removed {
            removed[r] = true;
        }
        let last = *c.removed.iter().max().expect("a chain removes nodes");
        placed.insert(last, c.node);
        shared.insert(c.shared);
    }
    // A quantization goes when no node that stays reads it (the new nodes read `x`).
    for q in shared {
        let still_read = g.node[q].output.iter().any(|o| {
            w.outputs.contains(o.as_str())
                || w.readers
                    .get(o.as_str())
                    .is_some_and(|rs| rs.iter().any(|&r| !removed[r]))
        });
        removed[q] = !still_read;
    }
    (removed, placed)
}
