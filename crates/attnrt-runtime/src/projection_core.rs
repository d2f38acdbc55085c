//! What every projection op shares: `x: [..., K]` by a constant weight `W: [K, N]` into
//! `y: [..., N]`, row-major, so that the op's kernel sees `m` rows of `K` (the product of `x`'s
//! leading extents) and writes `m` rows of `N`. Here are the inference rules of such a node
//! ([`rules`]), the typed output fact ([`output_facts`]) and the eval wrapper that checks the
//! input and makes the rows and the output's shape ([`eval`]); each op keeps what differs, as
//! its [`RowProjection`]: the float panels of `projection.rs` (and `packed.rs`, typed as it),
//! the int8 weights and scales of `quant_projection.rs`, the zero points of `matmul_integer.rs`.

use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

/// A projection op as the shared code sees it.
pub(crate) trait RowProjection {
    /// How errors name the op's node (`node 'fc1'`, `MatMulInteger node 'fc1'`).
    fn context(&self) -> String;
    /// `K` and `N`, the weight's extents.
    fn dims(&self) -> (usize, usize);
    /// The element types the input `x` may have.
    fn input_types(&self) -> TVec<DatumType>;
    /// The output's element type.
    fn output_type(&self) -> DatumType;
    /// The output, `shape` (`[..., N]`), of `inputs` (`x`, checked `[..., K]` of an element type
    /// of [`RowProjection::input_types`], then the op's other inputs) read as `m` rows.
    fn project(&self, inputs: &[TValue], m: usize, shape: &[usize]) -> TractResult<Tensor>;
}

/// The shapes of a projection of `a: [..., k]` into `y: [..., n]`: the same rank, the same
/// leading extents.
pub(crate) fn rules<'r, 'p: 'r, K, N>(
    s: &mut Solver<'r>,
    a: &'p TensorProxy,
    y: &'p TensorProxy,
    k: K,
    n: N,
) -> InferenceResult
where
    K: IntoExp<DimFact> + Clone + 'r,
    N: IntoExp<DimFact> + Clone + 'r,
{
    s.equals(&y.rank, &a.rank)?;
    s.given(&a.rank, move |s, rank| {
        let Some(last) = usize::try_from(rank).ok().and_then(|r| r.checked_sub(1)) else {
            bail!("a projection of a scalar by a weight");
        };
        for axis in 0..last {
            s.equals(&y.shape[axis], &a.shape[axis])?;
        }
        s.equals(&a.shape[last], k.clone())?;
        s.equals(&y.shape[last], n.clone())
    })
}

/// The typed output of `op` for its input facts: `[..., N]` of its output type, for an input
/// `[..., K]` of one of its input types.
pub(crate) fn output_facts(
    op: &impl RowProjection,
    inputs: &[&TypedFact],
) -> TractResult<TVec<TypedFact>> {
    let a = inputs[0];
    let mut shape: TVec<TDim> = a.shape.iter().cloned().collect();
    let (k, n) = op.dims();
    match shape.last_mut() {
        Some(last) if op.input_types().contains(&a.datum_type) => *last = n.into(),
        _ => bail!(
            "{}: A is {:?} {:?}, needs {} [..., {k}]",
            op.context(),
            a.datum_type,
            a.shape,
            types(&op.input_types())
        ),
    }
    Ok(tvec!(TypedFact::dt_shape(op.output_type(), shape)))
}

/// Runs `op` on `inputs`: checks `x` (input 0) is `[..., K]` of one of its input types, and
/// projects its rows into the output `[..., N]`; errors name the node.
pub(crate) fn eval(op: &impl RowProjection, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
    let x = &inputs[0];
    let (k, n) = op.dims();
    let shape = x.shape();
    let Some((_, rows)) = shape
        .split_last()
        .filter(|(&last, _)| last == k && op.input_types().contains(&x.datum_type()))
    else {
        bail!(
            "{}: A is {:?} {shape:?}, needs {} [..., {k}]",
            op.context(),
            x.datum_type(),
            types(&op.input_types())
        );
    };
    let mut out: TVec<usize> = shape.into();
    *out.last_mut().expect("the input has a last axis") = n;
    let y = op
        .project(&inputs, rows.iter().product(), &out)
        .with_context(|| op.context())?;
    Ok(tvec!(y.into_tvalue()))
}

/// `F32`, `I8 or U8`: the element types an input may have, for errors.
fn types(dts: &[DatumType]) -> String {
    let names: Vec<String> = dts.iter().map(|dt| format!("{dt:?}")).collect();
    names.join(" or ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A projection `[..., 3]` → `[..., 2]` of f32 whose output holds the rows it was given.
    struct Rows;

    impl RowProjection for Rows {
        fn context(&self) -> String {
            "node 'fc'".into()
        }

        fn dims(&self) -> (usize, usize) {
            (3, 2)
        }

        fn input_types(&self) -> TVec<DatumType> {
            tvec!(DatumType::F32)
        }

        fn output_type(&self) -> DatumType {
            DatumType::I64
        }

        fn project(&self, _: &[TValue], m: usize, shape: &[usize]) -> TractResult<Tensor> {
            let n: usize = shape.iter().product();
            Tensor::from_shape(shape, &vec![m as i64; n])
        }
    }

    fn x(shape: &[usize]) -> TVec<TValue> {
        let n = shape.iter().product();
        tvec!(Tensor::from_shape(shape, &vec![0f32; n])
            .unwrap()
            .into_tvalue())
    }

    #[test]
    fn the_leading_axes_are_rows_and_the_last_becomes_n() {
        let y = eval(&Rows, x(&[2, 5, 3])).unwrap();
        assert_eq!(y[0].shape(), [2, 5, 2]);
        assert_eq!(
            y[0].try_as_plain_ram().unwrap().as_slice::<i64>().unwrap()[0],
            10
        );
        let fact = f32::fact([TDim::from(4), TDim::from(3)]);
        let facts = output_facts(&Rows, &[&fact]).unwrap();
        assert_eq!(facts[0], i64::fact([4, 2]));
    }

    #[test]
    fn an_input_of_another_extent_or_type_or_a_scalar_is_an_error_naming_the_node() {
        let err = eval(&Rows, x(&[2, 4])).unwrap_err().to_string();
        assert_eq!(err, "node 'fc': A is F32 [2, 4], needs F32 [..., 3]");
        let ints = tvec!(Tensor::from_shape(&[1, 3], &[1i64, 2, 3])
            .unwrap()
            .into_tvalue());
        let err = eval(&Rows, ints).unwrap_err().to_string();
        assert!(err.contains("A is I64 [1, 3], needs F32"), "{err}");
        let scalar = f32::fact([0usize; 0]);
        let err = output_facts(&Rows, &[&scalar]).unwrap_err().to_string();
        assert!(err.starts_with("node 'fc': A is F32"), "{err}");
    }
}
