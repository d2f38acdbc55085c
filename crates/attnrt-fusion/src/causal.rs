//! Proving that a mask layer is the causal triangle, so the fused node can say `is_causal=1`
//! (the kernel then skips every key block above the diagonal) instead of reading a mask.
//!
//! ONNX `Attention` (opset 23) with `is_causal=1` and no `past_key` lets query `i` see key `j`
//! iff `j ≤ i` (offset 0). This module evaluates the tensors a mask is built from in a small
//! abstract domain — a `Tri` holds one value on and below the diagonal (`j ≤ i`) and one
//! above it, for the last two axes — and accepts a layer only when every step is proven:
//!
//! - constants (initializers, `Constant`) are checked element by element, and may be cut to
//!   the sequence length by `Slice`s that start at 0 on both axes (nanoGPT's / GPT-2's buffer);
//! - `Trilu` of a uniform tensor, with `k` and `upper` giving exactly the causal diagonal;
//! - comparisons of two `Range(0, L, 1)` index vectors laid out on the query and key axes;
//! - `Equal`, `Not`, `Cast`, `Where` with constant branches, `And`/`Or` with another mask
//!   (which stays as the fused node's `attn_mask`), `Add` of zeros or of another additive mask,
//!   `Expand`/`Unsqueeze`/`Identity` that leave the last two axes alone.
//!
//! Anything else is a reason string saying why `is_causal` was not used.

use std::cell::Cell;

use attnrt_onnx::{attr, node_label};

use crate::attention::{fill_str, MaskLayer};
use crate::graph::{shape_str, Dim, GraphView, Value};

/// A masked key's additive value must make `exp` underflow to exactly 0 whatever the scores:
/// `-inf`, or a value as negative as `torch.finfo(float32).min` (≈ -3.4e38) that transformers
/// uses. Scores themselves are far below 1e29, so `s - 1e30 - max` underflows in f32 and f64.
const STRONG_FILL: f64 = -1e30;

/// How deep the evaluation follows a mask's producers.
const MAX_DEPTH: usize = 24;

/// Largest constant checked element by element (a 2048×2048 causal buffer).
const MAX_CONSTANT_ELEMENTS: usize = 1 << 22;

/// How many tensors one layer's evaluation may visit.
const MAX_STEPS: usize = 4096;

/// A tensor whose last two axes hold `below` where `j ≤ i` (on and below the diagonal) and
/// `above` where `j > i`, the same for every index of the leading axes. Booleans are 0/1.
#[derive(Clone, Debug, PartialEq)]
struct Tri {
    below: f64,
    above: f64,
    /// Size of the query axis (`i` ranges over `0..rows`).
    rows: Dim,
    /// Size of the key axis (`j` ranges over `0..cols`).
    cols: Dim,
    /// How the triangle was proven (for the report).
    how: String,
}

/// What remains of a mask layer once the triangle is taken out.
#[derive(Clone, Debug, PartialEq)]
enum Rest {
    /// Nothing: the layer is exactly the causal rule.
    None,
    /// A bool tensor, true where a key takes part; other keys get `fill`.
    Keep {
        cond: String,
        fill: String,
        fill_value: f64,
    },
    /// A bool tensor, true where a key is masked with `fill`.
    Masked {
        cond: String,
        fill: String,
        fill_value: f64,
    },
    /// An additive float tensor.
    Additive(String),
}

/// The abstract value of a mask tensor.
#[derive(Clone, Debug)]
enum Sym {
    /// Every element equals this number (booleans 0/1).
    Uniform(f64),
    /// A triangle.
    Tri(Tri),
    /// Boolean `(j ≤ i) ∧ rest`.
    KeepAnd(Tri, String),
    /// Boolean `(j > i) ∨ rest`.
    MaskedOr(Tri, String),
    /// Additive: the triangle (0 below, a strong negative above) plus what [`Rest`] says.
    Additive(Tri, Rest),
}

/// `Range(start, L, 1)` (plus a constant) laid out along one axis: element value =
/// position along that axis + `offset`.
#[derive(Clone, Debug)]
struct Index {
    /// The axis, counted from the last (0) — broadcasting aligns axes from the end.
    from_end: usize,
    len: Dim,
    offset: i64,
}

/// The proof that one mask layer is the causal rule.
#[derive(Clone, Debug)]
pub struct CausalProof {
    /// Index of the layer in the match's `masks` (innermost first).
    pub layer: usize,
    /// What replaces the layer (`None`: the layer goes away).
    pub replacement: Option<MaskLayer>,
    /// A sentence for the report: what was proven, and from what.
    pub how: String,
    /// Set when the triangle's fill is finite and another mask remains: a row whose every
    /// visible key that other mask removes gave its weight to the future keys in the original.
    pub caveat: Option<String>,
}

