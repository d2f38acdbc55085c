//! The attention rule, composed of named pieces:
//!
//! ```text
//! HeadMerge( Context( Probs( Softmax( Mask*( ScoreScale*( Scores(Q·s, Kᵀ·s) ) ) ) ), V ) )
//! ```
//!
//! - [`context`]: `MatMul(probs, V)`;
//! - [`probs`]: the Softmax, possibly followed by no-op casts or the NaN guard SDPA exports add;
//! - mask layers: `Add(scores, term)` (additive), `Where(cond, fill, scores)` (masked_fill);
//!   a layer proven causal by [`crate::causal`] becomes `is_causal`, an all-zero term is
//!   dropped;
//! - softcap `c · tanh(x / c)` below the masks (ONNX applies it before the mask), and
//!   same-type `Cast`s anywhere on the scores path (the ONNX expansions' softmax_precision);
//! - [`score_scale`]: `Mul`/`Div` by a number known before run time;
//! - [`scores`]: `MatMul(Q, Kᵀ)`, with the scale possibly split over Q and Kᵀ;
//! - head split / merge / GQA repeat: checked by shape reasoning in [`check`] so the emitted
//!   node can take the 3-D projections directly.
//!
//! `check()` proves every predicate or returns a [`Reject`] naming the node and the reason.

use std::collections::BTreeSet;

use attnrt_onnx::{attr, node_label, NodeProto};

use crate::graph::{shape_str, Dim, GraphView};
use crate::pattern::{alt, any, match_tensor, op, scalar, Captures, Pat};

/// A failed predicate: the node it is about and why.
#[derive(Clone, Debug)]
pub struct Reject {
    /// The node (label) the failure is about.
    pub node: String,
    /// What was expected.
    pub reason: String,
}

fn reject(node: impl Into<String>, reason: impl Into<String>) -> Reject {
    Reject {
        node: node.into(),
        reason: reason.into(),
    }
}

fn softmax_last_axis(view: &GraphView, n: &NodeProto) -> Result<(), String> {
    // Before opset 13 Softmax flattens from `axis` (default 1); axis = rank-1 is still the
    // last axis. The caller passes models with opset < 13 only with an explicit axis.
    let axis = attr::int(n, "axis")
        .map_err(|e| e.to_string())?
        .unwrap_or(-1);
    if axis == -1 {
        return Ok(());
    }
    let rank = n
        .input
        .first()
        .and_then(|i| view.rank(i))
        .ok_or("rank of the Softmax input is unknown")?;
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    if axis != rank as i64 - 1 {
        return Err(format!(
            "softmax over axis {axis} of a rank-{rank} tensor, not the last (key) axis"
        ));
    }
    Ok(())
}

fn same_float_cast(view: &GraphView, n: &NodeProto) -> Result<(), String> {
    let to = attr::int(n, "to")
        .map_err(|e| e.to_string())?
        .ok_or("Cast without 'to'")?;
    let from = n
        .input
        .first()
        .and_then(|i| view.elem_type(i))
        .ok_or("input type unknown")?;
    if to != i64::from(from) {
        return Err(format!(
            "casts {} to {}",
            type_name(i64::from(from)),
            type_name(to)
        ));
    }
    Ok(())
}

/// `FLOAT16`, `FLOAT`, … for a `DataType` number (the number itself when unknown).
fn type_name(t: i64) -> String {
    i32::try_from(t)
        .ok()
        .and_then(|t| attnrt_onnx::DataType::try_from(t).ok())
        .map_or_else(|| format!("type {t}"), |d| d.as_str_name().to_string())
}

fn zero_fill(view: &GraphView, n: &NodeProto) -> Result<(), String> {
    let v = n
        .input
        .get(1)
        .and_then(|t| view.value(t))
        .and_then(|v| v.scalar_f64());
    if v != Some(0.0) {
        return Err("NaN guard does not replace NaN by 0".into());
    }
    Ok(())
}

/// `Softmax(scores)` over the last axis.
pub fn softmax() -> Pat {
    op("softmax", &["Softmax"], [any("scores")]).check(softmax_last_axis)
}

/// The attention probabilities: the Softmax, or the Softmax followed by exporter no-ops.
pub fn probs() -> Pat {
    alt([
        ("softmax", softmax()),
        // ViT / LLaMA TorchScript: Softmax(dtype=float32) exports Cast→Cast to the same type.
        (
            "cast-cast",
            op(
                "cast2",
                &["Cast"],
                [op("cast1", &["Cast"], [softmax()]).check(same_float_cast)],
            )
            .check(same_float_cast),
        ),
        (
            "cast",
            op("cast1", &["Cast"], [softmax()]).check(same_float_cast),
        ),
        // SDPA exports: Where(IsNaN(p), 0, p). NaN appears only in rows whose every key is
        // masked with -inf (or from NaN inputs); the corrected Attention spec gives 0 there too.
        (
            "nan-guard",
            op(
                "guard",
                &["Where"],
                [
                    op("isnan", &["IsNaN"], [softmax()]),
                    scalar("guard_zero"),
                    softmax(),
                ],
            )
            .check(zero_fill),
        ),
    ])
}

/// `MatMul(probs, V)`.
pub fn context() -> Pat {
    op("context", &["MatMul"], [probs(), any("v")])
}

