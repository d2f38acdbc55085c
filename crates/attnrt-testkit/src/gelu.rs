//! GELU as exporters write it, on one input `x: float[B, L, 16]` to the output `y`: the shared
//! fixture of the fusion crate's GELU tests and the workspace's numeric ones.
//!
//! ```text
//! tanh: t = Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), √(2/π)))
//! erf:  t = Erf(Div(x, √2))   or   Erf(Mul(x, 1/√2))
//! y = x · 0.5 · (1 + t), the product in the order [`Product`] says
//! ```

use attnrt_onnx::{DataType, ModelProto};

use crate::{node_with_attrs, tensor_f32, value_info, Dim, GraphBuilder};

/// Which form, and how its inside is written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GeluForm {
    /// GPT-2's NewGELU; `cubic` is the coefficient written (0.044715 is the true one).
    Tanh {
        /// The coefficient of `x³`.
        cubic: f32,
    },
    /// BERT's `x / √2` inside the erf.
    ErfDiv,
    /// `x · (1/√2)` inside the erf.
    ErfMul,
}

/// How `x · 0.5 · (1 + t)` is split into two Muls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// `Mul(Mul(x, 0.5), 1 + t)` (HF's NewGELU).
    HalfFirst,
    /// `Mul(Mul(x, 1 + t), 0.5)` (HF's GELUActivation in TorchScript exports).
    HalfLast,
    /// `Mul(x, Mul(1 + t, 0.5))`.
    HalfInside,
}

/// The GELU of `form` over `x: float[B, L, width]` with its product written as `product`;
/// `leak` also makes the `Tanh`/`Erf` output a graph output `t` (an intermediate read outside).
/// Opset 17.
pub fn gelu_model(form: GeluForm, product: Product, leak: bool, width: i64) -> ModelProto {
    let mut g = GraphBuilder::new("gelu");
    let shape = [Dim::Sym("B"), Dim::Sym("L"), Dim::Fixed(width)];
    g.input(value_info("x", DataType::Float, &shape));
    let t = match form {
        GeluForm::Tanh { cubic } => {
            let (three, k, s) = (
                c(&mut g, "three", 3.0),
                c(&mut g, "cubic", cubic),
                c(&mut g, "sqrt_2_over_pi", 0.797_884_6),
            );
            op(&mut g, "Pow", &["x", &three], "x3");
            op(&mut g, "Mul", &["x3", &k], "kx3");
            op(&mut g, "Add", &["x", "kx3"], "inner");
            op(&mut g, "Mul", &["inner", &s], "scaled");
            op(&mut g, "Tanh", &["scaled"], "t")
        }
        GeluForm::ErfDiv => {
            let r2 = c(&mut g, "sqrt2", std::f32::consts::SQRT_2);
            op(&mut g, "Div", &["x", &r2], "scaled");
            op(&mut g, "Erf", &["scaled"], "t")
        }
        GeluForm::ErfMul => {
            let r = c(&mut g, "inv_sqrt2", std::f32::consts::FRAC_1_SQRT_2);
            op(&mut g, "Mul", &["x", &r], "scaled");
            op(&mut g, "Erf", &["scaled"], "t")
        }
    };
    let (one, half) = (c(&mut g, "one", 1.0), c(&mut g, "half", 0.5));
    op(&mut g, "Add", &[&t, &one], "one_plus");
    match product {
        Product::HalfFirst => {
            op(&mut g, "Mul", &["x", &half], "half_x");
            op(&mut g, "Mul", &["half_x", "one_plus"], "y");
        }
        Product::HalfLast => {
            op(&mut g, "Mul", &["x", "one_plus"], "x_one_plus");
            op(&mut g, "Mul", &["x_one_plus", &half], "y");
        }
        Product::HalfInside => {
            op(&mut g, "Mul", &["one_plus", &half], "half_one_plus");
            op(&mut g, "Mul", &["x", "half_one_plus"], "y");
        }
    }
    g.output(value_info("y", DataType::Float, &shape));
    if leak {
        g.output(value_info("t", DataType::Float, &shape));
    }
    g.into_model(17)
}

fn c(g: &mut GraphBuilder, name: &str, v: f32) -> String {
    g.initializer(tensor_f32(name, &[], &[v]))
}

fn op(g: &mut GraphBuilder, op: &str, ins: &[&str], out: &str) -> String {
    g.node(node_with_attrs(
        &format!("{op}_{out}"),
        op,
        ins,
        &[out],
        vec![],
    ))
}
