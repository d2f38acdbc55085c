//! `Pow(x, c)` with a constant exponent c ∈ {2, 3, 4} and a float32 or float64 base runs as
//! multiplications: `x·x`, `(x·x)·x`, `(x·x)·(x·x)`.
//!
//! tract runs a Pow by a constant as a scalar `powf` per element; GPT-2's tanh-form GELU
//! (`Pow(x, 3)` in every layer) spent more time there than in all attention blocks. As `Mul`s,
//! tract makes `x·x` a `Square` and the product a vectorised binary `Mul`.
//!
//! Rounding, not exactness: `x·x` is x² correctly rounded (as `powf(x, 2)`, which tract itself
//! runs as a square). x³ and x⁴ take two roundings, so each is within 2 units of roundoff
//! (relative 2·2⁻²⁴ ≈ 1.2e-7 in float32) of the exact power, where `powf` is within about one;
//! NaN, ±∞ and ±0 give what `powf` gives, and a power that overflows overflows either way.
//!
//! Rewritten only when all of this holds: default-domain `Pow` with one output; the exponent
//! a rank-0 tensor from an initializer that is not a graph input (a caller could override it)
//! or a `Constant` node, equal to exactly 2, 3 or 4; the base float32 or float64, known before
//! run time ([`super::types`]). Left to tract: float16/bfloat16 bases (each product would
//! round to 16 bits, up to about two 16-bit ulps from `powf` rounded once), the exponent 0.5
//! (tract already runs it as `Sqrt`), exponents of higher rank (they could broadcast the
//! output to a higher rank than `x`) and everything else.

use std::collections::{HashMap, HashSet};

use attnrt_onnx::proto::{tensor_proto, GraphProto, ModelProto, TensorProto};
use attnrt_onnx::{opset, DataType};

use super::types::ElemTypes;

/// The `Pow` nodes to rewrite, by output name, with their exponent.
#[derive(Debug, Default)]
struct PowRewrite {
    by_output: HashMap<String, u8>,
}

/// The value of a rank-0 numeric tensor stored in the model.
fn scalar_value(t: &TensorProto) -> Option<f64> {
    if !t.dims.is_empty() || t.data_location == tensor_proto::DataLocation::External as i32 {
        return None;
    }
    let dt = DataType::try_from(t.data_type).ok()?;
    let value = match dt {
        DataType::Double => match (t.double_data.as_slice(), &t.raw_data[..]) {
            ([v], _) => *v,
            ([], raw) => f64::from_le_bytes(raw.try_into().ok()?),
            _ => return None,
        },
        DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
            match attnrt_onnx::tensor::to_f32(t).ok()?.as_slice() {
                [v] => f64::from(*v),
                _ => return None,
            }
        }
        _ => match attnrt_onnx::tensor::to_i64(t).ok()?.as_slice() {
            [v] => *v as f64,
            _ => return None,
        },
    };
    Some(value)
}

/// The rank-0 constants of `g`: initializers that are not graph inputs, and `Constant` nodes.
fn scalar_constants(g: &GraphProto) -> HashMap<&str, f64> {
    let inputs: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    let mut values: HashMap<&str, f64> = g
        .initializer
        .iter()
        .filter(|t| t.dims.is_empty() && !inputs.contains(t.name.as_str()))
        .filter_map(|t| Some((t.name.as_str(), scalar_value(t)?)))
        .collect();
    for n in &g.node {
        if n.op_type != "Constant" || !opset::is_default_domain(&n.domain) {
            continue;
        }
        let (Some(out), [a]) = (n.output.first(), n.attribute.as_slice()) else {
            continue;
        };
        let value = match a.name.as_str() {
            "value" => a.t.as_ref().and_then(scalar_value),
            "value_float" => Some(f64::from(a.f)),
            "value_int" => Some(a.i as f64),
            _ => None,
        };
        if let Some(v) = value {
            values.insert(out.as_str(), v);
        }
    }
    values
}