/// One scale layer: `Mul(x, s)` / `Mul(s, x)` / `Div(x, s)` with `s` known before run time.
pub fn score_scale() -> Pat {
    alt([
        (
            "mul-scale",
            op("scale", &["Mul"], [any("inner"), scalar("factor")]).commutative(),
        ),
        (
            "div-scale",
            op("scale", &["Div"], [any("inner"), scalar("divisor")]),
        ),
    ])
}

/// One mask layer: an additive term, or masked_fill as `Where`.
pub fn mask_layer() -> Pat {
    alt([
        (
            "where",
            op(
                "mask",
                &["Where"],
                [any("cond"), scalar("fill"), any("inner")],
            ),
        ),
        (
            "where-keep",
            op(
                "mask",
                &["Where"],
                [any("cond"), any("inner"), scalar("fill")],
            ),
        ),
        ("add", op("mask", &["Add"], [any("inner"), any("term")])),
        ("add", op("mask", &["Add"], [any("term"), any("inner")])),
    ])
}

/// `MatMul(Q, Kᵀ)` with an optional constant or shape-computed factor on either side.
pub fn scores() -> Pat {
    op(
        "qk",
        &["MatMul"],
        [
            alt([
                (
                    "q-scale",
                    op("q_scale", &["Mul"], [any("q"), scalar("q_factor")]).commutative(),
                ),
                ("q", any("q")),
            ]),
            alt([
                (
                    "k-scale",
                    op("k_scale", &["Mul"], [any("kt"), scalar("k_factor")]).commutative(),
                ),
                ("k", any("kt")),
            ]),
        ],
    )
}

/// How the scores are masked.
#[derive(Clone, Debug, PartialEq)]
pub enum MaskLayer {
    /// `scores + term`.
    Add { node: usize, term: String },
    /// `Where(cond, fill, scores)` (`masked_when_true`) or `Where(cond, scores, fill)`.
    Fill {
        node: usize,
        cond: String,
        fill: String,
        fill_value: f64,
        masked_when_true: bool,
    },
}

/// What produced a tensor on the scores path (for `qk_matmul_output`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    MatMul,
    Cast,
    Scale,
    Softcap,
    MaskAdd,
    MaskFill,
}

/// The `qk_matmul_output_mode` (ONNX 1.22 numbering, as attnrt's runtime implements it) whose
/// value the scores-path tensor `t` holds: 0 the scaled QK, 1 after the softcap, 2 after the
/// (single, additive) mask, 3 the Softmax output. `path` runs from the Softmax input down.
fn qk_stage(path: &[(String, Stage)], softmax_out: &str, t: &str) -> Option<i64> {
    if t == softmax_out {
        return Some(3);
    }
    let masks = path
        .iter()
        .filter(|(_, s)| matches!(s, Stage::MaskAdd | Stage::MaskFill))
        .count();
    let mut mode = None;
    let mut scales_left = path.iter().filter(|(_, s)| *s == Stage::Scale).count();
    // Walk up from the MatMul, carrying the stage through same-type Casts.
    for (name, stage) in path.iter().rev() {
        mode = match stage {
            Stage::MatMul => (scales_left == 0).then_some(0),
            Stage::Cast => mode,
            Stage::Scale => {
                scales_left -= 1;
                (scales_left == 0).then_some(0)
            }
            Stage::Softcap => Some(1),
            // Where(cond, fill, x) is not `x + mask`, and two masks are summed in another order.
            Stage::MaskAdd if masks == 1 => Some(2),
            Stage::MaskAdd | Stage::MaskFill => None,
        };
        if name == t {
            return mode;
        }
    }
    None
}

/// The attention layout the fused node will use.
#[derive(Clone, Debug, PartialEq)]
pub enum Layout {
    /// 4-D Q/K/V `[B, H, L, D]`.
    FourD,
    /// 3-D Q/K/V `[B, L, H·D]` (head split and merge absorbed).
    ThreeD { q_heads: i64, kv_heads: i64 },
    /// 3-D batched `(N, L, d)` MatMuls (nn.MultiheadAttention): wrapped as 4-D with B = 1.
    Batched,
}

/// A proven attention block, ready to rewrite.
#[derive(Clone, Debug)]
pub struct AttentionMatch {
    /// The Softmax node index.
    pub softmax: usize,
    /// Nodes replaced by the fused node (their intermediate outputs are used nowhere else).
    pub core: BTreeSet<usize>,
    /// The tensor the fused node produces (same name as in the original graph).
    pub output: String,
    /// Q input.
    pub q: String,
    /// K input source, and the perm to apply to it (`None` when it is already K).
    pub k: (String, Option<Vec<i64>>),
    /// V input.
    pub v: String,
    /// Layout.
    pub layout: Layout,
    /// The scale to emit (`None`: the op's default 1/sqrt(head_size)).
    pub scale_attr: Option<f32>,
    /// The effective scale factor.
    pub scale: f64,
    /// Mask layers, innermost (closest to the QK MatMul) first.
    pub masks: Vec<MaskLayer>,
    /// Variant tags (for the report).
    pub tags: Vec<String>,
    /// Known deviations from the original on edge inputs.
    pub caveats: Vec<String>,
    /// Heads of Q and K/V when known.
    pub heads: (Option<i64>, Option<i64>),
    /// Whether the mask must be expanded to `[.., Lq, Lk]`: ONNX Runtime's Attention kernel
    /// does not broadcast the mask's last two axes although the spec allows it.
    pub expand_mask: bool,
    /// Whether a mask layer was proven to be the causal triangle (emitted as `is_causal=1`).
    pub is_causal: bool,
    /// Why `is_causal` was or was not used (`None` when the block has no mask).
    pub causal_note: Option<String>,
    /// `softcap · tanh(scores / softcap)` between the scale and the mask.
    pub softcap: Option<f32>,
    /// A scores-path tensor also read outside the block, produced as the fused node's
    /// `qk_matmul_output`, with its `qk_matmul_output_mode`.
    pub qk_output: Option<(String, i64)>,
    /// Static shapes known for Q, K, V inputs (recorded as value_info so ONNX shape inference
    /// can type the fused node when the graph itself does not say).
    pub input_shapes: Vec<(String, i32, Vec<Dim>)>,
}

