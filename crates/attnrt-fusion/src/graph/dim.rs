//! Symbolic tensor dimensions: what the matcher can prove about sizes it does not know.
//!
//! A [`Dim`] is a polynomial with integer coefficients over named symbols (graph-input
//! `dim_param`s), kept in a normal form (like terms merged, no zero term, terms sorted) so
//! that equality is structural. Products and exact quotients prove `Reshape` targets with
//! `-1` (`B·L·64 / (B·4·16) = L`); sums carry a decoder's `past + new` length through the
//! cache `Concat` and the mask arithmetic. The representation is private: callers add,
//! subtract, multiply, divide exactly, compare and print.

use std::collections::BTreeMap;
use std::fmt;

/// One tensor dimension: `Σ coef · Π symᵉ`. Symbols stand for unknown sizes (graph-input
/// `dim_param`s, or a fresh name for an unnamed dimension); they are never negative.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dim(Vec<Monomial>);

/// `coef · Π symᵉ`, with no zero exponent stored.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Monomial {
    coef: i64,
    syms: BTreeMap<String, u32>,
}

impl Monomial {
    fn constant(coef: i64) -> Monomial {
        Monomial {
            coef,
            syms: BTreeMap::new(),
        }
    }

    fn degree(&self) -> u32 {
        self.syms.values().sum()
    }

    /// The order used for normal forms and long division: by total degree, then symbols.
    fn order_key(&self) -> (u32, &BTreeMap<String, u32>) {
        (self.degree(), &self.syms)
    }

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

/// Merges like terms, drops zero terms and sorts, highest order first.
fn normal(terms: Vec<Monomial>) -> Option<Dim> {
    let mut merged: BTreeMap<BTreeMap<String, u32>, i64> = BTreeMap::new();
    for t in terms {
        let c = merged.entry(t.syms).or_insert(0);
        *c = c.checked_add(t.coef)?;
    }
    let mut out: Vec<Monomial> = merged
        .into_iter()
        .filter(|(_, c)| *c != 0)
        .map(|(syms, coef)| Monomial { coef, syms })
        .collect();
    out.sort_by(|a, b| b.order_key().cmp(&a.order_key()));
    Some(Dim(out))
}

/// Upper bound on long-division steps (shapes have few terms; this only stops runaway input).
const MAX_DIVISION_STEPS: usize = 64;

impl Dim {
    /// A known size.
    pub fn known(v: i64) -> Dim {
        if v == 0 {
            Dim(Vec::new())
        } else {
            Dim(vec![Monomial::constant(v)])
        }
    }

    /// An unknown size called `name`.
    pub fn sym(name: &str) -> Dim {
        let mut syms = BTreeMap::new();
        syms.insert(name.to_string(), 1);
        Dim(vec![Monomial { coef: 1, syms }])
    }

    /// The value, when it contains no symbol.
    pub fn as_known(&self) -> Option<i64> {
        match self.0.as_slice() {
            [] => Some(0),
            [m] if m.syms.is_empty() => Some(m.coef),
            _ => None,
        }
    }

    /// `self + other`, `None` on overflow.
    pub fn add(&self, other: &Dim) -> Option<Dim> {
        normal(self.0.iter().chain(&other.0).cloned().collect())
    }

    /// `self - other`, `None` on overflow.
    pub fn sub(&self, other: &Dim) -> Option<Dim> {
        self.add(&other.scaled(-1)?)
    }

    fn scaled(&self, k: i64) -> Option<Dim> {
        let terms: Option<Vec<Monomial>> = self
            .0
            .iter()
            .map(|m| m.mul(&Monomial::constant(k)))
            .collect();
        normal(terms?)
    }

    /// `self · other`, `None` on overflow.
    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        let mut terms = Vec::with_capacity(self.0.len() * other.0.len());
        for a in &self.0 {
            for b in &other.0 {
                terms.push(a.mul(b)?);
            }
        }
        normal(terms)
    }