fn label(view: &GraphView, t: &str) -> String {
    view.producer(t)
        .map(|p| node_label(view.node(p)))
        .unwrap_or_else(|| format!("'{t}'"))
}

fn strong(f: f64) -> bool {
    f == f64::NEG_INFINITY || f <= STRONG_FILL
}

/// Whether `t` is provably all zeros (an additive "mask" that masks nothing, such as the ONNX
/// expansions' empty `attn_bias` or ViT's `Where(Expand(true), 0, finfo.min)`).
pub fn is_zero(view: &GraphView, t: &str) -> bool {
    matches!(eval(view, t, 0, &Cell::new(0)), Ok(Sym::Uniform(v)) if v == 0.0)
}

/// Tries each mask layer in turn; the first that is (or contains) the causal triangle wins.
/// `scores` is the shape of the QK scores (`[.., Lq, Lk]`).
pub fn prove(view: &GraphView, masks: &[MaskLayer], scores: &[Dim]) -> Result<CausalProof, String> {
    let r = scores.len();
    if r < 2 {
        return Err(format!(
            "scores {} have no [Lq, Lk] axes",
            shape_str(scores)
        ));
    }
    let (lq, lk) = (&scores[r - 2], &scores[r - 1]);
    if masks.is_empty() {
        return Err("no mask".into());
    }
    let mut why = Vec::new();
    for (i, m) in masks.iter().enumerate() {
        match prove_layer(view, m) {
            Ok((tri, rest, fill)) => {
                if &tri.rows != lq || &tri.cols != lk {
                    why.push(format!(
                        "the triangle ({}) is {}×{}, the scores {}: not provably [Lq, Lk]",
                        tri.how,
                        tri.rows,
                        tri.cols,
                        shape_str(scores)
                    ));
                    continue;
                }
                if lq != lk {
                    why.push(format!(
                        "the triangle ({}) is causal but Lq {lq} and Lk {lk} are not provably equal \
                         (ONNX is_causal aligns differently when they differ)",
                        tri.how
                    ));
                    continue;
                }
                let node = match m {
                    MaskLayer::Add { node, .. } | MaskLayer::Fill { node, .. } => *node,
                };
                let others = masks.len() > 1 || rest != Rest::None;
                let caveat = (fill.is_finite() && others).then(|| {
                    format!(
                        "is_causal replaces a finite fill ({}): rows whose every visible key the \
                         other mask removes differ (the original spreads them over all keys)",
                        fill_str(fill)
                    )
                });
                let (replacement, with) = match rest {
                    Rest::None => (None, String::new()),
                    Rest::Additive(term) => {
                        let w = format!(" plus the additive mask '{term}'");
                        (Some(MaskLayer::Add { node, term }), w)
                    }
                    Rest::Keep {
                        cond,
                        fill,
                        fill_value,
                    } => {
                        let w = format!(" and the mask '{cond}' (true = attend)");
                        let l = MaskLayer::Fill {
                            node,
                            cond,
                            fill,
                            fill_value,
                            masked_when_true: false,
                        };
                        (Some(l), w)
                    }
                    Rest::Masked {
                        cond,
                        fill,
                        fill_value,
                    } => {
                        let w = format!(" or the mask '{cond}' (true = masked)");
                        let l = MaskLayer::Fill {
                            node,
                            cond,
                            fill,
                            fill_value,
                            masked_when_true: true,
                        };
                        (Some(l), w)
                    }
                };
                return Ok(CausalProof {
                    layer: i,
                    caveat,
                    replacement,
                    how: format!(
                        "{} masks key j > query i ({}){with}",
                        node_label(view.node(node)),
                        tri.how
                    ),
                });
            }
            Err(e) => why.push(e),
        }
    }
    Err(why.join("; "))
}

/// The triangle of one layer, what remains of the layer without it, and the value the layer
/// gave the keys above the diagonal.
fn prove_layer(view: &GraphView, m: &MaskLayer) -> Result<(Tri, Rest, f64), String> {
    let (tri, rest) = prove_layer_parts(view, m)?;
    let fill = match m {
        MaskLayer::Add { .. } => tri.above,
        MaskLayer::Fill { fill_value, .. } => *fill_value,
    };
    Ok((tri, rest, fill))
}

