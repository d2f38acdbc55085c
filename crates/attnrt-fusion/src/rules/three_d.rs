//! The 3-D layout: the head split of Q, K, V and the head merge after the context absorbed
//! into the fused node:
//!
//! ```text
//! Q4 = Transpose[0,2,1,3](Reshape(Xq, [B, L, H, D]))          head split (K, V alike)
//! Y  = Reshape(Transpose[0,2,1,3](context), [B, Lq, H·Dv])    head merge
//! ```
//!
//! Absorbed, the fused node reads `Xq`, `Xk`, `Xv` (`[B, L, H·D]`) with `q_num_heads`/
//! `kv_num_heads` and writes `Y` ("3d"); otherwise it reads the 4-D tensors ("4d (why)").

use attnrt_onnx::{attr, node_label};

use super::k_transpose::{through_transposes, KInput};
use crate::graph::{shape_str, Dim, GraphView};
use crate::mismatch::{Check, Mismatch};

/// The head layout of a 4-D block.
#[derive(Clone, Debug)]
pub enum HeadLayout {
    /// The head split and merge are absorbed.
    ThreeD(ThreeD),
    /// The fused node reads the 4-D tensors; why the 3-D layout is not used (empty when the
    /// split and merge match but Q and K differ in head size, or K and V in heads).
    FourD(String),
}

/// The 3-D operands: `[B, L, H·D]` tensors in and out, and the merge nodes that go with the
/// block.
#[derive(Clone, Debug)]
pub struct ThreeD {
    /// Q before its head split.
    pub q: String,
    /// K before its head split (read as it is).
    pub k: String,
    /// V before its head split.
    pub v: String,
    /// The head merge's output, which the fused node writes.
    pub output: String,
    /// The head merge's nodes.
    pub merge: Vec<usize>,
    /// Query heads.
    pub q_heads: i64,
    /// Key/value heads.
    pub kv_heads: i64,
}

impl HeadLayout {
    /// The tag for the report's rule: `3d`, or `4d (why not)`.
    pub fn tag(&self) -> String {
        match self {
            HeadLayout::ThreeD(_) => "3d".into(),
            HeadLayout::FourD(why) => format!("4d ({why})"),
        }
    }
}

/// The 3-D layout when Q, K and V (as the fused node reads them: `q`, `k`, `v`, writing
/// `output`) all come from `[B, L, H·D]` projections and the output goes back to
/// `[B, Lq, H·Dv]`; the 4-D layout and why not otherwise. `qs` and `v4` are the 4-D shapes of
/// Q and V.
pub fn layout(
    view: &GraphView,
    q: &str,
    k: &KInput,
    v: &str,
    output: &str,
    qs: &[Dim],
    v4: &[Dim],
) -> HeadLayout {
    let (qsrc, qperm) = through_transposes(view, q, 4);
    let (vsrc, vperm) = through_transposes(view, v, 4);
    let (ksrc, kperm) = match &k.perm {
        Some(perm) => (k.source.clone(), perm.clone()),
        None => through_transposes(view, &k.source, 4),
    };
    let splits = (
        head_split(view, &qsrc, &qperm),
        head_split(view, &ksrc, &kperm),
        head_split(view, &vsrc, &vperm),
    );
    let merge = head_merge(view, output, qs, v4);
    match (splits, merge) {
        ((Ok((xq, hq, dq)), Ok((xk, hk, dk)), Ok((xv, hv, _))), Ok((merge, out3)))
            if dq == dk && hk == hv =>
        {
            HeadLayout::ThreeD(ThreeD {
                q: xq,
                k: xk,
                v: xv,
                output: out3,
                merge,
                q_heads: hq,
                kv_heads: hk,
            })
        }
        (s, m) => {
            let why = [s.0.err(), s.1.err(), s.2.err(), m.err()]
                .into_iter()
                .flatten()
                .next()
                .map(|m| m.found)
                .unwrap_or_default();
            HeadLayout::FourD(why)
        }
    }
}

fn split_refused(at: impl Into<String>, found: String) -> Mismatch {
    Mismatch::new(
        at,
        Check::HeadLayout,
        "Transpose[0, 2, 1, 3](Reshape([B, L, H·D] → [B, L, H, D]))",
        found,
    )
}