    /// `self / other` when the division is exact: polynomial long division (in the order of
    /// `Monomial::order_key`) that leaves no remainder.
    pub fn div_exact(&self, other: &Dim) -> Option<Dim> {
        let lead = other.0.first()?;
        let mut rest = self.clone();
        let mut quotient = Dim::known(0);
        for _ in 0..MAX_DIVISION_STEPS {
            let Some(top) = rest.0.first() else {
                return Some(quotient);
            };
            let q = Dim(vec![top.div_exact(lead)?]);
            rest = rest.sub(&q.mul(other)?)?;
            quotient = quotient.add(&q)?;
        }
        None
    }

    /// The symbol's name when the dimension is exactly one named symbol (a graph `dim_param`,
    /// not a fresh name made up for an unnamed dimension).
    pub fn as_symbol(&self) -> Option<&str> {
        match self.0.as_slice() {
            [m] if m.coef == 1 && m.syms.len() == 1 => m
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

    /// A lower bound that holds for every value of the symbols (symbols are ≥ 0), when all
    /// coefficients are positive: the constant term. `None` when a term may be negative.
    pub fn lower_bound(&self) -> Option<i64> {
        if self.0.iter().any(|m| m.coef < 0) {
            return None;
        }
        Some(
            self.0
                .iter()
                .filter(|m| m.syms.is_empty())
                .map(|m| m.coef)
                .sum(),
        )
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "0");
        }
        for (i, m) in self.0.iter().enumerate() {
            let sign = if m.coef < 0 { "-" } else { "+" };
            match (i, sign) {
                (0, "-") => write!(f, "-")?,
                (0, _) => {}
                _ => write!(f, " {sign} ")?,
            }
            write!(f, "{}", MonomialText(m))?;
        }
        Ok(())
    }
}

/// A monomial without its sign: `4·B·L`, `L^2`, `7`.
struct MonomialText<'a>(&'a Monomial);

impl fmt::Display for MonomialText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Monomial { coef, syms } = self.0;
        let mut parts = Vec::new();
        // unsigned: i64::MIN has no i64 absolute value
        if coef.unsigned_abs() != 1 || syms.is_empty() {
            parts.push(coef.unsigned_abs().to_string());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: &str) -> Dim {
        Dim::sym(n)
    }

    #[test]
    fn extreme_sizes_print() {
        // a hostile model's constant (seed 37 case 13680 overflowed `abs` here)
        assert_eq!(Dim::known(i64::MIN).to_string(), "-9223372036854775808");
        assert_eq!(Dim::known(i64::MAX).to_string(), "9223372036854775807");
    }

    #[test]
    fn sums_keep_a_normal_form() {
        let p_l = s("P").add(&s("L")).unwrap();
        assert_eq!(p_l, s("L").add(&s("P")).unwrap(), "order does not matter");
        assert_eq!(p_l.sub(&s("L")).unwrap(), s("P"));
        assert_eq!(p_l.sub(&p_l).unwrap(), Dim::known(0));
        assert!(Dim::known(0).is(0));
        assert_eq!(p_l.to_string(), "P + L");
        assert_eq!(s("T").sub(&s("L")).unwrap().to_string(), "T - L");
    }

    #[test]
    fn exact_division_of_polynomials() {
        let b = s("B");
        let p_l = s("P").add(&s("L")).unwrap();
        let total = b.mul(&Dim::known(4)).unwrap().mul(&p_l).unwrap();
        assert_eq!(total.div_exact(&p_l), Some(b.mul(&Dim::known(4)).unwrap()));
        assert_eq!(total.div_exact(&Dim::known(4)), Some(b.mul(&p_l).unwrap()));
        assert_eq!(
            total.div_exact(&s("P")),
            None,
            "P does not divide 4·B·(P + L)"
        );
        assert_eq!(p_l.div_exact(&Dim::known(2)), None);
    }

    #[test]
    fn lower_bounds_hold_for_every_size() {
        assert_eq!(s("P").add(&Dim::known(3)).unwrap().lower_bound(), Some(3));
        assert_eq!(s("T").sub(&s("L")).unwrap().lower_bound(), None);
        assert_eq!(s("P").lower_bound(), Some(0), "a past length may be 0");
    }
}
