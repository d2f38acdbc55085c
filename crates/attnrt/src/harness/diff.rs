//! Comparing two sets of outputs: per output name, shape and dtype agreement, max absolute and
//! relative error, NaN agreement, and a verdict under `|a − b| ≤ atol + rtol·|b|`.

use attnrt_runtime::{dtype_name, DatumType, NamedTensor, Tensor};
use serde::Serialize;

/// Elementwise tolerance: `a` is close to the reference `b` when `|a − b| ≤ atol + rtol·|b|`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part (times the reference's magnitude).
    pub rtol: f64,
}

impl Default for Tolerance {
    /// The float32 default, [`Tolerance::FLOAT32`].
    fn default() -> Self {
        Tolerance::FLOAT32
    }
}

impl Tolerance {
    /// float32 (and the default): 1e-4 absolute and relative. f32 attention reassociates sums
    /// (online softmax, blocked dot products), which moves results by a few ulps of the largest
    /// intermediate values.
    pub const FLOAT32: Tolerance = Tolerance {
        atol: 1e-4,
        rtol: 1e-4,
    };
    /// float16: 2e-3 absolute and relative, about two ulps at 1.0 (ε = 9.8e-4). The fused path
    /// computes in f32 and rounds once; the unfused one rounds after every op.
    pub const FLOAT16: Tolerance = Tolerance {
        atol: 2e-3,
        rtol: 2e-3,
    };
    /// bfloat16: 1.6e-2 absolute and relative, about two ulps at 1.0 (ε = 7.8e-3).
    pub const BFLOAT16: Tolerance = Tolerance {
        atol: 1.6e-2,
        rtol: 1.6e-2,
    };
    /// float64: 1e-6 absolute and relative; both paths compute in double (attnrt's kernel does
    /// not take doubles, so double attention is never fused) and differ only by reassociation.
    pub const FLOAT64: Tolerance = Tolerance {
        atol: 1e-6,
        rtol: 1e-6,
    };
    /// Integers and booleans: exact.
    pub const EXACT: Tolerance = Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };

    /// The default tolerance for outputs of element type `dt`.
    pub fn for_dtype(dt: DatumType) -> Tolerance {
        match dt {
            DatumType::F32 => Tolerance::FLOAT32,
            DatumType::F16 => Tolerance::FLOAT16,
            DatumType::F64 => Tolerance::FLOAT64,
            DatumType::Bool => Tolerance::EXACT,
            dt if dt.is_integer() => Tolerance::EXACT,
            // bf16 has no DatumType of its own in tract; anything else float-like gets the
            // loosest float default.
            _ => Tolerance::BFLOAT16,
        }
    }

    /// The defaults of every float element type, for help text and reports.
    pub fn defaults_table() -> String {
        [
            ("float32", Tolerance::FLOAT32),
            ("float16", Tolerance::FLOAT16),
            ("bfloat16", Tolerance::BFLOAT16),
            ("float64", Tolerance::FLOAT64),
        ]
        .iter()
        .map(|(n, t)| format!("{n} {}/{}", t.atol, t.rtol))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// Which tolerance a comparison uses: one given by the user for every output, or the default
/// of each output's element type ([`Tolerance::for_dtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToleranceChoice {
    /// The default of each reference output's element type.
    #[default]
    ByDtype,
    /// The same tolerance for every output.
    Fixed(Tolerance),
}

impl ToleranceChoice {
    /// The tolerance for a reference output of element type `dt`.
    pub fn for_dtype(self, dt: DatumType) -> Tolerance {
        match self {
            ToleranceChoice::ByDtype => Tolerance::for_dtype(dt),
            ToleranceChoice::Fixed(t) => t,
        }
    }

    /// `--atol/--rtol` as given (either may be absent): both absent = per-dtype defaults; one
    /// absent takes the float32 default for that part.
    pub fn from_flags(atol: Option<f64>, rtol: Option<f64>) -> anyhow::Result<ToleranceChoice> {
        if atol.is_none() && rtol.is_none() {
            return Ok(ToleranceChoice::ByDtype);
        }
        let t = Tolerance {
            atol: atol.unwrap_or(Tolerance::FLOAT32.atol),
            rtol: rtol.unwrap_or(Tolerance::FLOAT32.rtol),
        };
        if !(t.atol >= 0.0 && t.rtol >= 0.0) {
            anyhow::bail!("--atol and --rtol must be non-negative numbers");
        }
        Ok(ToleranceChoice::Fixed(t))
    }
}

impl From<Tolerance> for ToleranceChoice {
    fn from(t: Tolerance) -> Self {
        ToleranceChoice::Fixed(t)
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
    /// The tolerance this output was judged by.
    pub tolerance: Tolerance,
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
        tolerance: tol,
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
/// `tol` is a [`Tolerance`] for every output or a [`ToleranceChoice`] (per-dtype defaults).
pub fn diff_outputs(
    actual: &[NamedTensor],
    reference: &[NamedTensor],
    tol: impl Into<ToleranceChoice>,
) -> Vec<OutputDiff> {
    let choice = tol.into();
    reference
        .iter()
        .map(|r| (r, choice.for_dtype(r.tensor.datum_type())))
        .map(|(r, tol)| match actual.iter().find(|a| a.name == r.name) {
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
                tolerance: tol,
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

    #[test]
    fn default_tolerances_follow_the_dtype() {
        let half = |v: &[f32]| t(v).cast_to_dt(DatumType::F16).unwrap().into_owned();
        let a = [NamedTensor {
            name: "y".into(),
            tensor: half(&[1.0, 2.0]),
        }];
        // One f16 ulp at 2.0 (0.00195): within the float16 default, far outside float32's.
        let b = [NamedTensor {
            name: "y".into(),
            tensor: half(&[1.0, 2.00195]),
        }];
        let by_dtype = diff_outputs(&a, &b, ToleranceChoice::ByDtype);
        assert!(by_dtype[0].ok, "{by_dtype:?}");
        assert_eq!(by_dtype[0].tolerance, Tolerance::FLOAT16);
        let fixed = diff_outputs(&a, &b, Tolerance::FLOAT32);
        assert!(!fixed[0].ok);
        assert_eq!(Tolerance::for_dtype(DatumType::F32), Tolerance::FLOAT32);
        assert_eq!(Tolerance::for_dtype(DatumType::F64), Tolerance::FLOAT64);
        assert_eq!(Tolerance::for_dtype(DatumType::I64), Tolerance::EXACT);
        assert_eq!(Tolerance::for_dtype(DatumType::Bool), Tolerance::EXACT);
    }

    #[test]
    fn flags_choose_a_fixed_tolerance() {
        assert_eq!(
            ToleranceChoice::from_flags(None, None).unwrap(),
            ToleranceChoice::ByDtype
        );
        let one = ToleranceChoice::from_flags(Some(0.5), None).unwrap();
        assert_eq!(one.for_dtype(DatumType::F16).atol, 0.5);
        assert_eq!(one.for_dtype(DatumType::F16).rtol, Tolerance::FLOAT32.rtol);
        assert!(ToleranceChoice::from_flags(Some(-1.0), None).is_err());
        assert!(ToleranceChoice::from_flags(None, Some(f64::NAN)).is_err());
    }
}
