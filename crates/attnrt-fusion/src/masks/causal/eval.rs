//! The abstract evaluation of a mask tensor: one small function per op that a provable causal
//! mask is built from.

use std::cell::Cell;

use attnrt_onnx::{attr, node_label, DataType, NodeProto};

use super::constant::{constant_tri, uniform_value};
use super::domain::{known_int, last2, refuse, strong, Rest, Sym, Tri, MAX_DEPTH};
use super::positions::compare;
use crate::graph::{tensor_value, tensor_value_limited, Dim, GraphView, Value};
use crate::masks::fill_str;
use crate::mismatch::Mismatch;

/// Largest constant checked element by element (a 2048×2048 causal buffer).
const MAX_CONSTANT_ELEMENTS: usize = 1 << 22;

/// How many tensors one layer's evaluation may visit.
const MAX_STEPS: usize = 4096;

/// The abstract value of `t`.
pub(super) fn eval(view: &GraphView, t: &str) -> Result<Sym, Mismatch> {
    Eval {
        view,
        steps: &Cell::new(0),
    }
    .tensor(t, 0)
}

/// One evaluation; `steps` bounds the work on graphs that share subexpressions.
#[derive(Clone, Copy)]
struct Eval<'v, 'a> {
    view: &'v GraphView<'a>,
    steps: &'v Cell<usize>,
}

/// The node being evaluated, with its label and depth.
struct At<'n> {
    n: &'n NodeProto,
    label: String,
    depth: usize,
}

impl At<'_> {
    fn input(&self, i: usize) -> &str {
        self.n.input.get(i).map(String::as_str).unwrap_or("")
    }

    fn refuse(&self, found: impl Into<String>) -> Mismatch {
        refuse(&self.label, found)
    }
}

impl Eval<'_, '_> {
    fn tensor(self, t: &str, depth: usize) -> Result<Sym, Mismatch> {
        if depth > MAX_DEPTH {
            return Err(refuse(format!("'{t}'"), "mask chain too deep"));
        }
        self.steps.set(self.steps.get() + 1);
        if self.steps.get() > MAX_STEPS {
            return Err(refuse(format!("'{t}'"), "mask graph too large to analyse"));
        }
        if let Some(s) = self.constant(t) {
            return s;
        }
        let view = self.view;
        let p = view
            .producer(t)
            .ok_or_else(|| refuse(format!("'{t}'"), "a graph input, not a provable triangle"))?;
        let n = view.node(p);
        let at = At {
            n,
            label: node_label(n),
            depth,
        };
        if !attnrt_onnx::opset::is_default_domain(&n.domain) {
            return Err(at.refuse("not a default-domain op"));
        }
        self.node(&at, p, t)
    }

    /// Operand `i` of the node at `at`.
    fn sub(self, at: &At, i: usize) -> Result<Sym, Mismatch> {
        self.tensor(at.input(i), at.depth + 1)
    }

    /// A constant: uniform, or checked element by element. Buffers larger than the view keeps
    /// (GPT-2's 1024×1024 `bias`) are read here, once.
    fn constant(self, t: &str) -> Option<Result<Sym, Mismatch>> {
        let view = self.view;
        // An initializer that is also a graph input can be replaced at run time: not a proof.
        let fixed = view.is_constant(t) || view.producer(t).is_some();
        if let Some(v) = view.value(t).filter(|_| fixed) {
            return Some(of_value(view, t, v));
        }
        let big = view
            .initializer(t)
            .filter(|_| view.is_constant(t))
            .or_else(|| {
                let p = view.node(view.producer(t)?);
                (p.op_type == "Constant")
                    .then(|| attr::tensor(p, "value").ok().flatten())
                    .flatten()
            })?;
        Some(match tensor_value_limited(big, MAX_CONSTANT_ELEMENTS) {
            Some(v) => of_value(view, t, &v),
            None => Err(refuse(
                format!("'{t}'"),
                format!(
                    "constant {:?} is too large (over {MAX_CONSTANT_ELEMENTS} elements) or not \
                     readable to check",
                    big.dims
                ),
            )),
        })
    }