/// Which `Pow` nodes of `model`'s graph run as multiplications (see the module docs).
fn plan_pow_rewrite(model: &ModelProto) -> PowRewrite {
    let mut plan = PowRewrite::default();
    let Some(g) = model.graph.as_ref() else {
        return plan;
    };
    if !g.node.iter().any(|n| n.op_type == "Pow") {
        return plan;
    }
    let constants = scalar_constants(g);
    let mut types = ElemTypes::new(g);
    for n in &g.node {
        let ([x, e], [out]) = (n.input.as_slice(), n.output.as_slice()) else {
            continue;
        };
        if n.op_type != "Pow" || !opset::is_default_domain(&n.domain) || out.is_empty() {
            continue;
        }
        let Some(exponent) = constants
            .get(e.as_str())
            .and_then(|&v| [2u8, 3, 4].into_iter().find(|&k| f64::from(k) == v))
        else {
            continue;
        };
        let float = [DataType::Float as i32, DataType::Double as i32];
        if types.of(x).is_some_and(|t| float.contains(&t)) {
            plan.by_output.insert(out.clone(), exponent);
        }
    }
    plan
}

/// The pass: the `Pow` nodes of `model`'s graph that can run as multiplications do so in `g`,
/// tract's copy of it (found by their output's name).
pub(super) fn pow_as_mul(model: &ModelProto, g: &mut tract_onnx::pb::GraphProto) {
    rewrite_pows(g, &plan_pow_rewrite(model));
}

/// Applies `plan` to the graph tract reads: each planned `Pow` becomes one or two `Mul`s. The
/// last `Mul` keeps the `Pow`'s name and output (profiles still count it as `Pow`); the square
/// of x^3 and x^4 gets a fresh name.
fn rewrite_pows(g: &mut tract_onnx::pb::GraphProto, plan: &PowRewrite) {
    if plan.by_output.is_empty() {
        return;
    }
    let mut names: HashSet<String> = HashSet::new();
    for n in &g.node {
        names.insert(n.name.clone());
        names.extend(n.input.iter().chain(&n.output).cloned());
    }
    names.extend(g.input.iter().map(|i| i.name.clone()));
    names.extend(g.initializer.iter().map(|t| t.name.clone()));
    let nodes = std::mem::take(&mut g.node);
    g.node.reserve(nodes.len());
    for n in nodes {
        let planned = match n.output.as_slice() {
            [out] if n.op_type == "Pow" && opset::is_default_domain(&n.domain) => {
                plan.by_output.get(out).copied()
            }
            _ => None,
        };
        match planned {
            Some(exponent) => g.node.extend(multiplications(&n, exponent, &mut names)),
            None => g.node.push(n),
        }
    }
}

