//! GELU in the two forms exporters write it, each becoming one ONNX `Gelu` (opset 20):
//!
//! ```text
//! tanh form (GPT-2's NewGELU, `approximate="tanh"`):
//!   t = Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), √(2/π)))
//! erf form (BERT, `approximate="none"`):
//!   t = Erf(Div(x, √2))  |  Erf(Mul(x, 1/√2))
//! both:
//!   y = x · 0.5 · (1 + t)   as any two Muls: Mul(Mul(x, 0.5), 1 + t), Mul(Mul(x, 1 + t), 0.5),
//!                            Mul(x, Mul(1 + t, 0.5)); every commutation
//! ```
//!
//! The constants must be the canonical ones up to float rounding (relative 1e-6); every
//! intermediate must be read only inside the pattern; `x` must be a float tensor. The fused
//! op computes the same formula, so results differ by rounding only.

use attnrt_onnx::node_label;

use crate::graph::GraphView;
use crate::mismatch::{Check, Mismatch};

/// √(2/π).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh form.
const CUBIC: f64 = 0.044_715;

/// Which GELU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    Tanh,
    /// `0.5·x·(1 + erf(x/√2))`.
    Erf,
}

impl Form {
    /// The `approximate` attribute of ONNX `Gelu`.
    pub fn approximate(self) -> &'static str {
        match self {
            Form::Tanh => "tanh",
            Form::Erf => "none",
        }
    }
}

/// A proven GELU.
#[derive(Clone, Debug)]
pub struct GeluMatch {
    /// The form.
    pub form: Form,
    /// The input `x`.
    pub input: String,
    /// The output (the last Mul's).
    pub output: String,
    /// The nodes replaced.
    pub nodes: Vec<usize>,
}

/// Whether node `idx` (a `Tanh` or an `Erf`) looks like the inside of a GELU: its input is
/// scaled by the form's constant. Only such anchors are tried (and reported when they fail).
pub fn anchor(view: &GraphView, idx: usize) -> Option<Form> {
    let n = view.node(idx);
    let form = match n.op_type.as_str() {
        "Tanh" => Form::Tanh,
        "Erf" => Form::Erf,
        _ => return None,
    };
    inner_scale(view, &n.input[0], form)
        .is_some()
        .then_some(form)
}

/// Matches the GELU around anchor `idx` of `form`.
pub fn check(view: &GraphView, idx: usize, form: Form) -> Result<GeluMatch, Mismatch> {
    let at = node_label(view.node(idx));
    let refuse = |check, expected: &str, found: String| Mismatch::new(&at, check, expected, found);
    let (inner, mut nodes) =
        inner_scale(view, &view.node(idx).input[0], form).ok_or_else(|| {
            refuse(
                Check::Variant,
                "the form's scaled input",
                "input not scaled".into(),
            )
        })?;
    let x = match form {
        Form::Erf => inner,
        Form::Tanh => {
            let (x, sum) = cubic_sum(view, &inner).ok_or_else(|| {
                refuse(
                    Check::Variant,
                    "x + 0.044715·Pow(x, 3) inside the tanh",
                    "no cubic term x + 0.044715·Pow(x, 3) of one x".into(),
                )
            })?;
            nodes.extend(sum);
            x
        }
    };
    nodes.push(idx);
    let (output, outer) = outer_product(view, &view.node(idx).output[0], &x)
        .map_err(|found| refuse(Check::Variant, "x · 0.5 · (1 + t) after the anchor", found))?;
    nodes.extend(outer);
    exclusive(view, &nodes, &output).map_err(|found| {
        refuse(
            Check::Exclusive,
            "intermediates used only inside the GELU",
            found,
        )
    })?;
    if !is_float(view, &x) {
        return Err(refuse(
            Check::Variant,
            "a float input",
            format!("'{x}' is not a float tensor (or its type is unknown)"),
        ));
    }
    nodes.sort_unstable();
    Ok(GeluMatch {
        form,
        input: x,
        output,
        nodes,
    })
}

/// The scalar constant `t` holds, when known.
fn scalar(view: &GraphView, t: &str) -> Option<f64> {
    view.value(t)
        .filter(|v| v.len() == 1)
        .and_then(|v| v.scalar_f64())
}

fn close(v: f64, want: f64) -> bool {
    ((v - want) / want).abs() <= 1e-6
}

/// `Mul(a, b)` or `Mul(b, a)` with `b` a scalar constant close to `want`: returns `a`.
fn scaled_by(view: &GraphView, n: &attnrt_onnx::NodeProto, want: f64) -> Option<String> {
    if n.op_type != "Mul" || n.input.len() != 2 {
        return None;
    }
    let (a, b) = (&n.input[0], &n.input[1]);
    match (scalar(view, a), scalar(view, b)) {
        (_, Some(c)) if close(c, want) => Some(a.clone()),
        (Some(c), _) if close(c, want) => Some(b.clone()),
        _ => None,
    }
}

/// The anchor's input as the form scales it: `Mul(u, √(2/π))` (tanh) or `Div(x, √2)` /
/// `Mul(x, 1/√2)` (erf). Returns what is scaled (`u` or `x`) and the scaling node.
fn inner_scale(view: &GraphView, t: &str, form: Form) -> Option<(String, Vec<usize>)> {
    let p = view.producer(t)?;
    let n = view.node(p);
    match form {
        Form::Tanh => Some((scaled_by(view, n, SQRT_2_OVER_PI)?, vec![p])),
        Form::Erf => {
            let x = match n.op_type.as_str() {
                "Div" if n.input.len() == 2 => {
                    close(scalar(view, &n.input[1])?, std::f64::consts::SQRT_2)
                        .then(|| n.input[0].clone())?
                }
                _ => scaled_by(view, n, std::f64::consts::FRAC_1_SQRT_2)?,
            };
            Some((x, vec![p]))
        }
    }
}

