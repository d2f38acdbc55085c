//! Comparing two sets of outputs: per output name, shape and dtype agreement, max absolute and
//! relative error, NaN agreement, and a verdict under `|a − b| ≤ atol + rtol·|b|`.

use serde::Serialize;
use tract_onnx::prelude::Tensor;

use crate::io::{dtype_name, NamedTensor};

/// Elementwise tolerance: `a` is close to the reference `b` when `|a − b| ≤ atol + rtol·|b|`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part (times the reference's magnitude).
    pub rtol: f64,
}

impl Default for Tolerance {
    /// 1e-4 absolute and relative: f32 attention reassociates sums (online softmax, blocked
    /// dot products), which moves results by a few ulps of the largest intermediate values.
    fn default() -> Self {
        Tolerance {
            atol: 1e-4,
            rtol: 1e-4,
        }
    }
}

/// The comparison of one output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputDiff {
    /// Output name.
    pub name: String,
    /// Shape of the output under test.
    pub shape: Vec<usize>,
    /// Shape of the reference.
    pub reference_shape: Vec<usize>,
    /// dtype of the output under test.
    pub dtype: String,
    /// dtype of the reference.
    pub reference_dtype: String,
    /// Largest `|a − b|` over elements where neither is NaN (0 when nothing was compared).
    pub max_abs: f64,
    /// Largest `|a − b| / |b|` over elements with `b ≠ 0` and neither NaN.
    pub max_rel: f64,
    /// Elements where exactly one side is NaN.
    pub nan_mismatches: usize,
    /// Elements outside the tolerance (NaN mismatches included).
    pub mismatches: usize,
    /// Whether the output passes: same shape, comparable dtypes, every element within tolerance.
    pub ok: bool,
    /// Why it fails, when it does for a reason other than values (shape, dtype, missing).
    pub problem: Option<String>,
}

fn as_f64(t: &Tensor) -> Option<Vec<f64>> {
    let c = t.cast_to::<f64>().ok()?;
    Some(c.try_as_plain_ram().ok()?.as_slice::<f64>().ok()?.to_vec())
}

/// Compares `actual` with `reference` element by element.
pub fn diff_tensor(name: &str, actual: &Tensor, reference: &Tensor, tol: Tolerance) -> OutputDiff {
    let mut d = OutputDiff {
        name: name.to_string(),
        shape: actual.shape().to_vec(),
        reference_shape: reference.shape().to_vec(),
        dtype: dtype_name(actual.datum_type()).to_string(),
        reference_dtype: dtype_name(reference.datum_type()).to_string(),
        max_abs: 0.0,
        max_rel: 0.0,
        nan_mismatches: 0,
        mismatches: 0,
        ok: false,
        problem: None,
    };
    if actual.shape() != reference.shape() {
        d.problem = Some(format!(
            "shape {:?} differs from the reference {:?}",
            d.shape, d.reference_shape
        ));
        return d;
    }
    if d.dtype != d.reference_dtype {
        d.problem = Some(format!(
            "dtype {} differs from the reference {}",
            d.dtype, d.reference_dtype
        ));
        return d;
    }
    let (Some(a), Some(b)) = (as_f64(actual), as_f64(reference)) else {
        d.problem = Some(format!("values of type {} cannot be compared", d.dtype));
        return d;
    };
    for (&x, &y) in a.iter().zip(&b) {
        match (x.is_nan(), y.is_nan()) {
            (true, true) => continue,
            (true, false) | (false, true) => {
                d.nan_mismatches += 1;
                d.mismatches += 1;
                continue;
            }
            _ => {}
        }
        // Equal infinities are equal; `inf - inf` would be NaN.
        let err = if x == y { 0.0 } else { (x - y).abs() };
        d.max_abs = d.max_abs.max(err);
        if y != 0.0 {
            d.max_rel = d.max_rel.max(err / y.abs());
        }
        // Negated on purpose: a NaN error (NaN on one side only) must count as a mismatch.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let outside = !(err <= tol.atol + tol.rtol * y.abs());
        if outside {
            d.mismatches += 1;
        }
    }
    d.ok = d.mismatches == 0;
    d
}

/// Compares every reference output with the output of the same name; a reference output
/// missing from `actual` fails. Outputs of `actual` without a reference are not compared.
pub fn diff_outputs(
    actual: &[NamedTensor],
    reference: &[NamedTensor],
    tol: Tolerance,
) -> Vec<OutputDiff> {
    reference
        .iter()
        .map(|r| match actual.iter().find(|a| a.name == r.name) {
            Some(a) => diff_tensor(&r.name, &a.tensor, &r.tensor, tol),
            None => OutputDiff {
                name: r.name.clone(),
                shape: vec![],
                reference_shape: r.tensor.shape().to_vec(),
                dtype: String::new(),
                reference_dtype: dtype_name(r.tensor.datum_type()).to_string(),
                max_abs: f64::NAN,
                max_rel: f64::NAN,
                nan_mismatches: 0,
                mismatches: 0,
                ok: false,
                problem: Some("no output of this name".to_string()),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from(ArrayD::from_shape_vec(vec![v.len()], v.to_vec()).unwrap())
    }

    #[test]
    fn tolerance_and_errors() {
        let tol = Tolerance {
            atol: 1e-3,
            rtol: 0.0,
        };
        let d = diff_tensor("y", &t(&[1.0, 2.0005]), &t(&[1.0, 2.0]), tol);
        assert!(d.ok);
        assert!((d.max_abs - 5e-4).abs() < 1e-6);
        let d = diff_tensor("y", &t(&[1.0, 2.01]), &t(&[1.0, 2.0]), tol);
        assert!(!d.ok);
        assert_eq!(d.mismatches, 1);
        let rel = Tolerance {
            atol: 0.0,
            rtol: 0.01,
        };
        assert!(diff_tensor("y", &t(&[100.5]), &t(&[100.0]), rel).ok);
        assert!(!diff_tensor("y", &t(&[0.5]), &t(&[0.0]), rel).ok);
    }

    #[test]
    fn nans_shapes_and_missing() {
        let tol = Tolerance::default();
        assert!(diff_tensor("y", &t(&[f32::NAN]), &t(&[f32::NAN]), tol).ok);
        let d = diff_tensor("y", &t(&[f32::NAN, 1.0]), &t(&[0.0, 1.0]), tol);
        assert!(!d.ok);
        assert_eq!(d.nan_mismatches, 1);
        assert!(diff_tensor("y", &t(&[f32::INFINITY]), &t(&[f32::INFINITY]), tol).ok);
        let d = diff_tensor("y", &t(&[1.0, 2.0]), &t(&[1.0]), tol);
        assert!(!d.ok && d.problem.unwrap().contains("shape"));
        let r = vec![NamedTensor {
            name: "z".into(),
            tensor: t(&[1.0]),
        }];
        let d = diff_outputs(&[], &r, tol);
        assert!(!d[0].ok);
    }
}