fn prove_layer_parts(view: &GraphView, m: &MaskLayer) -> Result<(Tri, Rest), String> {
    match m {
        MaskLayer::Add { term, node } => {
            let at = node_label(view.node(*node));
            match eval(view, term, 0, &Cell::new(0))? {
                Sym::Tri(t) => {
                    if t.below != 0.0 || !strong(t.above) {
                        return Err(format!(
                            "{at}: additive triangle ({}) is {} on/below the diagonal and {} above, \
                             not 0 and -inf (or ≤ {STRONG_FILL:e})",
                            t.how,
                            fill_str(t.below),
                            fill_str(t.above)
                        ));
                    }
                    Ok((t, Rest::None))
                }
                Sym::Additive(t, rest) => Ok((t, rest)),
                other => Err(format!("{at}: the additive mask is {}", describe(&other))),
            }
        }
        MaskLayer::Fill {
            node,
            cond,
            fill,
            fill_value,
            masked_when_true,
        } => {
            let at = node_label(view.node(*node));
            let sym = eval(view, cond, 0, &Cell::new(0))?;
            if !strong(*fill_value) {
                return Err(format!(
                    "{at}: the condition is {}, but the fill {} is not -inf nor ≤ {STRONG_FILL:e}: \
                     masked keys keep weight",
                    describe(&sym),
                    fill_str(*fill_value)
                ));
            }
            match (sym, masked_when_true) {
                (Sym::Tri(t), true) if t.below == 0.0 && t.above == 1.0 => Ok((t, Rest::None)),
                (Sym::Tri(t), false) if t.below == 1.0 && t.above == 0.0 => Ok((t, Rest::None)),
                (Sym::MaskedOr(t, c), true) => Ok((
                    t,
                    Rest::Masked {
                        cond: c,
                        fill: fill.clone(),
                        fill_value: *fill_value,
                    },
                )),
                (Sym::KeepAnd(t, c), false) => Ok((
                    t,
                    Rest::Keep {
                        cond: c,
                        fill: fill.clone(),
                        fill_value: *fill_value,
                    },
                )),
                (s, _) => Err(format!(
                    "{at}: the condition is {}, not the causal rule for a Where that {}",
                    describe(&s),
                    if *masked_when_true {
                        "masks where true"
                    } else {
                        "keeps where true"
                    }
                )),
            }
        }
    }
}

fn describe(s: &Sym) -> String {
    match s {
        Sym::Uniform(v) => format!("uniform {v}"),
        Sym::Tri(t) => format!(
            "a triangle ({}) with {} on/below the diagonal and {} above",
            t.how,
            fill_str(t.below),
            fill_str(t.above)
        ),
        Sym::KeepAnd(t, r) => format!("(j ≤ i) ∧ '{r}' ({})", t.how),
        Sym::MaskedOr(t, r) => format!("(j > i) ∨ '{r}' ({})", t.how),
        Sym::Additive(t, _) => format!("an additive triangle ({})", t.how),
    }
}

/// The last two dims of `t`, when known.
fn last2(view: &GraphView, t: &str) -> Option<(Dim, Dim)> {
    let s = view.shape(t)?;
    (s.len() >= 2).then(|| (s[s.len() - 2].clone(), s[s.len() - 1].clone()))
}

/// A known value with every element equal.
fn uniform_value(v: &Value) -> Option<f64> {
    let all: Vec<f64> = match v {
        Value::Floats(_, x) => x.clone(),
        Value::Bools(_, x) => x.iter().map(|&b| b as u8 as f64).collect(),
        Value::Ints(_, x) => x
            .iter()
            .map(|d| d.as_known().map(|v| v as f64))
            .collect::<Option<_>>()?,
    };
    let first = *all.first()?;
    all.iter()
        .all(|&x| x == first || (x.is_nan() && first.is_nan()))
        .then_some(first)
}