    fn node(self, at: &At, p: usize, t: &str) -> Result<Sym, Mismatch> {
        // Identity, an inference Dropout, a Cast to the same type: the value passes through.
        if self.view.passthrough(p).is_ok() {
            return self.sub(at, 0);
        }
        match at.n.op_type.as_str() {
            "Cast" => self.cast(at),
            "ConstantOfShape" => Ok(Sym::Uniform(
                attr::tensor(at.n, "value")
                    .ok()
                    .flatten()
                    .and_then(tensor_value)
                    .and_then(|v| uniform_value(&v))
                    .unwrap_or(0.0),
            )),
            "Expand" | "Unsqueeze" => {
                let s = self.sub(at, 0)?;
                if let Some(tr) = s.tri() {
                    self.same_last2(at, t, tr)?;
                }
                Ok(s)
            }
            "Slice" => self.slice(at, t),
            "Trilu" => self.trilu(at, t),
            "Equal" => self.equal(at),
            "Not" => match self.sub(at, 0)? {
                Sym::Uniform(v) => Ok(Sym::Uniform((v == 0.0) as u8 as f64)),
                Sym::Tri(tr) => Ok(Sym::Tri(tr.map(|v| (v == 0.0) as u8 as f64))),
                s => Err(at.refuse(format!("negates {}", s.describe()))),
            },
            "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" => compare(self.view, t),
            "And" | "Or" => self.and_or(at),
            "Where" => self.select(at),
            "Add" => self.add(at),
            op => Err(at.refuse(format!("{op} is not part of a provable causal mask"))),
        }
    }

    fn cast(self, at: &At) -> Result<Sym, Mismatch> {
        let to = attr::int(at.n, "to").ok().flatten().unwrap_or(0) as i32;
        let is_bool = to == DataType::Bool as i32;
        let is_float = to == DataType::Float as i32 || to == DataType::Double as i32;
        match self.sub(at, 0)? {
            Sym::Uniform(v) if is_bool => Ok(Sym::Uniform((v != 0.0) as u8 as f64)),
            Sym::Tri(tr) if is_bool => Ok(Sym::Tri(tr.map(|v| (v != 0.0) as u8 as f64))),
            // Float casts keep 0, 1, -inf and finfo.min exactly.
            s @ (Sym::Uniform(_) | Sym::Tri(_)) if is_float => Ok(s),
            s @ (Sym::KeepAnd(..) | Sym::MaskedOr(..)) if is_bool => Ok(s),
            s @ Sym::Additive(..) if is_float && self.view.elem_type(at.input(0)) == Some(to) => {
                Ok(s)
            }
            s => Err(at.refuse(format!("casts {} to type {to}", s.describe()))),
        }
    }

    /// Keeps a triangle only through ops that do not move or stretch its last two axes.
    fn same_last2(self, at: &At, output: &str, tri: &Tri) -> Result<(), Mismatch> {
        match last2(self.view, output) {
            Some((r, c)) if r == tri.rows && c == tri.cols => Ok(()),
            Some((r, c)) => Err(at.refuse(format!(
                "turns the {}×{} triangle into {r}×{c}",
                tri.rows, tri.cols
            ))),
            None => Err(at.refuse(format!(
                "shape of '{output}' (from '{}') unknown",
                at.input(0)
            ))),
        }
    }

