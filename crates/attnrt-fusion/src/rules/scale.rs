//! Scale forms: how exporters scale the scores, and the `scale` attribute that says the same.
//!
//! ```text
//! Div(x, s) | Mul(x, s) | Mul(s, x)                 after the QK MatMul ("div-scale", "mul-scale")
//! MatMul(Mul(Q, s), Mul(Kᵀ, s))                     split over Q and Kᵀ ("q-scale", "k-scale")
//! (none)                                            T5: `scale = 1` ("no-scale")
//! ```
//!
//! `s` is a number known before run time: a constant, or computed from static shapes (SDPA's
//! `Shape→Sqrt`); a computed scale equal to 1/sqrt(head_size) is left to the op's default.

use attnrt_onnx::node_label;

use crate::graph::GraphView;
use crate::mismatch::{Check, Mismatch};
use crate::pattern::{alt, any, match_tensor, op, scalar, Captures, Pat};

/// The scale the layers multiply the scores by.
#[derive(Clone, Debug)]
pub struct Scale {
    /// The product of every factor (divisors inverted).
    pub value: f64,
    /// Whether a factor is computed at run time (from shapes) rather than stored.
    pub computed: bool,
    /// Whether any scale layer was seen.
    pub seen: bool,
}

impl Default for Scale {
    fn default() -> Scale {
        Scale {
            value: 1.0,
            computed: false,
            seen: false,
        }
    }
}

/// A scale layer on the scores by multiplication: `Mul(x, s)` / `Mul(s, x)`.
pub fn mul_scale() -> Pat {
    op("scale", &["Mul"], [any("inner"), scalar("factor")]).commutative()
}

/// A scale layer on the scores by division: `Div(x, s)`.
pub fn div_scale() -> Pat {
    op("scale", &["Div"], [any("inner"), scalar("divisor")])
}

/// An operand of the QK MatMul, scaled (`Mul(x, s)` in either order, tagged `tag`) or not.
pub fn scaled_operand(
    node: &'static str,
    x: &'static str,
    factor: &'static str,
    tag: &'static str,
    plain: &'static str,
) -> Pat {
    alt([
        (
            tag,
            op(node, &["Mul"], [any(x), scalar(factor)]).commutative(),
        ),
        (plain, any(x)),
    ])
}

impl Scale {
    /// Applies the scale layer producing `t` (node `at`, a `Mul` or `Div`); returns the scaled
    /// tensor.
    pub fn layer(
        &mut self,
        view: &GraphView,
        at: usize,
        t: &str,
        tags: &mut Vec<String>,
    ) -> Result<String, Mismatch> {
        let (pattern, tag) = match view.node(at).op_type.as_str() {
            "Div" => (div_scale(), "div-scale"),
            _ => (mul_scale(), "mul-scale"),
        };
        let mut c = Captures::default();
        // The failure is the scale layer's, whichever of its tensors it is about.
        match_tensor(view, t, &pattern, &mut c).map_err(|m| Mismatch {
            node: node_label(view.node(at)),
            check: Check::Scale,
            ..m
        })?;
        tags.push(tag.into());
        let (f, divides) = match (c.tensor("factor"), c.tensor("divisor")) {
            (Some(f), _) => (f, false),
            (None, d) => (d.unwrap_or_default(), true),
        };
        let v = self.factor(view, f);
        self.value = if divides {
            self.value / v
        } else {
            self.value * v
        };
        self.seen = true;
        Ok(c.tensor("inner").unwrap_or_default().to_string())
    }

    /// Applies the factors the QK MatMul's match captured on Q and Kᵀ.
    pub fn split(&mut self, view: &GraphView, qk: &Captures) {
        for f in ["q_factor", "k_factor"] {
            if let Some(t) = qk.tensor(f) {
                self.value *= self.factor(view, t);
                self.seen = true;
            }
        }
    }

    /// The value of the factor tensor `t`, noting whether it is computed at run time.
    fn factor(&mut self, view: &GraphView, t: &str) -> f64 {
        self.computed |= !view.is_constant(t);
        view.value(t)
            .and_then(|v| v.scalar_f64())
            .unwrap_or(f64::NAN)
    }

    /// Checks the scale is usable: a positive finite number (at the QK MatMul `qk`).
    pub fn check(&self, view: &GraphView, qk: usize) -> Result<(), Mismatch> {
        if !self.value.is_finite() || self.value <= 0.0 {
            return Err(Mismatch::new(
                node_label(view.node(qk)),
                Check::Scale,
                "a positive finite scale",
                format!("scale {} is not a positive finite number", self.value),
            ));
        }
        Ok(())
    }

    /// The `scale` attribute to emit for a head size `head_size` (when known).
    pub fn attribute(&self, head_size: Option<i64>) -> ScaleAttr {
        // Omit the attribute only when computed at run time and equal to the default.
        let default = head_size.map(|d| 1.0 / (d as f64).sqrt());
        if !self.seen {
            ScaleAttr::Unscaled
        } else if self.computed && default.is_some_and(|d| ((d - self.value) / d).abs() < 1e-6) {
            ScaleAttr::RuntimeDefault
        } else {
            ScaleAttr::Value(self.value as f32)
        }
    }
}

/// The `scale` attribute of the fused node, and how it was chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScaleAttr {
    /// No scale layer (T5): `scale = 1`.
    Unscaled,
    /// A scale computed at run time equal to the op's default 1/sqrt(head_size): omitted.
    RuntimeDefault,
    /// The product of the factors.
    Value(f32),
}

impl ScaleAttr {
    /// The attribute to emit (`None`: the op's default 1/sqrt(head_size)).
    pub fn value(self) -> Option<f32> {
        match self {
            ScaleAttr::Unscaled => Some(1.0),
            ScaleAttr::RuntimeDefault => None,
            ScaleAttr::Value(v) => Some(v),
        }
    }

    /// The tag for the report's rule, when the choice is worth one.
    pub fn tag(self) -> Option<&'static str> {
        match self {
            ScaleAttr::Unscaled => Some("no-scale"),
            ScaleAttr::RuntimeDefault => Some("runtime-scale=default"),
            ScaleAttr::Value(_) => None,
        }
    }
}
