//! `Pow` by a constant 2, 3 or 4 runs as multiplications (crates/attnrt-runtime/src/lower/
//! pow.rs): the outputs stay within two roundings of tract's `powf`, special values included,
//! and what runs is no longer tract's `PowConst`.

use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{pow_model, seeded_values};

fn session(exponent: f32, pow_as_mul: bool) -> Session {
    let options = SessionOptions {
        pow_as_mul,
        ..SessionOptions::default()
    };
    let threads = Threads::new(Some(1)).unwrap();
    Session::new(&pow_model(&[2, 64], exponent), &threads, "pow", &options).unwrap()
}

/// Seeded values in [-3, 3], then the special ones.
fn x() -> NamedTensor {
    let mut v: Vec<f32> = seeded_values(128, 7).iter().map(|v| v * 3.0).collect();
    let special = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-20,
        -3e12,
        f32::MAX,
    ];
    v[..special.len()].copy_from_slice(&special);
    NamedTensor {
        name: "x".into(),
        tensor: Tensor::from_shape(&[2, 64], &v).unwrap(),
    }
}

fn values(s: &Session) -> Vec<f32> {
    let out = s.run(&[x()]).unwrap();
    out[0]
        .tensor
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .copied()
        .collect()
}

#[test]
fn small_integer_powers_match_powf_within_two_roundings() {
    for exponent in [2.0, 3.0, 4.0] {
        let (lowered, reference) = (session(exponent, true), session(exponent, false));
        let (got, want) = (values(&lowered), values(&reference));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let same_special = (g.is_nan() && w.is_nan()) || (!w.is_finite() && g == w);
            let close = (g - w).abs() <= 3.0 * f32::EPSILON * w.abs();
            let sign = g.is_sign_negative() == w.is_sign_negative();
            assert!(
                same_special || (close && sign),
                "x^{exponent} at {i}: {g} vs powf {w}"
            );
        }
        let ops = lowered.op_names();
        assert!(
            !ops.iter().any(|o| o.contains("Pow")),
            "x^{exponent} lowered runs {ops:?}"
        );
        let ops = reference.op_names();
        assert!(
            ops.iter().any(|o| o.contains("Pow") || o == "Square"),
            "x^{exponent} unlowered runs {ops:?}"
        );
    }
}

#[test]
fn a_profile_counts_the_multiplications_as_pow() {
    let s = session(3.0, true);
    let (out, profile) = s.run_profiled(&[x()]).unwrap();
    assert_eq!(out[0].name, "y");
    let kinds: Vec<String> = profile.by_op().into_iter().map(|k| k.op).collect();
    assert_eq!(kinds, ["Pow"], "nodes: {:?}", profile.nodes());
    assert_eq!(profile.nodes().len(), 2, "square and product");
}
