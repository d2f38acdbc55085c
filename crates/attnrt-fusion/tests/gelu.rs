//! GELU in its exported forms becomes one ONNX `Gelu` (the tanh form `approximate="tanh"`, the
//! erf form `"none"`), whatever order the final product is written in; a wrong constant, an
//! intermediate read outside, or `gelu: false` leave it alone, and a candidate that fails is a
//! near miss of rule `gelu` naming the check. (Fused = unfused numerically:
//! `tests/tests/gelu.rs` in the workspace.)

use attnrt_fusion::{fuse, Check, Fused, FusionOptions};
use attnrt_onnx::attr;
use attnrt_testkit::gelu::{gelu_model, GeluForm, Product};

const TANH: GeluForm = GeluForm::Tanh { cubic: 0.044715 };
const PRODUCTS: [Product; 3] = [Product::HalfFirst, Product::HalfLast, Product::HalfInside];

fn fused(form: GeluForm, product: Product, leak: bool) -> Fused {
    let m = gelu_model(form, product, leak, 16);
    attnrt_onnx::validate_model(&m).expect("test graph valid");
    let f = fuse(&m, &FusionOptions::default()).expect("fuse");
    attnrt_onnx::validate_model(&f.model).expect("fused graph valid");
    f
}

fn op_types(f: &Fused) -> Vec<String> {
    let g = f.model.graph.as_ref().unwrap();
    g.node.iter().map(|n| n.op_type.clone()).collect()
}

#[test]
fn every_form_and_product_order_becomes_one_gelu() {
    let forms = [
        (TANH, "tanh", "gelu[tanh]"),
        (GeluForm::ErfDiv, "none", "gelu[erf]"),
        (GeluForm::ErfMul, "none", "gelu[erf]"),
    ];
    for (form, approximate, rule) in forms {
        for product in PRODUCTS {
            let what = format!("{form:?} {product:?}");
            let f = fused(form, product, false);
            assert_eq!(op_types(&f), ["Gelu"], "{what}");
            let g = f.model.graph.as_ref().unwrap();
            let n = &g.node[0];
            assert_eq!((n.input[0].as_str(), n.output[0].as_str()), ("x", "y"));
            let a = attr::string(n, "approximate").unwrap();
            assert_eq!(a.as_deref(), Some(approximate), "{what}");
            assert!(g.initializer.is_empty(), "{what}: constants left");
            let r = &f.report;
            assert_eq!(r.activations.len(), 1, "{what}");
            assert_eq!(r.activations[0].rule, rule);
            assert_eq!((r.opset_before, r.opset_after), (17, 20), "{what}");
        }
    }
}

#[test]
fn a_wrong_cubic_coefficient_is_a_near_miss() {
    let f = fused(GeluForm::Tanh { cubic: 0.05 }, Product::HalfFirst, false);
    assert!(f.report.activations.is_empty());
    assert!(op_types(&f).contains(&"Pow".to_string()), "left alone");
    let m = &f.report.near_misses[0];
    assert_eq!(m.rule, "gelu");
    assert_eq!(m.check, Check::Variant);
    assert!(m.reason.contains("no cubic term"), "{}", m.reason);
}

#[test]
fn an_intermediate_read_outside_stops_the_fusion() {
    for form in [TANH, GeluForm::ErfDiv] {
        let f = fused(form, Product::HalfFirst, true);
        assert!(f.report.activations.is_empty(), "{form:?}");
        let m = &f.report.near_misses[0];
        assert_eq!(m.check, Check::Exclusive, "{form:?}");
        assert!(m.reason.contains("'t' is a graph output"), "{}", m.reason);
    }
}

#[test]
fn gelu_false_leaves_the_model_unchanged() {
    let m = gelu_model(TANH, Product::HalfFirst, false, 16);
    let options = FusionOptions {
        gelu: false,
        ..Default::default()
    };
    let f = fuse(&m, &options).unwrap();
    assert!(!f.report.changed());
    assert_eq!(f.model, m);
}