    /// Only a top-left block of a triangle is the same triangle.
    fn slice(self, at: &At, t: &str) -> Result<Sym, Mismatch> {
        let view = self.view;
        let s = self.sub(at, 0)?;
        let Sym::Tri(tr) = s else {
            return Err(at.refuse(format!("slices {}", s.describe())));
        };
        let known = |i: usize, what: &str| {
            view.value(at.input(i))
                .and_then(Value::known_ints)
                .ok_or_else(|| at.refuse(format!("{what} unknown")))
        };
        let present = |i: usize| at.n.input.len() > i && !at.input(i).is_empty();
        let rank = view
            .rank(at.input(0))
            .ok_or_else(|| at.refuse("rank unknown"))? as i64;
        let starts = known(1, "starts")?;
        let axes = if present(3) {
            known(3, "axes")?
        } else {
            (0..starts.len() as i64).collect()
        };
        let steps = if present(4) {
            known(4, "steps")?
        } else {
            vec![1; starts.len()]
        };
        if axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(at.refuse("starts/axes/steps lengths differ"));
        }
        for ((&a, &s), &st) in axes.iter().zip(&starts).zip(&steps) {
            let a = if a < 0 { a + rank } else { a };
            if s != 0 || st != 1 {
                return Err(at.refuse(format!(
                    "slices axis {a} from {s} with step {st}, not from 0 with step 1 (a block \
                     off the diagonal is not causal)"
                )));
            }
        }
        let (rows, cols) = last2(view, t).ok_or_else(|| at.refuse("output shape unknown"))?;
        let how = if tr.how.ends_with("sliced from 0") {
            tr.how.clone()
        } else {
            format!("{} sliced from 0", tr.how)
        };
        Ok(Sym::Tri(Tri {
            rows,
            cols,
            how,
            ..tr
        }))
    }

    /// `Trilu` of a uniform tensor: lower keeps `j ≤ i + k`, upper keeps `j ≥ i + k`.
    fn trilu(self, at: &At, t: &str) -> Result<Sym, Mismatch> {
        let upper = attr::int(at.n, "upper").ok().flatten().unwrap_or(1) != 0;
        let k = if at.n.input.len() > 1 && !at.input(1).is_empty() {
            known_int(self.view, at.input(1)).ok_or_else(|| at.refuse("k unknown"))?
        } else {
            0
        };
        let v = match self.sub(at, 0)? {
            Sym::Uniform(v) => v,
            s => {
                return Err(at.refuse(format!("applied to {}, not a uniform tensor", s.describe())))
            }
        };
        let (rows, cols) = last2(self.view, t).ok_or_else(|| at.refuse("shape unknown"))?;
        let (below, above) = match (upper, k) {
            (false, 0) => (v, 0.0),
            (true, 1) => (0.0, v),
            (false, k) => {
                return Err(at.refuse(format!("tril with k = {k} (off the diagonal by {k})")))
            }
            (true, k) => {
                return Err(at.refuse(format!(
                    "triu with k = {k} (off the diagonal by {})",
                    k.saturating_sub(1)
                )))
            }
        };
        if below == above {
            return Err(at.refuse(format!("of a uniform {v}: no triangle")));
        }
        Ok(Sym::Tri(Tri {
            below,
            above,
            rows,
            cols,
            diagonal: Dim::known(0),
            how: format!("Trilu(upper={}, k={k}) of a uniform {v}", upper as u8),
        }))
    }

    fn equal(self, at: &At) -> Result<Sym, Mismatch> {
        let (x, c) = match (self.sub(at, 0), self.sub(at, 1)) {
            (Ok(Sym::Uniform(c)), Ok(x)) | (Ok(x), Ok(Sym::Uniform(c))) => (x, c),
            (Err(e), _) | (_, Err(e)) => return Err(e),
            _ => return Err(at.refuse("compares two non-constant masks")),
        };
        let eq = |v: f64| (v == c) as u8 as f64;
        match x {
            Sym::Uniform(v) => Ok(Sym::Uniform(eq(v))),
            Sym::Tri(tr) => Ok(Sym::Tri(tr.map(eq))),
            s => Err(at.refuse(format!("compares {}", s.describe()))),
        }
    }

    /// `And`/`Or` of the triangle with the identity element or with another mask (which stays).
    fn and_or(self, at: &At) -> Result<Sym, Mismatch> {
        let is_and = at.n.op_type == "And";
        // The identity element (true for And, false for Or) drops out.
        let unit = if is_and { 1.0 } else { 0.0 };
        let sides = [self.sub(at, 0), self.sub(at, 1)];
        if let Some(u) = sides
            .iter()
            .position(|s| matches!(s, Ok(Sym::Uniform(u)) if *u == unit))
        {
            return sides[1 - u].clone();
        }
        let Some(ts) = sides.iter().position(|s| matches!(s, Ok(Sym::Tri(_)))) else {
            return match sides.into_iter().find_map(Result::err) {
                Some(e) => Err(e),
                None => Err(at.refuse("no triangle among its operands")),
            };
        };
        let Ok(Sym::Tri(tr)) = sides[ts].clone() else {
            unreachable!("ts points at a triangle")
        };
        let rest = at.input(1 - ts).to_string();
        match &sides[1 - ts] {
            Ok(Sym::Tri(_)) => Err(at.refuse("combines two triangles")),
            Ok(Sym::Uniform(u)) => Err(at.refuse(format!("with the constant {u} (not {unit})"))),
            // The other operand is a mask of its own (padding): it stays.
            _ if is_and && tr.below == 1.0 && tr.above == 0.0 => Ok(Sym::KeepAnd(tr, rest)),
            _ if !is_and && tr.below == 0.0 && tr.above == 1.0 => Ok(Sym::MaskedOr(tr, rest)),
            _ => Err(at.refuse(format!(
                "{} with a triangle that is {} on/below the diagonal",
                at.n.op_type, tr.below
            ))),
        }
    }

    /// `Where(cond, a, b)` with constant branches.
    fn select(self, at: &At) -> Result<Sym, Mismatch> {
        let cond = self.sub(at, 0)?;
        let (Sym::Uniform(a), Sym::Uniform(b)) = (self.sub(at, 1)?, self.sub(at, 2)?) else {
            return Err(at.refuse("branches are not constants"));
        };
        match cond {
            Sym::Uniform(c) => Ok(Sym::Uniform(if c != 0.0 { a } else { b })),
            Sym::Tri(tr) => Ok(Sym::Tri(tr.map(|c| if c != 0.0 { a } else { b }))),
            // (j ≤ i) ∧ rest → 0, else fill: the triangle plus `rest` kept with `fill`.
            Sym::KeepAnd(tr, rest) if a == 0.0 && strong(b) => Ok(Sym::Additive(
                Tri {
                    below: 0.0,
                    above: b,
                    ..tr
                },
                Rest::Fill {
                    cond: rest,
                    fill: at.input(2).to_string(),
                    fill_value: b,
                    masked_when_true: false,
                },
            )),
            Sym::MaskedOr(tr, rest) if b == 0.0 && strong(a) => Ok(Sym::Additive(
                Tri {
                    below: 0.0,
                    above: a,
                    ..tr
                },
                Rest::Fill {
                    cond: rest,
                    fill: at.input(1).to_string(),
                    fill_value: a,
                    masked_when_true: true,
                },
            )),
            s => Err(at.refuse(format!(
                "Where({}, {a}, {b}) is not a causal mask",
                s.describe()
            ))),
        }
    }

    /// `Add` of a triangle and a constant, of zeros, or of another additive mask (which stays).
    fn add(self, at: &At) -> Result<Sym, Mismatch> {
        let sides = [self.sub(at, 0), self.sub(at, 1)];
        let Some(ts) = sides.iter().position(|s| matches!(s, Ok(Sym::Tri(_)))) else {
            // Adding zeros (the ONNX expansion's empty attn_bias) changes nothing.
            return match (&sides[0], &sides[1]) {
                (Ok(Sym::Uniform(u)), s) | (s, Ok(Sym::Uniform(u))) if *u == 0.0 => s.clone(),
                (Err(e), _) | (_, Err(e)) => Err(e.clone()),
                _ => Err(at.refuse("adds no triangle")),
            };
        };
        let Ok(Sym::Tri(tr)) = sides[ts].clone() else {
            unreachable!("ts points at a triangle")
        };
        match &sides[1 - ts] {
            Ok(Sym::Uniform(u)) => {
                let u = *u;
                Ok(Sym::Tri(tr.map(|v| v + u)))
            }
            Ok(s) => Err(at.refuse(format!("adds a triangle and {}", s.describe()))),
            Err(_) if tr.below != 0.0 || !strong(tr.above) => Err(at.refuse(format!(
                "adds a triangle that is {} on/below the diagonal and {} above (not 0 and -inf)",
                fill_str(tr.below),
                fill_str(tr.above)
            ))),
            // The other operand is an additive mask of its own (the attn_mask): it stays.
            Err(_) => Ok(Sym::Additive(
                tr,
                Rest::Additive(at.input(1 - ts).to_string()),
            )),
        }
    }
}

/// A known value: uniform, or a triangle checked element by element.
fn of_value(view: &GraphView, t: &str, v: &Value) -> Result<Sym, Mismatch> {
    match uniform_value(v) {
        Some(u) => Ok(Sym::Uniform(u)),
        None => constant_tri(view, t, v).map(Sym::Tri),
    }
}
