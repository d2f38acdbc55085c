//! Symbolic tensor dimensions: what the matcher can prove about sizes it does not know.
//!
//! A [`Dim`] is a product of an integer and named symbols (graph-input `dim_param`s), so
//! `B·L·64 / (B·4·16) = L` can be proven for `Reshape` targets with `-1`. The representation
//! is private: callers only multiply, divide exactly, compare and print. A decoder's
//! `past + new` length needs a sum of monomials; `Dim` can then hold several `Monomial`s
//! (kept in a normal form so that equality stays structural) without changing its callers.

use std::collections::BTreeMap;
use std::fmt;

/// One tensor dimension: `coef · Π symᵉ`. Symbols stand for unknown positive sizes
/// (graph-input `dim_param`s, or a fresh name for an unnamed dimension).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dim(Monomial);

/// `coef · Π symᵉ`, with no zero exponent stored.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Monomial {
    coef: i64,
    syms: BTreeMap<String, u32>,
}

impl Monomial {
    fn mul(&self, other: &Monomial) -> Option<Monomial> {
        let mut syms = self.syms.clone();
        for (k, e) in &other.syms {
            *syms.entry(k.clone()).or_insert(0) += e;
        }
        Some(Monomial {
            coef: self.coef.checked_mul(other.coef)?,
            syms,
        })
    }

    /// Exact division: symbol exponents do not go negative and the coefficient divides.
    fn div_exact(&self, other: &Monomial) -> Option<Monomial> {
        if other.coef == 0 || self.coef % other.coef != 0 {
            return None;
        }
        let mut syms = self.syms.clone();
        for (k, e) in &other.syms {
            let have = syms.get_mut(k)?;
            if *have < *e {
                return None;
            }
            *have -= e;
            if *have == 0 {
                syms.remove(k);
            }
        }
        Some(Monomial {
            coef: self.coef / other.coef,
            syms,
        })
    }
}

impl Dim {
    /// A known size.
    pub fn known(v: i64) -> Dim {
        Dim(Monomial {
            coef: v,
            syms: BTreeMap::new(),
        })
    }

    /// An unknown positive size called `name`.
    pub fn sym(name: &str) -> Dim {
        let mut syms = BTreeMap::new();
        syms.insert(name.to_string(), 1);
        Dim(Monomial { coef: 1, syms })
    }

    /// The value, when it contains no symbol.
    pub fn as_known(&self) -> Option<i64> {
        self.0.syms.is_empty().then_some(self.0.coef)
    }

    /// `self · other`, `None` on overflow.
    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        self.0.mul(&other.0).map(Dim)
    }

    /// `self / other` when the division is exact (symbol exponents do not go negative and the
    /// coefficient divides).
    pub fn div_exact(&self, other: &Dim) -> Option<Dim> {
        self.0.div_exact(&other.0).map(Dim)
    }

    /// The symbol's name when the dimension is exactly one named symbol (a graph `dim_param`,
    /// not a fresh name made up for an unnamed dimension).
    pub fn as_symbol(&self) -> Option<&str> {
        match (self.0.coef, self.0.syms.len()) {
            (1, 1) => self
                .0
                .syms
                .iter()
                .next()
                .filter(|(k, e)| **e == 1 && !k.contains('#'))
                .map(|(k, _)| k.as_str()),
            _ => None,
        }
    }

    /// Whether the dimension is a known constant equal to `v`.
    pub fn is(&self, v: i64) -> bool {
        self.as_known() == Some(v)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Monomial { coef, syms } = &self.0;
        let mut parts = Vec::new();
        if *coef != 1 || syms.is_empty() {
            parts.push(coef.to_string());
        }
        for (k, e) in syms {
            parts.push(if *e == 1 {
                k.clone()
            } else {
                format!("{k}^{e}")
            });
        }
        write!(f, "{}", parts.join("·"))
    }
}

/// Formats a shape as `[B, L, 64]`.
pub fn shape_str(s: &[Dim]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The product of a list of dims.
pub fn product(dims: &[Dim]) -> Option<Dim> {
    dims.iter().try_fold(Dim::known(1), |acc, d| acc.mul(d))
}

/// Numpy-style broadcast of two shapes; `None` when it cannot be proven (two different
/// symbols, or two different known sizes).
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let r = a.len().max(b.len());
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let x = (i + a.len()).checked_sub(r).map(|j| &a[j]);
        let y = (i + b.len()).checked_sub(r).map(|j| &b[j]);
        out.push(match (x, y) {
            (Some(x), None) => x.clone(),
            (None, Some(y)) => y.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(x), Some(y)) if x.is(1) => y.clone(),
            (Some(x), Some(y)) if y.is(1) => x.clone(),
            // A symbol broadcast against a known size > 1 must equal it (or the op fails).
            (Some(x), Some(y)) if x.as_known().is_none() && y.as_known().is_some() => y.clone(),
            (Some(x), Some(y)) if y.as_known().is_none() && x.as_known().is_some() => x.clone(),
            _ => return None,
        });
    }
    Some(out)
}

/// The broadcast of every shape in `shapes`.
pub fn broadcast_all(shapes: &[Vec<Dim>]) -> Option<Vec<Dim>> {
    let mut it = shapes.iter();
    let first = it.next()?.clone();
    it.try_fold(first, |acc, s| broadcast(&acc, s))
}