/// `u = Add(x, Mul(Pow(x, 3), 0.044715))` (any order): `x` and the three nodes.
fn cubic_sum(view: &GraphView, u: &str) -> Option<(String, Vec<usize>)> {
    let add = view.producer(u)?;
    if view.node(add).op_type != "Add" {
        return None;
    }
    let x = tanh_x(view, add)?;
    let mut nodes = cubic(view, &view.node(add).input, &x)?;
    nodes.push(add);
    Some((x, nodes))
}

/// In `Add(x, c)` (either order) with `c` from a Mul by 0.044715: `x`.
fn tanh_x(view: &GraphView, add: usize) -> Option<String> {
    let n = view.node(add);
    let is_cubic_term = |t: &str| {
        view.producer(t)
            .is_some_and(|q| scaled_by(view, view.node(q), CUBIC).is_some())
    };
    match (is_cubic_term(&n.input[1]), is_cubic_term(&n.input[0])) {
        (true, _) => Some(n.input[0].clone()),
        (_, true) => Some(n.input[1].clone()),
        _ => None,
    }
}

/// The cubic term of `Add(x, Mul(Pow(x, 3), 0.044715))` (`add_inputs`): its two nodes.
fn cubic(view: &GraphView, add_inputs: &[String], x: &str) -> Option<Vec<usize>> {
    let term = add_inputs.iter().find(|t| t.as_str() != x)?;
    let mul = view.producer(term)?;
    let cubed = scaled_by(view, view.node(mul), CUBIC)?;
    let pow = view.producer(&cubed)?;
    let pn = view.node(pow);
    let ok = pn.op_type == "Pow"
        && pn.input.len() == 2
        && pn.input[0] == x
        && scalar(view, &pn.input[1]) == Some(3.0);
    ok.then(|| vec![pow, mul])
}

/// After the anchor's output `t`: `1 + t`, then the product with `x` and 0.5 in two Muls.
/// Returns the final output and the nodes.
fn outer_product(view: &GraphView, t: &str, x: &str) -> Result<(String, Vec<usize>), String> {
    let sole = |t: &str| match view.consumers(t) {
        [c] if !view.in_subgraph(*c) => Ok(*c),
        [] => Err(format!("'{t}' is not read")),
        readers => {
            let readers: Vec<String> = readers.iter().map(|&c| view.label(c)).collect();
            Err(format!(
                "'{t}' is read by {}, not by exactly one node of the graph",
                readers.join(", ")
            ))
        }
    };
    let add = sole(t)?;
    let an = view.node(add);
    let other = an.input.iter().find(|i| i.as_str() != t);
    if an.op_type != "Add" || other.and_then(|o| scalar(view, o)) != Some(1.0) {
        return Err(format!("{} is not 1 + t", node_label(an)));
    }
    let one_plus = &an.output[0];
    let m1 = sole(one_plus)?;
    let n1 = view.node(m1);
    if n1.op_type != "Mul" || n1.input.len() != 2 {
        return Err(format!("{} is not a Mul", node_label(n1)));
    }
    let partner = if n1.input[0] == *one_plus {
        &n1.input[1]
    } else {
        &n1.input[0]
    };
    // Mul(Mul(x, 0.5), 1 + t)
    if let Some(half) = view.producer(partner) {
        if scaled_by(view, view.node(half), 0.5).as_deref() == Some(x) {
            return Ok((n1.output[0].clone(), vec![add, half, m1]));
        }
    }
    // Mul(Mul(x, 1 + t), 0.5) or Mul(Mul(1 + t, 0.5), x)
    let want = match scalar(view, partner) {
        Some(c) if close(c, 0.5) => Some(x.to_string()),
        None if partner == x => None,
        _ => {
            return Err(format!(
                "{} multiplies by neither x nor 0.5",
                node_label(n1)
            ))
        }
    };
    let m2 = sole(&n1.output[0])?;
    let n2 = view.node(m2);
    let last_ok = match &want {
        Some(x) => n2.op_type == "Mul" && n2.input.iter().any(|i| i == x),
        None => scaled_by(view, n2, 0.5).is_some(),
    };
    if !last_ok {
        return Err(format!(
            "{} does not complete x · 0.5 · (1 + t)",
            node_label(n2)
        ));
    }
    Ok((n2.output[0].clone(), vec![add, m1, m2]))
}

/// No intermediate (outputs of `nodes` other than `output`) is read outside or is a graph
/// output.
fn exclusive(view: &GraphView, nodes: &[usize], output: &str) -> Result<(), String> {
    for &i in nodes {
        for o in view.node(i).output.iter().filter(|o| o.as_str() != output) {
            if view.is_graph_output(o) {
                return Err(format!("'{o}' is a graph output"));
            }
            if let Some(c) = view.consumers(o).iter().find(|c| !nodes.contains(c)) {
                return Err(format!("'{o}' is also read by {}", view.label(*c)));
            }
        }
    }
    Ok(())
}

fn is_float(view: &GraphView, t: &str) -> bool {
    use attnrt_onnx::DataType;
    matches!(
        view.elem_type(t).and_then(|e| DataType::try_from(e).ok()),
        Some(DataType::Float | DataType::Float16 | DataType::Double | DataType::Bfloat16)
    )
}