/// Checks a constant element by element: is it a triangle over its last two axes?
fn constant_tri(view: &GraphView, t: &str, v: &Value) -> Result<Tri, String> {
    let (dims, vals): (&[i64], Vec<f64>) = match v {
        Value::Floats(d, x) => (d, x.clone()),
        Value::Bools(d, x) => (d, x.iter().map(|&b| b as u8 as f64).collect()),
        Value::Ints(d, x) => (
            d,
            x.iter()
                .map(|d| d.as_known().map(|v| v as f64))
                .collect::<Option<_>>()
                .ok_or("symbolic integers")?,
        ),
    };
    let what = label(view, t);
    if dims.len() < 2 {
        return Err(format!(
            "{what} is a rank-{} constant, not a matrix",
            dims.len()
        ));
    }
    let (rows, cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    if rows <= 0 || cols <= 0 {
        return Err(format!("{what} is empty"));
    }
    // Region of (i, j): 0 strictly below the diagonal, 1 on it, 2 above.
    let region = |k: usize| {
        let k = k as i64;
        let (i, j) = ((k / cols) % rows, k % cols);
        (j - i).signum() + 1
    };
    let uniform_in = |r: i64| {
        let mut it = vals.iter().enumerate().filter(|(k, _)| region(*k) == r);
        let first = it.next().map(|(_, v)| *v)?;
        it.all(|(_, v)| *v == first).then_some(first)
    };
    if let (Some(b), Some(d), Some(a)) = (uniform_in(0), uniform_in(1), uniform_in(2)) {
        if d == a && d != b {
            return Err(format!(
                "{what}: the diagonal holds {d} like the part above it, not {b} like the part \
                 below: it masks j ≥ i, off the causal diagonal by one"
            ));
        }
    }
    let (mut below, mut above) = (None::<f64>, None::<f64>);
    for (k, &x) in vals.iter().enumerate() {
        let k = k as i64;
        let (i, j) = ((k / cols) % rows, k % cols);
        let slot = if j <= i { &mut below } else { &mut above };
        match slot {
            None => *slot = Some(x),
            Some(y) if *y == x => {}
            Some(y) => {
                return Err(format!(
                "{what}: element [{i}, {j}] is {x}, not {y} like the rest of the {} the diagonal",
                if j <= i {
                    "part on/below"
                } else {
                    "part above"
                }
            ))
            }
        }
    }
    let below = below.ok_or("no element on/below the diagonal")?;
    // A single-column buffer has no element above the diagonal: not a triangle to trust.
    let above = above.ok_or_else(|| format!("{what} has no element above the diagonal"))?;
    if below == above {
        return Err(format!("{what} is uniform ({below}), not a triangle"));
    }
    Ok(Tri {
        below,
        above,
        rows: Dim::known(rows),
        cols: Dim::known(cols),
        how: format!("constant {what} {rows}×{cols}"),
    })
}

fn known_int(view: &GraphView, t: &str) -> Option<i64> {
    match view.value(t)? {
        Value::Ints(_, x) if x.len() == 1 => x[0].as_known(),
        _ => None,
    }
}

/// `t` as an arange laid out on one axis.
fn index(view: &GraphView, t: &str, depth: usize) -> Result<Index, String> {
    if depth > MAX_DEPTH {
        return Err("index chain too deep".into());
    }
    if view.value(t).is_some() {
        // `kv_idx >= 0` (transformers' bidirectional mask) and the like: no query axis.
        return Err(format!(
            "{} is a constant, not a position on the query or key axis",
            label(view, t)
        ));
    }
    let p = view
        .producer(t)
        .ok_or_else(|| format!("'{t}' is a graph input, not an arange of positions"))?;
    let n = view.node(p);
    let at = node_label(n);
    let input = |i: usize| n.input.get(i).map(String::as_str).unwrap_or("");
    match n.op_type.as_str() {
        "Range" => {
            let (start, delta) = (known_int(view, input(0)), known_int(view, input(2)));
            if delta != Some(1) {
                return Err(format!("{at}: delta is not the constant 1"));
            }
            let start = start.ok_or_else(|| format!("{at}: start is not a known integer"))?;
            let len = view
                .shape(t)
                .and_then(|s| s.first().cloned())
                .ok_or_else(|| format!("{at}: length unknown"))?;
            Ok(Index {
                from_end: 0,
                len,
                offset: start,
            })
        }
        "Identity" | "Cast" => index(view, input(0), depth + 1),
        "Add" | "Sub" => {
            let (a, b) = (input(0), input(1));
            let (idx, c, sign) = match (known_int(view, a), known_int(view, b)) {
                (None, Some(c)) => (a, c, if n.op_type == "Sub" { -1 } else { 1 }),
                (Some(c), None) if n.op_type == "Add" => (b, c, 1),
                _ => return Err(format!("{at}: not an index plus a known integer")),
            };
            let mut i = index(view, idx, depth + 1)?;
            i.offset = i
                .offset
                .checked_add(sign * c)
                .ok_or_else(|| format!("{at}: offset overflows"))?;
            Ok(i)
        }
        "Unsqueeze" => {
            let i = index(view, input(0), depth + 1)?;
            let (Some(ins), Some(outs)) = (view.shape(input(0)), view.shape(t)) else {
                return Err(format!("{at}: shapes unknown"));
            };
            let axes: Vec<i64> = match attr::ints(n, "axes").ok().flatten() {
                Some(a) => a.to_vec(),
                None => view
                    .value(input(1))
                    .and_then(Value::known_ints)
                    .ok_or_else(|| format!("{at}: axes unknown"))?,
            };
            let r = outs.len() as i64;
            let axes: Vec<i64> = axes
                .iter()
                .map(|&a| if a < 0 { a + r } else { a })
                .collect();
            // The input axis p (from the start) lands on the p-th output axis not inserted.
            let p = ins.len() - 1 - i.from_end;
            let mut seen = 0;
            for o in 0..r {
                if axes.contains(&o) {
                    continue;
                }
                if seen == p {
                    return Ok(Index {
                        from_end: (r - 1 - o) as usize,
                        ..i
                    });
                }
                seen += 1;
            }
            Err(format!("{at}: axes {axes:?} do not fit rank {r}"))
        }
        "Expand" => {
            let i = index(view, input(0), depth + 1)?;
            let (Some(ins), Some(outs)) = (view.shape(input(0)), view.shape(t)) else {
                return Err(format!("{at}: shapes unknown"));
            };
            // Broadcasting must not stretch the index axis (a length-1 arange would repeat 0).
            let din = &ins[ins.len() - 1 - i.from_end];
            let dout = outs.get(outs.len().wrapping_sub(1 + i.from_end));
            if dout != Some(din) {
                return Err(format!("{at}: may stretch the index axis"));
            }
            Ok(i)
        }
        op => Err(format!("{at}: {op} is not an arange of positions")),
    }
}

/// A comparison of a key index `j` with a query index `i`: a triangle only when it is exactly
/// `j ≤ i` (or its negation `j > i`).
fn compare(view: &GraphView, t: &str) -> Result<Sym, String> {
    let n = view.node(view.producer(t).ok_or("no producer")?);
    let at = node_label(n);
    let (Some(x), Some(y)) = (n.input.first(), n.input.get(1)) else {
        return Err(format!("{at}: needs two inputs"));
    };
    let a = index(view, x, 0).map_err(|e| format!("{at}: left side: {e}"))?;
    let b = index(view, y, 0).map_err(|e| format!("{at}: right side: {e}"))?;
    let overflow = || format!("{at}: offsets overflow");
    // Normalise to `j - i  OP  d` with j the key (last axis) and i the query (axis -2).
    let (op, d, j, i) = match (a.from_end, b.from_end) {
        // a = j + oa, b = i + ob:  j + oa OP i + ob  ⇔  j - i OP ob - oa.
        (0, 1) => (
            n.op_type.clone(),
            b.offset.checked_sub(a.offset).ok_or_else(overflow)?,
            &a,
            &b,
        ),
        // a = i + oa, b = j + ob:  i + oa OP j + ob  ⇔  j - i OP' oa - ob (OP mirrored).
        (1, 0) => {
            let mirrored = match n.op_type.as_str() {
                "Less" => "Greater",
                "LessOrEqual" => "GreaterOrEqual",
                "Greater" => "Less",
                _ => "LessOrEqual",
            };
            (
                mirrored.to_string(),
                a.offset.checked_sub(b.offset).ok_or_else(overflow)?,
                &b,
                &a,
            )
        }
        (x, y) => {
            return Err(format!(
                "{at}: compares positions along axes -{} and -{}, not the query and key axes",
                x + 1,
                y + 1
            ))
        }
    };
    // Integer relations as `j - i ≤ c` (true on and below the diagonal when c = 0) or
    // `j - i ≥ c` (true above the diagonal when c = 1).
    let (le, c) = match op.as_str() {
        "LessOrEqual" => (true, Some(d)),
        "Less" => (true, d.checked_sub(1)),
        "GreaterOrEqual" => (false, Some(d)),
        _ => (false, d.checked_add(1)),
    };
    let c = c.ok_or_else(overflow)?;
    let (below, above) = match (le, c) {
        (true, 0) => (1.0, 0.0),
        (false, 1) => (0.0, 1.0),
        (true, c) => {
            return Err(format!(
                "{at}: keeps key j iff j - i ≤ {c}: off the causal diagonal by {c}"
            ))
        }
        (false, c) => {
            return Err(format!(
                "{at}: masks key j iff j - i ≥ {c}: off the causal diagonal by {}",
                c.saturating_sub(1)
            ))
        }
    };
    Ok(Sym::Tri(Tri {
        below,
        above,
        rows: i.len.clone(),
        cols: j.len.clone(),
        how: format!("{} of key and query positions", n.op_type),
    }))
}

/// Keeps a triangle only through ops that do not move or stretch its last two axes.
fn same_last2(
    view: &GraphView,
    input: &str,
    output: &str,
    tri: &Tri,
    at: &str,
) -> Result<(), String> {
    match last2(view, output) {
        Some((r, c)) if r == tri.rows && c == tri.cols => Ok(()),
        Some((r, c)) => Err(format!(
            "{at}: turns the {}×{} triangle into {r}×{c}",
            tri.rows, tri.cols
        )),
        None => Err(format!(
            "{at}: shape of '{output}' (from '{input}') unknown"
        )),
    }
}

fn tri_of(s: &Sym) -> Option<&Tri> {
    match s {
        Sym::Tri(t) | Sym::KeepAnd(t, _) | Sym::MaskedOr(t, _) | Sym::Additive(t, _) => Some(t),
        Sym::Uniform(_) => None,
    }
}

fn map_tri(t: &Tri, f: impl Fn(f64) -> f64) -> Tri {
    Tri {
        below: f(t.below),
        above: f(t.above),
        ..t.clone()
    }
}

/// The abstract value of `t`. `steps` bounds the work on graphs that share subexpressions.
fn eval(view: &GraphView, t: &str, depth: usize, steps: &Cell<usize>) -> Result<Sym, String> {
    if depth > MAX_DEPTH {
        return Err(format!("'{t}': mask chain too deep"));
    }
    steps.set(steps.get() + 1);
    if steps.get() > MAX_STEPS {
        return Err("mask graph too large to analyse".into());
    }
    // An initializer that is also a graph input can be replaced at run time: not a proof.
    let fixed = view.is_constant(t) || view.producer(t).is_some();
    if let Some(v) = view.value(t).filter(|_| fixed) {
        if let Some(u) = uniform_value(v) {
            return Ok(Sym::Uniform(u));
        }
        return constant_tri(view, t, v).map(Sym::Tri);
    }
    // Buffers larger than the view keeps (GPT-2's 1024×1024 `bias`) are read here, once.
    let big = view
        .initializer(t)
        .filter(|_| view.is_constant(t))
        .or_else(|| {
            let p = view.node(view.producer(t)?);
            (p.op_type == "Constant")
                .then(|| attr::tensor(p, "value").ok().flatten())
                .flatten()
        });
    if let Some(init) = big {
        let v =
            crate::graph::tensor_value_limited(init, MAX_CONSTANT_ELEMENTS).ok_or_else(|| {
                format!(
                "constant '{t}' {:?} is too large (over {MAX_CONSTANT_ELEMENTS} elements) or not \
                 readable to check",
                init.dims
            )
            })?;
        if let Some(u) = uniform_value(&v) {
            return Ok(Sym::Uniform(u));
        }
        return constant_tri(view, t, &v).map(Sym::Tri);
    }
    let p = view
        .producer(t)
        .ok_or_else(|| format!("'{t}' is a graph input, not a provable triangle"))?;
    let n = view.node(p);
    let at = node_label(n);
    if !attnrt_onnx::opset::is_default_domain(&n.domain) {
        return Err(format!("{at}: not a default-domain op"));
    }
    let input = |i: usize| n.input.get(i).map(String::as_str).unwrap_or("");
    let sub = |i: usize| eval(view, input(i), depth + 1, steps);
    match n.op_type.as_str() {
        "Identity" => sub(0),
        "Cast" => {
            let to = attr::int(n, "to").ok().flatten().unwrap_or(0) as i32;
            let is_bool = to == attnrt_onnx::DataType::Bool as i32;
            let is_float = to == attnrt_onnx::DataType::Float as i32
                || to == attnrt_onnx::DataType::Double as i32;
            match sub(0)? {
                Sym::Uniform(v) if is_bool => Ok(Sym::Uniform((v != 0.0) as u8 as f64)),
                Sym::Tri(tr) if is_bool => Ok(Sym::Tri(map_tri(&tr, |v| (v != 0.0) as u8 as f64))),
                // Float casts keep 0, 1, -inf and finfo.min exactly.
                s @ (Sym::Uniform(_) | Sym::Tri(_)) if is_float => Ok(s),
                s @ (Sym::KeepAnd(..) | Sym::MaskedOr(..)) if is_bool => Ok(s),
                s @ Sym::Additive(..) if is_float && view.elem_type(input(0)) == Some(to) => Ok(s),
                s => Err(format!("{at}: casts {} to type {to}", describe(&s))),
            }
        }
        "ConstantOfShape" => {
            let v = attr::tensor(n, "value")
                .ok()
                .flatten()
                .and_then(crate::graph::tensor_value)
                .and_then(|v| uniform_value(&v))
                .unwrap_or(0.0);
            Ok(Sym::Uniform(v))
        }
        "Expand" | "Unsqueeze" => {
            let s = sub(0)?;
            if let Some(tr) = tri_of(&s) {
                same_last2(view, input(0), t, tr, &at)?;
            }
            Ok(s)
        }
        "Slice" => {
            let s = sub(0)?;
            let Sym::Tri(tr) = s else {
                return Err(format!("{at}: slices {}", describe(&s)));
            };
            let rank = view
                .rank(input(0))
                .ok_or_else(|| format!("{at}: rank unknown"))? as i64;
            let starts = view
                .value(input(1))
                .and_then(Value::known_ints)
                .ok_or_else(|| format!("{at}: starts unknown"))?;
            let axes: Vec<i64> = if n.input.len() > 3 && !input(3).is_empty() {
                view.value(input(3))
                    .and_then(Value::known_ints)
                    .ok_or_else(|| format!("{at}: axes unknown"))?
            } else {
                (0..starts.len() as i64).collect()
            };
            let steps: Vec<i64> = if n.input.len() > 4 && !input(4).is_empty() {
                view.value(input(4))
                    .and_then(Value::known_ints)
                    .ok_or_else(|| format!("{at}: steps unknown"))?
            } else {
                vec![1; starts.len()]
            };
            if axes.len() != starts.len() || steps.len() != starts.len() {
                return Err(format!("{at}: starts/axes/steps lengths differ"));
            }
            for ((&a, &s), &st) in axes.iter().zip(&starts).zip(&steps) {
                let a = if a < 0 { a + rank } else { a };
                // Only a top-left block of a triangle is the same triangle.
                if s != 0 || st != 1 {
                    return Err(format!(
                        "{at}: slices axis {a} from {s} with step {st}, not from 0 with step 1 \
                         (a block off the diagonal is not causal)"
                    ));
                }
            }
            let (rows, cols) =
                last2(view, t).ok_or_else(|| format!("{at}: output shape unknown"))?;
            Ok(Sym::Tri(Tri {
                rows,
                cols,
                how: if tr.how.ends_with("sliced from 0") {
                    tr.how.clone()
                } else {
                    format!("{} sliced from 0", tr.how)
                },
                ..tr
            }))
        }
        "Trilu" => {
            let upper = attr::int(n, "upper").ok().flatten().unwrap_or(1) != 0;
            let k = if n.input.len() > 1 && !input(1).is_empty() {
                known_int(view, input(1)).ok_or_else(|| format!("{at}: k unknown"))?
            } else {
                0
            };
            let v = match sub(0)? {
                Sym::Uniform(v) => v,
                s => {
                    return Err(format!(
                        "{at}: applied to {}, not a uniform tensor",
                        describe(&s)
                    ))
                }
            };
            let (rows, cols) = last2(view, t).ok_or_else(|| format!("{at}: shape unknown"))?;
            // Lower keeps j ≤ i + k; upper keeps j ≥ i + k; the rest becomes 0.
            let (below, above) = match (upper, k) {
                (false, 0) => (v, 0.0),
                (true, 1) => (0.0, v),
                (false, k) => {
                    return Err(format!("{at}: tril with k = {k} (off the diagonal by {k})"))
                }
                (true, k) => {
                    return Err(format!(
                        "{at}: triu with k = {k} (off the diagonal by {})",
                        k.saturating_sub(1)
                    ))
                }
            };
            if below == above {
                return Err(format!("{at}: of a uniform {v}: no triangle"));
            }
            Ok(Sym::Tri(Tri {
                below,
                above,
                rows,
                cols,
                how: format!("Trilu(upper={}, k={k}) of a uniform {v}", upper as u8),
            }))
        }
        "Equal" => {
            let (x, c) = match (sub(0), sub(1)) {
                (Ok(Sym::Uniform(c)), Ok(x)) | (Ok(x), Ok(Sym::Uniform(c))) => (x, c),
                (Err(e), _) | (_, Err(e)) => return Err(e),
                _ => return Err(format!("{at}: compares two non-constant masks")),
            };
            let eq = |v: f64| (v == c) as u8 as f64;
            match x {
                Sym::Uniform(v) => Ok(Sym::Uniform(eq(v))),
                Sym::Tri(tr) => Ok(Sym::Tri(map_tri(&tr, eq))),
                s => Err(format!("{at}: compares {}", describe(&s))),
            }
        }
        "Not" => match sub(0)? {
            Sym::Uniform(v) => Ok(Sym::Uniform((v == 0.0) as u8 as f64)),
            Sym::Tri(tr) => Ok(Sym::Tri(map_tri(&tr, |v| (v == 0.0) as u8 as f64))),
            s => Err(format!("{at}: negates {}", describe(&s))),
        },
        "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" => compare(view, t),
        "And" | "Or" => {
            let is_and = n.op_type == "And";
            // The identity element (true for And, false for Or) drops out.
            let unit = if is_and { 1.0 } else { 0.0 };
            let sides = [sub(0), sub(1)];
            let tri_side = sides.iter().position(|s| matches!(s, Ok(Sym::Tri(_))));
            let unit_side = sides
                .iter()
                .position(|s| matches!(s, Ok(Sym::Uniform(u)) if *u == unit));
            if let Some(u) = unit_side {
                return sides[1 - u].clone();
            }
            let Some(ts) = tri_side else {
                return match sides.into_iter().find_map(Result::err) {
                    Some(e) => Err(e),
                    None => Err(format!("{at}: no triangle among its operands")),
                };
            };
            let Ok(Sym::Tri(tr)) = sides[ts].clone() else {
                unreachable!("tri_side points at a triangle")
            };
            match &sides[1 - ts] {
                Ok(Sym::Tri(_)) => Err(format!("{at}: combines two triangles")),
                Ok(Sym::Uniform(u)) => Err(format!("{at}: with the constant {u} (not {unit})")),
                // The other operand is a mask of its own (padding): it stays.
                _ if is_and && tr.below == 1.0 && tr.above == 0.0 => {
                    Ok(Sym::KeepAnd(tr, input(1 - ts).to_string()))
                }
                _ if !is_and && tr.below == 0.0 && tr.above == 1.0 => {
                    Ok(Sym::MaskedOr(tr, input(1 - ts).to_string()))
                }
                _ => Err(format!(
                    "{at}: {} with a triangle that is {} on/below the diagonal",
                    n.op_type, tr.below
                )),
            }
        }
        "Where" => {
            let cond = sub(0)?;
            let (a, b) = (sub(1)?, sub(2)?);
            let (Sym::Uniform(a), Sym::Uniform(b)) = (a, b) else {
                return Err(format!("{at}: branches are not constants"));
            };
            match cond {
                Sym::Uniform(c) => Ok(Sym::Uniform(if c != 0.0 { a } else { b })),
                Sym::Tri(tr) => Ok(Sym::Tri(map_tri(&tr, |c| if c != 0.0 { a } else { b }))),
                // (j ≤ i) ∧ rest → 0, else fill: the triangle plus `rest` kept with `fill`.
                Sym::KeepAnd(tr, rest) if a == 0.0 && strong(b) => Ok(Sym::Additive(
                    Tri {
                        below: 0.0,
                        above: b,
                        ..tr
                    },
                    Rest::Keep {
                        cond: rest,
                        fill: input(2).to_string(),
                        fill_value: b,
                    },
                )),
                Sym::MaskedOr(tr, rest) if b == 0.0 && strong(a) => Ok(Sym::Additive(
                    Tri {
                        below: 0.0,
                        above: a,
                        ..tr
                    },
                    Rest::Masked {
                        cond: rest,
                        fill: input(1).to_string(),
                        fill_value: a,
                    },
                )),
                s => Err(format!(
                    "{at}: Where({}, {a}, {b}) is not a causal mask",
                    describe(&s)
                )),
            }
        }
        "Add" => {
            let sides = [sub(0), sub(1)];
            let Some(ts) = sides.iter().position(|s| matches!(s, Ok(Sym::Tri(_)))) else {
                // Adding zeros (the ONNX expansion's empty attn_bias) changes nothing.
                return match (&sides[0], &sides[1]) {
                    (Ok(Sym::Uniform(u)), s) | (s, Ok(Sym::Uniform(u))) if *u == 0.0 => s.clone(),
                    (Err(e), _) | (_, Err(e)) => Err(e.clone()),
                    _ => Err(format!("{at}: adds no triangle")),
                };
            };
            let Ok(Sym::Tri(tr)) = sides[ts].clone() else {
                unreachable!("ts points at a triangle")
            };
            match &sides[1 - ts] {
                Ok(Sym::Uniform(u)) => {
                    let u = *u;
                    Ok(Sym::Tri(map_tri(&tr, |v| v + u)))
                }
                Ok(s) => Err(format!("{at}: adds a triangle and {}", describe(s))),
                Err(_) if tr.below != 0.0 || !strong(tr.above) => Err(format!(
                    "{at}: adds a triangle that is {} on/below the diagonal and {} above \
                     (not 0 and -inf)",
                    fill_str(tr.below),
                    fill_str(tr.above)
                )),
                // The other operand is an additive mask of its own (the attn_mask): it stays.
                Err(_) => Ok(Sym::Additive(tr, Rest::Additive(input(1 - ts).to_string()))),
            }
        }
        op => Err(format!("{at}: {op} is not part of a provable causal mask")),
    }
}
