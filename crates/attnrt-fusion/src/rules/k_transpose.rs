//! How K reaches the QK MatMul transposed, and the K the fused node reads instead:
//!
//! ```text
//! Kᵀ = Transpose[0,1,3,2](K)                           one transpose
//!    | Transpose[0,1,3,2](Transpose[0,2,1,3](K3))      twice (TorchScript merges to [0,2,3,1])
//!    | Reshape(Transpose[0,2,1](Reshape(K4, [a·b, c, d])), [a, b, d, c])
//!                                                      dynamo SDPA: the swap through 3-D
//! ```
//!
//! with skip-through nodes looked through anywhere (the ONNX expansions name K
//! `PresentKey = Identity(KReshaped)`).
//!
//! The composite permutation is tracked; when it is not the identity the rewrite inserts one
//! `Transpose` on K's source.

use attnrt_onnx::attr;

use crate::graph::GraphView;

/// K as the fused node reads it: a source tensor and the permutation that makes it K
/// (`None`: the source already is K).
#[derive(Clone, Debug, PartialEq)]
pub struct KInput {
    /// The tensor read.
    pub source: String,
    /// The `Transpose` to apply to it, if any.
    pub perm: Option<Vec<i64>>,
}

/// How many Transposes (or equivalent) are followed up from a tensor.
const MAX_TRANSPOSES: usize = 6;

/// K for the QK MatMul's second input `kt` of rank `rank`: Kᵀ's source and the permutation
/// `kt_perm ∘ swap(last two)`.
pub fn from_kt(view: &GraphView, kt: &str, rank: usize) -> KInput {
    let (source, kt_perm) = through_transposes(view, kt, rank);
    // K = Kᵀ with its last two axes swapped = transpose(source, kt_perm ∘ swap).
    let mut perm = kt_perm;
    perm.swap(rank - 2, rank - 1);
    let identity: Vec<i64> = (0..rank as i64).collect();
    KInput {
        source,
        perm: (perm != identity).then_some(perm),
    }
}

/// A tensor `t` seen through a chain of Transposes: `t = transpose(source, perm)`.
pub fn through_transposes(view: &GraphView, t: &str, rank: usize) -> (String, Vec<i64>) {
    let mut perm: Vec<i64> = (0..rank as i64).collect();
    let mut cur = t.to_string();
    for _ in 0..MAX_TRANSPOSES {
        let Some(p) = view.producer(&cur) else { break };
        let n = view.node(p);
        // The fused node reads what a skip-through node passes on.
        if view.passthrough(p).is_ok() {
            cur = n.input[0].clone();
            continue;
        }
        if n.op_type == "Reshape" && rank == 4 {
            if let Some(x4) = flattened_swap(view, &cur) {
                perm = perm.iter().map(|&i| [0, 1, 3, 2][i as usize]).collect();
                cur = x4;
                continue;
            }
        }
        if n.op_type != "Transpose" || !attnrt_onnx::opset::is_default_domain(&n.domain) {
            break;
        }
        let Ok(Some(p1)) = attr::ints(n, "perm") else {
            break;
        };
        if p1.len() != rank {
            break;
        }
        // t = transpose(x, perm) and x = transpose(s, p1)  ⇒  t = transpose(s, p1∘perm).
        let Some(src) = n.input.first() else { break };
        perm = perm.iter().map(|&i| p1[i as usize]).collect();
        cur = src.clone();
    }
    (cur, perm)
}

/// Dynamo's SDPA export transposes K through 3-D:
/// `t = Reshape(Transpose(Reshape(x4, [a·b, c, d]), [0, 2, 1]), [a, b, d, c])`, which is
/// `transpose(x4, [0, 1, 3, 2])`; returns `x4` when the shapes prove it.
fn flattened_swap(view: &GraphView, t: &str) -> Option<String> {
    let producer = |t: &str| view.producer(&view.skip_producers(t).0);
    let outer = view.node(view.producer(t)?);
    let tr = view.node(producer(outer.input.first()?)?);
    if tr.op_type != "Transpose" || attr::ints(tr, "perm").ok().flatten() != Some(&[0, 2, 1][..]) {
        return None;
    }
    let inner = view.node(producer(tr.input.first()?)?);
    if inner.op_type != "Reshape" {
        return None;
    }
    let x4 = inner.input.first()?;
    let (xs, fs, ts) = (
        view.shape(x4)?,
        view.shape(&inner.output[0])?,
        view.shape(t)?,
    );
    let ok = xs.len() == 4
        && fs.len() == 3
        && ts.len() == 4
        && Some(&fs[0]) == xs[0].mul(&xs[1]).as_ref()
        && fs[1] == xs[2]
        && fs[2] == xs[3]
        && ts[0] == xs[0]
        && ts[1] == xs[1]
        && ts[2] == xs[3]
        && ts[3] == xs[2];
    ok.then(|| x4.clone())
}