/// A tensor `t` seen through a chain of Transposes: `t = transpose(source, perm)`.
fn through_transposes(view: &GraphView, t: &str, rank: usize) -> (String, Vec<i64>) {
    let mut perm: Vec<i64> = (0..rank as i64).collect();
    let mut cur = t.to_string();
    for _ in 0..6 {
        let Some(p) = view.producer(&cur) else { break };
        let n = view.node(p);
        // The ONNX expansions name K `PresentKey = Identity(KReshaped)`.
        if n.op_type == "Identity" && attnrt_onnx::opset::is_default_domain(&n.domain) {
            match n.input.first() {
                Some(i) => {
                    cur = i.clone();
                    continue;
                }
                None => break,
            }
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
    let outer = view.node(view.producer(t)?);
    let tr = view.node(view.producer(outer.input.first()?)?);
    if tr.op_type != "Transpose" || attr::ints(tr, "perm").ok().flatten() != Some(&[0, 2, 1][..]) {
        return None;
    }
    let inner = view.node(view.producer(tr.input.first()?)?);
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

/// The 3-D tensor `X [B, L, H·D]` behind `t4 = Transpose(Reshape(X, [B, L, H, D]), perm)`
/// where the composite perm is `[0, 2, 1, 3]`; returns `(X, H, D)`.
fn head_split(view: &GraphView, source: &str, perm: &[i64]) -> Result<(String, i64, i64), String> {
    if perm != [0, 2, 1, 3] {
        return Err(format!("head split perm {perm:?} is not [0, 2, 1, 3]"));
    }
    let r = view.producer(source).ok_or("not produced by a Reshape")?;
    let n = view.node(r);
    if n.op_type != "Reshape" {
        return Err(format!("{} is not a Reshape", node_label(n)));
    }
    let x = n.input.first().ok_or("Reshape without input")?;
    let (Some(xs), Some(rs)) = (view.shape(x), view.shape(source)) else {
        return Err(format!(
            "shape of {} input or output unknown",
            node_label(n)
        ));
    };
    if xs.len() != 3 || rs.len() != 4 {
        return Err(format!(
            "{} reshapes {} to {}, not [B, L, H·D] to [B, L, H, D]",
            node_label(n),
            shape_str(xs),
            shape_str(rs)
        ));
    }
    let (Some(h), Some(d)) = (rs[2].as_known(), rs[3].as_known()) else {
        return Err(format!(
            "{}: heads/head size not static in {}",
            node_label(n),
            shape_str(rs)
        ));
    };
    // A hostile file can declare huge head counts; H·D that overflows cannot be a real split.
    let Some(hd) = h.checked_mul(d) else {
        return Err(format!(
            "{}: heads × head size {h} × {d} overflows",
            node_label(n)
        ));
    };
    if xs[0] != rs[0] || xs[1] != rs[1] || !xs[2].is(hd) {
        return Err(format!(
            "{} reshapes {} to {}, not [B, L, H·D] to [B, L, H, D]",
            node_label(n),
            shape_str(xs),
            shape_str(rs)
        ));
    }
    Ok((x.clone(), h, d))
}

/// GQA: `k4 = Reshape(Expand(Unsqueeze(kv, [2]), [B, Hkv, n, L, D]), [B, Hkv·n, L, D])`;
/// returns `(kv, nodes of the repeat)`.
fn unrepeat(view: &GraphView, k4: &str) -> Option<(String, Vec<usize>)> {
    let r = view.producer(k4)?;
    let rn = view.node(r);
    if rn.op_type != "Reshape" {
        return None;
    }
    let e = view.producer(rn.input.first()?)?;
    let en = view.node(e);
    if en.op_type != "Expand" {
        return None;
    }
    let u = view.producer(en.input.first()?)?;
    let un = view.node(u);
    if un.op_type != "Unsqueeze" {
        return None;
    }
    let axes = match attr::ints(un, "axes").ok().flatten() {
        Some(a) => a.to_vec(),
        None => view.value(un.input.get(1)?)?.known_ints()?,
    };
    if axes != [2] {
        return None;
    }
    let kv = un.input.first()?;
    let (ks, es, os) = (view.shape(kv)?, view.shape(&en.output[0])?, view.shape(k4)?);
    if ks.len() != 4 || es.len() != 5 || os.len() != 4 {
        return None;
    }
    let n = &es[2];
    let ok = es[0] == ks[0]
        && es[1] == ks[1]
        && es[3] == ks[2]
        && es[4] == ks[3]
        && os[0] == ks[0]
        && Some(&os[1]) == ks[1].mul(n).as_ref()
        && os[2] == ks[2]
        && os[3] == ks[3];
    ok.then(|| (kv.clone(), vec![r, e, u]))
}

/// Whether a mask of `mask` shape broadcasts into `scores` without enlarging it.
fn mask_fits(mask: &[Dim], scores: &[Dim]) -> Result<(), String> {
    if mask.len() > scores.len() {
        return Err(format!(
            "mask rank {} exceeds scores rank {}",
            mask.len(),
            scores.len()
        ));
    }
    let off = scores.len() - mask.len();
    for (i, m) in mask.iter().enumerate() {
        let s = &scores[off + i];
        let ok = m == s
            || m.is(1)
            || (s.as_known().is_some_and(|v| v > 1)
                && m.as_known().is_none_or(|mv| mv == s.as_known().unwrap()));
        if !ok {
            return Err(format!(
                "mask {} does not broadcast to scores {} (dim {} may enlarge them)",
                shape_str(mask),
                shape_str(scores),
                off + i
            ));
        }
    }
    Ok(())
}

/// Checks the attention rule rooted at the Softmax node `sm`. With `strict`, a causal proof
/// that would add a caveat is not used (the mask is fused as it is).
pub fn check(view: &GraphView, sm: usize, strict: bool) -> Result<AttentionMatch, Reject> {
    let smn = view.node(sm);
    let sm_label = node_label(smn);
    let sm_out = smn
        .output
        .first()
        .ok_or_else(|| reject(&sm_label, "Softmax has no output"))?;
    softmax_last_axis(view, smn).map_err(|r| reject(&sm_label, r))?;

    // Context: find the MatMul fed (through no-ops) by this Softmax, then match downwards-up.
    let mut frontier = vec![sm_out.clone()];
    let mut ctx = None;
    for _ in 0..3 {
        let mut next = Vec::new();
        for t in &frontier {
            for &c in view.consumers(t) {
                let n = view.node(c);
                if n.op_type == "MatMul" && n.input.first() == Some(t) {
                    ctx.get_or_insert(c);
                }
                next.extend(n.output.iter().cloned());
            }
        }
        frontier = next;
    }
    let ctx = ctx.ok_or_else(|| {
        reject(
            &sm_label,
            "the Softmax output does not reach a MatMul with V (as its first input)",
        )
    })?;
    let ctx_out = view.node(ctx).output.first().cloned().ok_or_else(|| {
        reject(
            node_label(view.node(ctx)),
            "the context MatMul has no output",
        )
    })?;
    let mut caps = Captures::default();
    match_tensor(view, &ctx_out, &context(), &mut caps)
        .map_err(|f| reject(node_label(view.node(ctx)), f.reason))?;
    if caps.node("softmax") != Some(sm) {
        return Err(reject(
            node_label(view.node(ctx)),
            "the context MatMul is fed by another Softmax",
        ));
    }
    let mut tags: Vec<String> = caps
        .tags
        .iter()
        .filter(|t| **t != "softmax")
        .map(|t| t.to_string())
        .collect();
    let mut core: BTreeSet<usize> = caps.nodes.values().copied().collect();

    // Mask and scale layers between the QK MatMul and the Softmax.
    let mut masks: Vec<MaskLayer> = Vec::new();
    let mut scale = 1.0f64;
    let mut scale_computed = false;
    let mut scale_seen = false;
    let mut softcap: Option<f32> = None;
    // The tensors from the Softmax input down to the QK MatMul, with what produced each.
    let mut path: Vec<(String, Stage)> = Vec::new();
    let mut cur = caps.tensor("scores").unwrap_or_default().to_string();
    let qk_caps = loop {
        let p = view.producer(&cur).ok_or_else(|| {
            reject(
                &sm_label,
                format!("scores '{cur}' are not computed by a node"),
            )
        })?;
        let pn = view.node(p);
        if pn.op_type == "MatMul" {
            let mut c = Captures::default();
            match_tensor(view, &cur, &scores(), &mut c)
                .map_err(|f| reject(node_label(pn), f.reason))?;
            path.push((cur.clone(), Stage::MatMul));
            break c;
        }
        // softmax_precision in the ONNX expansions: a Cast to the type the scores already have
        // is the identity; one that changes the type changes the arithmetic and stays out.
        if pn.op_type == "Cast" {
            same_float_cast(view, pn).map_err(|r| {
                reject(
                    node_label(pn),
                    format!(
                        "Cast between the QK MatMul and the Softmax is not provably the \
                         identity ({r})"
                    ),
                )
            })?;
            if !tags.iter().any(|t| t == "scores-cast") {
                tags.push("scores-cast".into());
            }
            path.push((cur.clone(), Stage::Cast));
            core.insert(p);
            cur = pn
                .input
                .first()
                .cloned()
                .ok_or_else(|| reject(node_label(pn), "Cast without input"))?;
            continue;
        }
        if pn.op_type == "Mul" {
            if let Some((cap, nodes, inner)) = softcap_layer(view, p) {
                if softcap.is_some() {
                    return Err(reject(node_label(pn), "a second softcap"));
                }
                if scale_seen {
                    return Err(reject(
                        node_label(pn),
                        "a scale applied after the softcap cannot be expressed by the op",
                    ));
                }
                softcap = Some(cap);
                tags.push("softcap".into());
                path.push((cur.clone(), Stage::Softcap));
                core.extend(nodes);
                cur = inner;
                continue;
            }
        }
        if matches!(pn.op_type.as_str(), "Mul" | "Div") {
            let mut c = Captures::default();
            match_tensor(view, &cur, &score_scale(), &mut c)
                .map_err(|f| reject(node_label(pn), f.reason))?;
            let f = c
                .tensor("factor")
                .or(c.tensor("divisor"))
                .unwrap_or_default();
            let v = view
                .value(f)
                .and_then(|v| v.scalar_f64())
                .unwrap_or(f64::NAN);
            scale_computed |= !view.is_constant(f);
            scale = if c.tensor("divisor").is_some() {
                scale / v
            } else {
                scale * v
            };
            tags.extend(c.tags.iter().map(|t| t.to_string()));
            path.push((cur.clone(), Stage::Scale));
            core.insert(p);
            scale_seen = true;
            cur = c.tensor("inner").unwrap_or_default().to_string();
            continue;
        }
        if matches!(pn.op_type.as_str(), "Add" | "Where") {
            if scale_seen {
                return Err(reject(
                    node_label(pn),
                    "a mask applied before the scale would be scaled too",
                ));
            }
            // ONNX Attention applies the softcap before the mask.
            if softcap.is_some() {
                return Err(reject(
                    node_label(pn),
                    "a mask applied before the softcap would be capped too",
                ));
            }
            // Which Add operand is the scores path: the one a MatMul/Mul/Div/Add/Where chain
            // reaches the QK MatMul through. Try both; the first that continues wins.
            let mut c = Captures::default();
            match_tensor(view, &cur, &mask_layer(), &mut c)
                .map_err(|f| reject(node_label(pn), f.reason))?;
            let inner = c.tensor("inner").unwrap_or_default().to_string();
            if c.has_tag("add") {
                let a = &pn.input[0];
                let b = &pn.input[1];
                let leads = |t: &str| reaches_matmul(view, t, 8);
                let (inner, term) = if leads(a) {
                    (a.clone(), b.clone())
                } else if leads(b) {
                    (b.clone(), a.clone())
                } else {
                    return Err(reject(
                        node_label(pn),
                        "neither Add operand leads to the QK MatMul",
                    ));
                };
                masks.push(MaskLayer::Add { node: p, term });
                path.push((cur.clone(), Stage::MaskAdd));
                core.insert(p);
                cur = inner;
                continue;
            }
            let fill = c.tensor("fill").unwrap_or_default().to_string();
            let fill_value = view
                .value(&fill)
                .and_then(|v| v.scalar_f64())
                .unwrap_or(f64::NAN);
            masks.push(MaskLayer::Fill {
                node: p,
                cond: c.tensor("cond").unwrap_or_default().to_string(),
                fill,
                fill_value,
                masked_when_true: c.has_tag("where"),
            });
            path.push((cur.clone(), Stage::MaskFill));
            core.insert(p);
            cur = inner;
            continue;
        }
        return Err(reject(
            node_label(pn),
            format!(
                "{} between the QK MatMul and the Softmax is not a scale or mask",
                pn.op_type
            ),
        ));
    };
    masks.reverse();
    // An additive term that is provably all zeros changes nothing (x + 0 = x, also for -0):
    // drop it, unless it would broadcast the scores to a larger shape.
    let qk_out = qk_caps
        .tensor("qk")
        .and_then(|t| view.shape(t))
        .map(<[Dim]>::to_vec);
    masks.retain(|m| {
        let MaskLayer::Add { term, .. } = m else {
            return true;
        };
        let fits =
            matches!((view.shape(term), &qk_out), (Some(s), Some(q)) if mask_fits(s, q).is_ok());
        let zero = fits && crate::causal::is_zero(view, term);
        if zero {
            tags.push("zero-mask-dropped".into());
        }
        !zero
    });
    tags.extend(
        qk_caps
            .tags
            .iter()
            .filter(|t| !matches!(**t, "q" | "k"))
            .map(|t| t.to_string()),
    );
    core.extend(qk_caps.nodes.values().copied());
    for f in ["q_factor", "k_factor"] {
        if let Some(t) = qk_caps.tensor(f) {
            let v = view
                .value(t)
                .and_then(|v| v.scalar_f64())
                .unwrap_or(f64::NAN);
            scale_computed |= !view.is_constant(t);
            scale *= v;
            scale_seen = true;
        }
    }
    let qk = qk_caps.node("qk").unwrap_or(0);
    let qk_label = node_label(view.node(qk));
    if !scale.is_finite() || scale <= 0.0 {
        return Err(reject(
            &qk_label,
            format!("scale {scale} is not a positive finite number"),
        ));
    }
    let q = qk_caps.tensor("q").unwrap_or_default().to_string();
    let kt = qk_caps.tensor("kt").unwrap_or_default().to_string();
    let v = caps.tensor("v").unwrap_or_default().to_string();

    // Ranks and shapes.
    let (Some(qs), Some(kts), Some(vs)) = (view.shape(&q), view.shape(&kt), view.shape(&v)) else {
        return Err(reject(
            &qk_label,
            "shapes of Q, Kᵀ or V are unknown (cannot prove the layout)",
        ));
    };
    let rank = qs.len();
    if !(rank == 3 || rank == 4) || kts.len() != rank || vs.len() != rank {
        return Err(reject(
            &qk_label,
            format!(
                "Q {}, Kᵀ {}, V {}: expected all rank 4 (or all rank 3)",
                shape_str(qs),
                shape_str(kts),
                shape_str(vs)
            ),
        ));
    }
    let (k_src, kt_perm) = through_transposes(view, &kt, rank);
    // K = Kᵀ with its last two axes swapped = transpose(k_src, kt_perm ∘ swap).
    let mut k_perm = kt_perm.clone();
    k_perm.swap(rank - 2, rank - 1);
    let identity: Vec<i64> = (0..rank as i64).collect();
    let mut k_input = (
        k_src.clone(),
        if k_perm == identity {
            None
        } else {
            Some(k_perm.clone())
        },
    );
    let k_shape: Vec<Dim> = {
        let mut s = kts.to_vec();
        s.swap(rank - 2, rank - 1);
        s
    };

    let mut caveats = Vec::new();
    let mut layout = Layout::FourD;
    let mut output = caps.tensor("context").unwrap_or_default().to_string();
    let mut heads = (None, None);
    let mut q_in = q.clone();
    let mut v_in = v.clone();
    if rank == 3 {
        if !(qs[0] == k_shape[0] && qs[0] == vs[0]) {
            return Err(reject(
                &qk_label,
                format!(
                    "batched Q {}, K {}, V {}: first dims not provably equal",
                    shape_str(qs),
                    shape_str(&k_shape),
                    shape_str(vs)
                ),
            ));
        }
        layout = Layout::Batched;
        tags.push("batched-3d".into());
    } else {
        // GQA: K/V repeated to the Q heads; use them before the repeat.
        let mut k4 = k_shape.clone();
        let mut v4 = vs.to_vec();
        // Both K and V, or neither: the op takes one kv_num_heads.
        let k_un = if k_input.1.is_none() {
            unrepeat(view, &k_input.0)
        } else {
            None
        };
        let v_un = unrepeat(view, &v);
        if let (Some((kv, _)), Some((vv, _))) = (k_un, v_un) {
            let (Some(ks), Some(vvs)) = (view.shape(&kv), view.shape(&vv)) else {
                return Err(reject(
                    &qk_label,
                    "shapes of K/V before the GQA repeat unknown",
                ));
            };
            k4 = ks.to_vec();
            v4 = vvs.to_vec();
            k_input = (kv, None);
            v_in = vv;
            tags.push("gqa".into());
        }
        if !(qs[0] == k4[0] && qs[0] == v4[0]) {
            return Err(reject(
                &qk_label,
                format!(
                    "batch of Q {}, K {}, V {} not provably equal",
                    shape_str(qs),
                    shape_str(&k4),
                    shape_str(&v4)
                ),
            ));
        }
        if k4[1] != v4[1] {
            return Err(reject(
                &qk_label,
                format!(
                    "K {} and V {} have different heads",
                    shape_str(&k4),
                    shape_str(&v4)
                ),
            ));
        }
        let hq = qs[1].as_known();
        let hk = k4[1].as_known();
        // Without a recognised repeat, MatMul broadcasting allows only equal heads or one
        // K/V head; after un-repeating, the Q heads are a multiple of the K/V heads.
        let unrepeated = tags.iter().any(|t| t == "gqa");
        let heads_ok = qs[1] == k4[1]
            || k4[1].is(1)
            || (unrepeated && matches!((hq, hk), (Some(a), Some(b)) if b > 0 && a % b == 0));
        if !heads_ok {
            return Err(reject(
                &qk_label,
                format!(
                    "heads of Q {} and K {} do not match (nor divide for GQA)",
                    shape_str(qs),
                    shape_str(&k4)
                ),
            ));
        }
        heads = (hq, hk);
        // Head split / merge: absorb to 3-D when all of Q, K, V come from [B, L, H·D] and the
        // output goes back to [B, L, H·Dv].
        let (qsrc, qperm) = through_transposes(view, &q, 4);
        let (vsrc, vperm) = through_transposes(view, &v_in, 4);
        let kperm = k_input.1.clone().unwrap_or_else(|| identity.clone());
        let (ksrc_for_split, kperm_for_split) = match &k_input.1 {
            Some(_) => (k_input.0.clone(), kperm),
            None => through_transposes(view, &k_input.0, 4),
        };
        let splits = (
            head_split(view, &qsrc, &qperm),
            head_split(view, &ksrc_for_split, &kperm_for_split),
            head_split(view, &vsrc, &vperm),
        );
        let merge = head_merge(view, &output, qs, &v4);
        match (splits, merge) {
            ((Ok((xq, hq3, dq)), Ok((xk, hk3, dk)), Ok((xv, hv3, _))), Ok((t, r, out3)))
                if dq == dk && hk3 == hv3 =>
            {
                layout = Layout::ThreeD {
                    q_heads: hq3,
                    kv_heads: hk3,
                };
                q_in = xq;
                k_input = (xk, None);
                v_in = xv;
                core.insert(t);
                core.insert(r);
                output = out3;
                tags.push("3d".into());
            }
            (s, m) => {
                let why = [s.0.err(), s.1.err(), s.2.err(), m.err()]
                    .into_iter()
                    .flatten()
                    .next()
                    .unwrap_or_default();
                tags.push(format!("4d ({why})"));
            }
        }
    }

    // Masks: every term must broadcast into the scores without enlarging them.
    let scores_shape = view
        .shape(&view.node(qk).output[0])
        .ok_or_else(|| reject(&qk_label, "scores shape unknown"))?
        .to_vec();
    // qk_matmul_output: one scores-path tensor that is also read outside the block (the ONNX
    // expansions' `qk_matmul_output`) can be the fused node's 4th output when it holds one of
    // the op's stages.
    let softmax_out = sm_out.clone();
    let mut tap: Option<(String, i64)> = None;
    for t in path
        .iter()
        .map(|(t, _)| t.as_str())
        .chain(std::iter::once(softmax_out.as_str()))
    {
        let outside =
            view.is_graph_output(t) || view.consumers(t).iter().any(|c| !core.contains(c));
        if !outside {
            continue;
        }
        match qk_stage(&path, &softmax_out, t) {
            Some(mode) if tap.is_none() => tap = Some((t.to_string(), mode)),
            _ => {
                let p = view
                    .producer(t)
                    .map(|p| node_label(view.node(p)))
                    .unwrap_or_default();
                return Err(reject(
                    p,
                    format!(
                        "intermediate '{t}' is also used outside the block and is not one \
                         qk_matmul_output stage of the Attention op"
                    ),
                ));
            }
        }
    }
    if let Some((_, mode)) = &tap {
        tags.push(format!("qk_matmul_output={mode}"));
    }

    // Causal: a mask layer proven to be exactly "key j visible iff j ≤ i" becomes is_causal,
    // and what else the layer masked stays as attn_mask.
    let base_caveats = mask_caveats(view, &masks, &scores_shape)?;
    let mut is_causal = false;
    let mut causal_note = None;
    if matches!(tap, Some((_, 2))) {
        causal_note = Some(
            "is_causal not used: the block's qk_matmul_output (mode 2) must hold the mask as it is"
                .to_string(),
        );
    } else if !masks.is_empty() {
        match crate::causal::prove(view, &masks, &scores_shape) {
            Ok(proof) => {
                let mut with = masks.clone();
                match proof.replacement {
                    Some(l) => with[proof.layer] = l,
                    None => {
                        with.remove(proof.layer);
                    }
                }
                match mask_caveats(view, &with, &scores_shape) {
                    Ok(mut c) => {
                        if let Some(pc) = &proof.caveat {
                            // The causal caveat says it for the remaining padding fill too.
                            c.retain(|x| {
                                base_caveats.contains(x) || !x.starts_with("masked_fill(")
                            });
                            c.push(pc.clone());
                        }
                        let added: Vec<&String> =
                            c.iter().filter(|x| !base_caveats.contains(x)).collect();
                        if strict && !added.is_empty() {
                            causal_note = Some(format!(
                                "is_causal not used: strict, and it would add the caveat: {}",
                                added
                                    .iter()
                                    .map(|s| s.as_str())
                                    .collect::<Vec<_>>()
                                    .join("; ")
                            ));
                        } else {
                            masks = with;
                            caveats.extend(c);
                            is_causal = true;
                            tags.push("causal".into());
                            causal_note = Some(format!("is_causal=1: {}", proof.how));
                        }
                    }
                    Err(r) => {
                        causal_note = Some(format!(
                            "is_causal not used: the remaining mask does not fit: {}",
                            r.reason
                        ))
                    }
                }
            }
            Err(why) => causal_note = Some(format!("is_causal not used: {why}")),
        }
    }
    if !is_causal {
        caveats.extend(base_caveats);
    }
    caveats.dedup();
    let mut expand_mask = false;
    if !masks.is_empty() {
        let parts: Vec<Vec<Dim>> = masks
            .iter()
            .flat_map(|m| match m {
                MaskLayer::Add { term, .. } => vec![term.clone()],
                MaskLayer::Fill { cond, fill, .. } => vec![cond.clone(), fill.clone()],
            })
            .filter_map(|t| view.shape(&t).map(<[Dim]>::to_vec))
            .collect();
        let combined = parts
            .iter()
            .skip(1)
            .try_fold(parts[0].clone(), |a, b| crate::graph::broadcast(&a, b));
        let r = scores_shape.len();
        expand_mask = match combined {
            Some(c) if c.len() >= 2 => {
                c[c.len() - 2] != scores_shape[r - 2] || c[c.len() - 1] != scores_shape[r - 1]
            }
            _ => true,
        };
    }

    // Scale: omit only when computed at run time and equal to the default 1/sqrt(head_size).
    let head_size = qs[rank - 1].as_known();
    let default = head_size.map(|d| 1.0 / (d as f64).sqrt());
    let scale_attr = if !scale_seen {
        tags.push("no-scale".into());
        Some(1.0)
    } else if scale_computed && default.is_some_and(|d| ((d - scale) / d).abs() < 1e-6) {
        tags.push("runtime-scale=default".into());
        None
    } else {
        Some(scale as f32)
    };

    // Exclusivity: intermediates are consumed only inside the match and are not outputs
    // (except the qk_matmul_output tap, which the fused node produces).
    if tap.is_some() && layout == Layout::Batched {
        return Err(reject(
            &qk_label,
            "qk_matmul_output of batched 3-D attention would have another rank",
        ));
    }
    for &n in &core {
        for o in &view.node(n).output {
            if o == &output || o.is_empty() || tap.as_ref().is_some_and(|(t, _)| t == o) {
                continue;
            }
            if view.is_graph_output(o) {
                return Err(reject(
                    node_label(view.node(n)),
                    format!("intermediate '{o}' is a graph output"),
                ));
            }
            if let Some(&c) = view.consumers(o).iter().find(|c| !core.contains(c)) {
                return Err(reject(
                    node_label(view.node(n)),
                    format!(
                        "intermediate '{o}' is also used by {}",
                        node_label(view.node(c))
                    ),
                ));
            }
        }
    }

    let input_shapes: Vec<(String, i32, Vec<Dim>)> =
        [q_in.clone(), k_input.0.clone(), v_in.clone()]
            .into_iter()
            .filter_map(|t| Some((t.clone(), view.elem_type(&t)?, view.shape(&t)?.to_vec())))
            .collect();
    Ok(AttentionMatch {
        softmax: sm,
        core,
        output,
        q: q_in,
        k: k_input,
        v: v_in,
        layout,
        scale_attr,
        scale,
        masks,
        tags,
        caveats,
        heads,
        expand_mask,
        is_causal,
        causal_note,
        softcap,
        qk_output: tap,
        input_shapes,
    })
}

/// A fill value as a reader wants it: `-3.4028234663852886e38`, not 39 digits.
pub(crate) fn fill_str(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e6 {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// Checks that every mask term broadcasts into the scores without enlarging them and that
/// fills are usable; returns the caveats the masks bring.
fn mask_caveats(
    view: &GraphView,
    masks: &[MaskLayer],
    scores_shape: &[Dim],
) -> Result<Vec<String>, Reject> {
    let mut caveats = Vec::new();
    for m in masks {
        let parts: Vec<&String> = match m {
            MaskLayer::Add { term, .. } => vec![term],
            MaskLayer::Fill { cond, fill, .. } => vec![cond, fill],
        };
        let node = match m {
            MaskLayer::Add { node, .. } | MaskLayer::Fill { node, .. } => *node,
        };
        for t in parts {
            let s = view.shape(t).ok_or_else(|| {
                reject(
                    node_label(view.node(node)),
                    format!("shape of mask tensor '{t}' unknown"),
                )
            })?;
            mask_fits(s, scores_shape).map_err(|r| reject(node_label(view.node(node)), r))?;
        }
        if let MaskLayer::Fill {
            fill_value, node, ..
        } = m
        {
            if fill_value.is_nan() || *fill_value == f64::INFINITY {
                return Err(reject(
                    node_label(view.node(*node)),
                    format!("mask fill {fill_value} is not -inf or finite"),
                ));
            }
            if *fill_value == f64::NEG_INFINITY {
                caveats.push(
                    "rows with every key masked: 0 from the ONNX Attention op, NaN in PyTorch"
                        .to_string(),
                );
            } else {
                caveats.push(format!(
                    "masked_fill({}) fused as an additive mask: rows with every key masked differ",
                    fill_str(*fill_value)
                ));
            }
        }
    }
    caveats.dedup();
    Ok(caveats)
}

/// `softcap · tanh(x / softcap)` ending at the Mul `mul`: returns the cap, the nodes and `x`.
fn softcap_layer(view: &GraphView, mul: usize) -> Option<(f32, Vec<usize>, String)> {
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
    let t = view.producer(tanh_out)?;
    let tn = view.node(t);
    if tn.op_type != "Tanh" || !attnrt_onnx::opset::is_default_domain(&tn.domain) {
        return None;
    }
    let d = view.producer(tn.input.first()?)?;
    let dn = view.node(d);
    if dn.op_type != "Div" || dn.input.len() != 2 || known(&dn.input[1]) != Some(cap) {
        return None;
    }
    Some((cap as f32, vec![mul, t, d], dn.input[0].clone()))
}

/// `out3 = Reshape(Transpose(ctx, [0, 2, 1, 3]), [B, Lq, H·Dv])`; returns the Transpose and
/// Reshape node indices and `out3`.
fn head_merge(
    view: &GraphView,
    ctx: &str,
    qs: &[Dim],
    vs: &[Dim],
) -> Result<(usize, usize, String), String> {
    let cons = view.consumers(ctx);
    let [t] = cons else {
        return Err("context has several consumers".into());
    };
    let tn = view.node(*t);
    if tn.op_type != "Transpose" || attr::ints(tn, "perm").ok().flatten() != Some(&[0, 2, 1, 3][..])
    {
        return Err(format!(
            "context is not followed by Transpose[0, 2, 1, 3] ({})",
            node_label(tn)
        ));
    }
    let t_out = tn.output.first().ok_or("merge Transpose has no output")?;
    let tcons = view.consumers(t_out);
    let [r] = tcons else {
        return Err("merge Transpose has several consumers".into());
    };
    let rn = view.node(*r);
    if rn.op_type != "Reshape" {
        return Err(format!(
            "merge Transpose is not followed by a Reshape ({})",
            node_label(rn)
        ));
    }
    let r_out = rn.output.first().ok_or("merge Reshape has no output")?;
    let os = view
        .shape(r_out)
        .ok_or("merge Reshape output shape unknown")?;
    let hd = qs[1].mul(&vs[3]).ok_or("overflow")?;
    if os.len() != 3 || os[0] != qs[0] || os[1] != qs[2] || os[2] != hd {
        return Err(format!(
            "merge Reshape gives {}, not [B, Lq, H·Dv]",
            shape_str(os)
        ));
    }
    Ok((*t, *r, r_out.clone()))
}

/// Whether `t` reaches a MatMul through at most `depth` Mul/Div/Add/Where nodes.
fn reaches_matmul(view: &GraphView, t: &str, depth: usize) -> bool {
    let Some(p) = view.producer(t) else {
        return false;
    };
    let n = view.node(p);
    match n.op_type.as_str() {
        "MatMul" => true,
        "Mul" | "Div" | "Add" | "Where" | "Cast" | "Tanh" if depth > 0 => {
            let inputs: Vec<&String> = if n.op_type == "Where" {
                n.input.iter().skip(1).collect()
            } else {
                n.input.iter().collect()
            };
            inputs
                .iter()
                .any(|i| view.value(i).is_none() && reaches_matmul(view, i, depth - 1))
        }
        _ => false,
    }
}