/// The `Mul` nodes computing `pow`'s output with `exponent` ∈ {2, 3, 4}.
fn multiplications(
    pow: &tract_onnx::pb::NodeProto,
    exponent: u8,
    names: &mut HashSet<String>,
) -> Vec<tract_onnx::pb::NodeProto> {
    let mul = |name: &str, a: &str, b: &str, out: &str| tract_onnx::pb::NodeProto {
        name: name.to_string(),
        op_type: "Mul".into(),
        input: vec![a.to_string(), b.to_string()],
        output: vec![out.to_string()],
        ..Default::default()
    };
    let (x, out) = (pow.input[0].as_str(), pow.output[0].as_str());
    let name = if pow.name.is_empty() { out } else { &pow.name };
    if exponent == 2 {
        return vec![mul(name, x, x, out)];
    }
    let square = opset::fresh_name(&format!("{out}.attnrt_pow_square"), names);
    let square_node = opset::fresh_name(&format!("{name}.attnrt_pow_square"), names);
    let last = if exponent == 3 {
        mul(name, &square, x, out)
    } else {
        mul(name, &square, &square, out)
    };
    vec![mul(&square_node, x, x, &square), last]
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_onnx::attr::{make_float, make_tensor};
    use attnrt_testkit::{
        float_value, node, node_with_attrs, tensor_f32, tensor_i64, value_info, GraphBuilder,
    };
    use prost::Message;

    /// `y = Pow(x, e)` with x declared as `x_type`, and `e` from `exponent`.
    fn pow_model(x_type: DataType, exponent: impl FnOnce(&mut GraphBuilder)) -> ModelProto {
        let mut g = GraphBuilder::new("g");
        g.input(value_info("x", x_type, &["4"]));
        exponent(&mut g);
        g.node(node("pow", "Pow", &["x", "e"], &["y"]));
        g.output(value_info("y", x_type, &["4"]));
        g.into_model(17)
    }

    fn initializer(t: TensorProto) -> impl FnOnce(&mut GraphBuilder) {
        move |g| {
            g.initializer(t);
        }
    }

    fn planned(model: &ModelProto) -> Vec<u8> {
        let plan = plan_pow_rewrite(model);
        let mut e: Vec<u8> = plan.by_output.values().copied().collect();
        e.sort();
        e
    }

    #[test]
    fn small_integer_exponents_of_float_bases_are_planned() {
        for (value, want) in [(2.0, 2), (3.0, 3), (4.0, 4)] {
            let m = pow_model(DataType::Float, initializer(tensor_f32("e", &[], &[value])));
            assert_eq!(planned(&m), [want], "exponent {value}");
        }
        let m = pow_model(DataType::Double, initializer(tensor_i64("e", &[], &[3])));
        assert_eq!(planned(&m), [3], "int64 exponent, double base");
        let m = pow_model(DataType::Float, |g| {
            g.node(node_with_attrs(
                "c",
                "Constant",
                &[],
                &["e"],
                vec![make_tensor("value", tensor_f32("", &[], &[3.0]))],
            ));
        });
        assert_eq!(planned(&m), [3], "TorchScript's Constant exponent");
        let m = pow_model(DataType::Float, |g| {
            g.node(node_with_attrs(
                "c",
                "Constant",
                &[],
                &["e"],
                vec![make_float("value_float", 4.0)],
            ));
        });
        assert_eq!(planned(&m), [4], "value_float");
    }

    #[test]
    fn other_exponents_and_bases_are_left_alone() {
        let f32_exp = |v: f32| initializer(tensor_f32("e", &[], &[v]));
        let cases: Vec<(&str, ModelProto)> = vec![
            ("exponent 2.5", pow_model(DataType::Float, f32_exp(2.5))),
            ("exponent 0.5", pow_model(DataType::Float, f32_exp(0.5))),
            ("exponent 5", pow_model(DataType::Float, f32_exp(5.0))),
            ("float16 base", pow_model(DataType::Float16, f32_exp(3.0))),
            ("int64 base", pow_model(DataType::Int64, f32_exp(3.0))),
            (
                "rank-1 exponent",
                pow_model(DataType::Float, initializer(tensor_f32("e", &[1], &[3.0]))),
            ),
            (
                "exponent is a graph input",
                pow_model(DataType::Float, |g| {
                    g.initializer(tensor_f32("e", &[], &[3.0]));
                    g.input(float_value("e", &[]));
                }),
            ),
        ];
        for (what, m) in cases {
            assert!(planned(&m).is_empty(), "{what}");
        }
        // The base's type is unknown: it comes out of an op the type walk does not know.
        let mut g = GraphBuilder::new("g");
        g.input(float_value("a", &[4]));
        g.initializer(tensor_f32("e", &[], &[3.0]));
        g.node(node("custom", "SomeCustomOp", &["a"], &["x"]));
        g.node(node("pow", "Pow", &["x", "e"], &["y"]));
        g.output(float_value("y", &[4]));
        assert!(planned(&g.into_model(17)).is_empty(), "unknown base type");
    }

    fn rewritten(model: &ModelProto) -> Vec<(String, Vec<String>, Vec<String>)> {
        let mut g = tract_onnx::pb::ModelProto::decode(model.encode_to_vec().as_slice())
            .unwrap()
            .graph
            .unwrap();
        rewrite_pows(&mut g, &plan_pow_rewrite(model));
        g.node
            .into_iter()
            .map(|n| (format!("{}:{}", n.name, n.op_type), n.input, n.output))
            .collect()
    }

    #[test]
    fn the_rewrite_keeps_the_name_and_output_and_squares_once() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cube = pow_model(DataType::Float, initializer(tensor_f32("e", &[], &[3.0])));
        assert_eq!(
            rewritten(&cube),
            [
                (
                    "pow.attnrt_pow_square:Mul".to_string(),
                    s(&["x", "x"]),
                    s(&["y.attnrt_pow_square"])
                ),
                (
                    "pow:Mul".to_string(),
                    s(&["y.attnrt_pow_square", "x"]),
                    s(&["y"])
                ),
            ]
        );
        let fourth = pow_model(DataType::Float, initializer(tensor_f32("e", &[], &[4.0])));
        let nodes = rewritten(&fourth);
        assert_eq!(
            nodes[1].1,
            s(&["y.attnrt_pow_square", "y.attnrt_pow_square"])
        );
        let square = pow_model(DataType::Float, initializer(tensor_f32("e", &[], &[2.0])));
        assert_eq!(
            rewritten(&square),
            [("pow:Mul".to_string(), s(&["x", "x"]), s(&["y"]))]
        );
    }
}