/// The 3-D tensor `X [B, L, H·D]` behind `t4 = Transpose(Reshape(X, [B, L, H, D]), perm)`
/// where the composite perm is `[0, 2, 1, 3]`; returns `(X, H, D)`.
fn head_split(
    view: &GraphView,
    source: &str,
    perm: &[i64],
) -> Result<(String, i64, i64), Mismatch> {
    let src = format!("'{source}'");
    if perm != [0, 2, 1, 3] {
        return Err(split_refused(
            src,
            format!("head split perm {perm:?} is not [0, 2, 1, 3]"),
        ));
    }
    let r = view
        .producer(source)
        .ok_or_else(|| split_refused(&src, "not produced by a Reshape".into()))?;
    let n = view.node(r);
    let at = node_label(n);
    if n.op_type != "Reshape" {
        return Err(split_refused(&at, format!("{at} is not a Reshape")));
    }
    let x = n
        .input
        .first()
        .ok_or_else(|| split_refused(&at, "Reshape without input".into()))?;
    let (Some(xs), Some(rs)) = (view.shape(x), view.shape(source)) else {
        return Err(split_refused(
            &at,
            format!("shape of {at} input or output unknown"),
        ));
    };
    let not_split = || {
        split_refused(
            &at,
            format!(
                "{at} reshapes {} to {}, not [B, L, H·D] to [B, L, H, D]",
                shape_str(xs),
                shape_str(rs)
            ),
        )
    };
    if xs.len() != 3 || rs.len() != 4 {
        return Err(not_split());
    }
    let (Some(h), Some(d)) = (rs[2].as_known(), rs[3].as_known()) else {
        return Err(split_refused(
            &at,
            format!("{at}: heads/head size not static in {}", shape_str(rs)),
        ));
    };
    // A hostile file can declare huge head counts; H·D that overflows cannot be a real split.
    let Some(hd) = h.checked_mul(d) else {
        return Err(split_refused(
            &at,
            format!("{at}: heads × head size {h} × {d} overflows"),
        ));
    };
    if xs[0] != rs[0] || xs[1] != rs[1] || !xs[2].is(hd) {
        return Err(not_split());
    }
    Ok((x.clone(), h, d))
}

fn merge_refused(at: impl Into<String>, found: impl Into<String>) -> Mismatch {
    Mismatch::new(
        at,
        Check::HeadLayout,
        "Reshape(Transpose[0, 2, 1, 3](context), [B, Lq, H·Dv])",
        found,
    )
}

/// `out3 = Reshape(Transpose(ctx, [0, 2, 1, 3]), [B, Lq, H·Dv])`, skip-through nodes allowed
/// between; returns the nodes from the context to `out3` and `out3`.
fn head_merge(
    view: &GraphView,
    ctx: &str,
    qs: &[Dim],
    vs: &[Dim],
) -> Result<(Vec<usize>, String), Mismatch> {
    let here = format!("'{ctx}'");
    let (t, mut nodes) = view
        .sole_reader(ctx)
        .map_err(|why| merge_refused(here, format!("context {why}")))?;
    let tn = view.node(t);
    let tl = node_label(tn);
    if tn.op_type != "Transpose" || attr::ints(tn, "perm").ok().flatten() != Some(&[0, 2, 1, 3][..])
    {
        return Err(merge_refused(
            &tl,
            format!("context is not followed by Transpose[0, 2, 1, 3] ({tl})"),
        ));
    }
    let t_out = tn
        .output
        .first()
        .ok_or_else(|| merge_refused(&tl, "merge Transpose has no output"))?;
    let (r, skipped) = view
        .sole_reader(t_out)
        .map_err(|why| merge_refused(&tl, format!("merge Transpose {why}")))?;
    let rn = view.node(r);
    let rl = node_label(rn);
    if rn.op_type != "Reshape" {
        return Err(merge_refused(
            &rl,
            format!("merge Transpose is not followed by a Reshape ({rl})"),
        ));
    }
    let r_out = rn
        .output
        .first()
        .ok_or_else(|| merge_refused(&rl, "merge Reshape has no output"))?;
    let os = view
        .shape(r_out)
        .ok_or_else(|| merge_refused(&rl, "merge Reshape output shape unknown"))?;
    let hd = qs[1]
        .mul(&vs[3])
        .ok_or_else(|| merge_refused(&rl, "overflow"))?;
    if os.len() != 3 || os[0] != qs[0] || os[1] != qs[2] || os[2] != hd {
        return Err(merge_refused(
            &rl,
            format!("merge Reshape gives {}, not [B, Lq, H·Dv]", shape_str(os)),
        ));
    }
    nodes.extend(skipped);
    nodes.extend([t, r]);
    Ok((nodes, r_out.clone()))
}
