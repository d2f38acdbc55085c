//! The abstract domain of the causal proofs: a [`Tri`] holds one value on and below the
//! diagonal and one above it; a [`Sym`] is what a mask tensor is known to be.

use crate::graph::{Dim, GraphView, Value};
use crate::masks::fill_str;
use crate::mismatch::{Check, Mismatch};

/// A masked key's additive value must make `exp` underflow to exactly 0 whatever the scores:
/// `-inf`, or a value as negative as `torch.finfo(float32).min` (≈ -3.4e38) that transformers
/// uses. Scores themselves are far below 1e29, so `s - 1e30 - max` underflows in f32 and f64.
pub(super) const STRONG_FILL: f64 = -1e30;

/// What a mask proof is held against.
const CAUSAL_RULE: &str = "the causal rule (key j visible iff j ≤ query i + past length)";

/// A tensor whose last two axes hold `below` where `j ≤ i + diagonal` (on and below the
/// diagonal) and `above` where `j > i + diagonal`, the same for every index of the leading
/// axes. Booleans are 0/1. The diagonal is 0 for an encoder's (top-left) triangle and the past
/// length for a decoder's with a cache (bottom-right).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Tri {
    pub below: f64,
    pub above: f64,
    /// Size of the query axis (`i` ranges over `0..rows`).
    pub rows: Dim,
    /// Size of the key axis (`j` ranges over `0..cols`).
    pub cols: Dim,
    /// Where the frontier runs: key `j` is on/below it iff `j - i ≤ diagonal`.
    pub diagonal: Dim,
    /// How the triangle was proven (for the report).
    pub how: String,
}

impl Tri {
    /// The same triangle with `f` applied to both values.
    pub(super) fn map(&self, f: impl Fn(f64) -> f64) -> Tri {
        Tri {
            below: f(self.below),
            above: f(self.above),
            ..self.clone()
        }
    }
}

/// What remains of a mask layer once the triangle is taken out.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Rest {
    /// Nothing: the layer is exactly the causal rule.
    None,
    /// A bool tensor `cond`: where it is true (`masked_when_true`) or false, a key gets `fill`.
    Fill {
        cond: String,
        fill: String,
        fill_value: f64,
        masked_when_true: bool,
    },
    /// An additive float tensor.
    Additive(String),
}

/// The abstract value of a mask tensor.
#[derive(Clone, Debug)]
pub(super) enum Sym {
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

impl Sym {
    /// The triangle inside, if any.
    pub(super) fn tri(&self) -> Option<&Tri> {
        match self {
            Sym::Tri(t) | Sym::KeepAnd(t, _) | Sym::MaskedOr(t, _) | Sym::Additive(t, _) => Some(t),
            Sym::Uniform(_) => None,
        }
    }

    /// The value for a report.
    pub(super) fn describe(&self) -> String {
        match self {
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
}

/// A failed step of a causal proof at `at`.
pub(super) fn refuse(at: impl Into<String>, found: impl Into<String>) -> Mismatch {
    Mismatch::new(at, Check::Causal, CAUSAL_RULE, found)
}

/// How deep the evaluation follows a mask's producers.
pub(super) const MAX_DEPTH: usize = 24;

/// Whether an additive value removes a key whatever the scores.
pub(super) fn strong(f: f64) -> bool {
    f == f64::NEG_INFINITY || f <= STRONG_FILL
}

/// The last two dims of `t`, when known.
pub(super) fn last2(view: &GraphView, t: &str) -> Option<(Dim, Dim)> {
    let s = view.shape(t)?;
    (s.len() >= 2).then(|| (s[s.len() - 2].clone(), s[s.len() - 1].clone()))
}

/// The single integer `t` holds, possibly symbolic (a length read from a shape).
pub(super) fn int_dim(view: &GraphView, t: &str) -> Option<Dim> {
    match view.value(t)? {
        Value::Ints(_, x) if x.len() == 1 => Some(x[0].clone()),
        _ => None,
    }
}

/// The single known integer `t` holds.
pub(super) fn known_int(view: &GraphView, t: &str) -> Option<i64> {
    match view.value(t)? {
        Value::Ints(_, x) if x.len() == 1 => x[0].as_known(),
        _ => None,
    }
}
