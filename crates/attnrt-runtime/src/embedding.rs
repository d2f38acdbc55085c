//! Embedding lookups read in place: a `Gather` of whole rows (axis 0) from a large initializer
//! that nothing else reads (the token embeddings of LLaMA, BERT's word and position embeddings,
//! GPT-2's `wte`/`wpe`) copies the rows it is asked for straight from the model's bytes, which
//! are never copied into a tract constant (`weights.rs` decides this when it places the weights).
//!
//! The bytes are a slice of the mapped model file or of its mapped external data
//! (`attnrt_onnx::mapped`): only the pages of the rows a run gathers become resident, paged in
//! from the file on first use (and dropped by the system under memory pressure, since they are
//! clean file pages). A 32,000-token table of 2,048 floats is 262 MB on disk; a 16-token prompt
//! makes 16 rows (about 16 pages) of it resident. Bytes that are on the heap (models made in
//! memory, files small enough to be read) are shared, not copied, all the same.
//!
//! The lookup checks every index as [`crate::gather`] does (`[-n, n)` for a table of `n` rows,
//! an error naming the node otherwise), and reports itself under the same op name, so plans
//! and profiles read as before.

use bytes::Bytes;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::cast::cast;
use tract_onnx::tract_hir::internal::*;

use crate::gather::check_indices;

/// A table of rows left in the model's bytes: `shape[0]` rows of `shape[1..]` values of `dt`,
/// little-endian (ONNX's `raw_data`; the caller only makes one on a little-endian target).
#[derive(Clone)]
pub(crate) struct EmbeddingTable {
    data: Bytes,
    dt: DatumType,
    shape: Vec<usize>,
}

impl EmbeddingTable {
    /// The table of `shape` and `dt` held in `data`; `None` unless `data` holds exactly those
    /// values and `dt` is a plain number type (the rows are copied as bytes).
    pub(crate) fn new(data: Bytes, dt: DatumType, shape: Vec<usize>) -> Option<Self> {
        let volume = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        let fits = !shape.is_empty()
            && (dt.is_integer() || dt.is_float())
            && !dt.is_quantized()
            && volume.checked_mul(dt.size_of()) == Some(data.len());
        fits.then_some(EmbeddingTable { data, dt, shape })
    }

    /// The bytes of one row.
    fn row_bytes(&self) -> usize {
        self.shape[1..].iter().product::<usize>() * self.dt.size_of()
    }
}

// Compared by identity (the same bytes read the same way), never by content: a graph library
// may compare ops, and the content is hundreds of megabytes that are not resident.
impl PartialEq for EmbeddingTable {
    fn eq(&self, other: &Self) -> bool {
        self.data.as_ptr() == other.data.as_ptr()
            && self.data.len() == other.data.len()
            && self.dt == other.dt
            && self.shape == other.shape
    }
}

impl Eq for EmbeddingTable {}

impl std::fmt::Debug for EmbeddingTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EmbeddingTable({:?} {:?}, in place)",
            self.dt, self.shape
        )
    }
}

/// A row `Gather` as parsed, its data input replaced by the table it reads in place: its only
/// input is the indices.
#[derive(Debug, Clone)]
pub(crate) struct EmbeddingLookup {
    /// The ONNX node name, for errors.
    pub(crate) node: String,
    pub(crate) table: EmbeddingTable,
}

impl Expansion for EmbeddingLookup {
    fn name(&self) -> StaticName {
        "AttnrtEmbeddingLookup".into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        check_input_arity(inputs, 1)?;
        check_output_arity(outputs, 1)?;
        s.equals(&outputs[0].datum_type, self.table.dt)?;
        let rows = &self.table.shape[1..];
        s.equals(&outputs[0].rank, inputs[0].rank.bex() + rows.len() as i64)?;
        s.given(&inputs[0].rank, move |s, rank| {
            let rank = rank as usize;
            for axis in 0..rank {
                s.equals(&inputs[0].shape[axis], &outputs[0].shape[axis])?;
            }
            for (axis, &d) in rows.iter().enumerate() {
                s.equals(&outputs[0].shape[rank + axis], d.to_dim())?;
            }
            Ok(())
        })
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let indices = model.wire_node(
            format!("{prefix}.cast_to_i64"),
            cast(i64::datum_type()),
            &inputs[..1],
        )?;
        let op = EmbeddingGather {
            node: self.node.clone(),
            table: self.table.clone(),
        };
        model.wire_node(prefix, op, &indices)
    }
}

/// The lookup as it runs: int64 indices in, the rows they name out (`indices.shape ++
/// table.shape[1..]`), each copied once from the table's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EmbeddingGather {
    node: String,
    table: EmbeddingTable,
}

impl Op for EmbeddingGather {
    fn name(&self) -> StaticName {
        crate::gather::OP_NAME.into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "node {}: rows of {:?} read in place",
            self.node, self.table.shape
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for EmbeddingGather {
    // With constant indices (positions of a fixed length) tract folds the rows into a constant.
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let indices = &inputs[0];
        let rows = self.table.shape[0];
        check_indices("Gather", &self.node, 0, indices, rows)?;
        let mut shape: TVec<usize> = indices.shape().into();
        shape.extend_from_slice(&self.table.shape[1..]);
        // Safety: every byte of the output is written below (one row per index).
        let mut out = unsafe { Tensor::uninitialized_dt(self.table.dt, &shape)? };
        let row = self.table.row_bytes();
        if row > 0 {
            let indices = indices.try_as_plain_ram()?;
            let dst = out.as_bytes_mut().chunks_exact_mut(row);
            for (dst, &i) in dst.zip(indices.as_slice::<i64>()?) {
                // In `[-rows, rows)`, checked above.
                let i = if i < 0 { i + rows as i64 } else { i } as usize;
                dst.copy_from_slice(&self.table.data[i * row..][..row]);
            }
        }
        Ok(tvec!(out.into_tvalue()))
    }
}

impl TypedOp for EmbeddingGather {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut shape: TVec<TDim> = inputs[0].shape.iter().cloned().collect();
        shape.extend(self.table.shape[1..].iter().map(|&d| d.to_dim()));
        Ok(tvec!(self.table.dt.fact(shape)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> EmbeddingTable {
        let values: Vec<u8> = (0..6u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
        EmbeddingTable::new(Bytes::from(values), DatumType::F32, vec![3, 2]).unwrap()
    }

    fn gather(indices: &[i64]) -> TractResult<Vec<f32>> {
        let op = EmbeddingGather {
            node: "/embed".into(),
            table: table(),
        };
        let indices = tensor1(indices).into_tvalue();
        let out = op.eval(&EvalContext::out_of_plan(), tvec!(indices))?;
        Ok(out[0].try_as_plain_ram()?.as_slice::<f32>()?.to_vec())
    }

    #[test]
    fn rows_are_copied_from_the_bytes_and_bad_indices_are_errors() {
        assert_eq!(gather(&[2, 0, -1]).unwrap(), [4.0, 5.0, 0.0, 1.0, 4.0, 5.0]);
        assert_eq!(gather(&[]).unwrap(), Vec::<f32>::new());
        for bad in [3, -4, i64::MAX, i64::MIN] {
            let err = gather(&[0, bad]).unwrap_err().to_string();
            assert!(
                err.contains("node '/embed'") && err.contains(&format!("index {bad} is outside")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_table_must_hold_exactly_its_values() {
        let bytes = Bytes::from(vec![0u8; 24]);
        assert!(EmbeddingTable::new(bytes.clone(), DatumType::F32, vec![3, 2]).is_some());
        assert!(EmbeddingTable::new(bytes.clone(), DatumType::F32, vec![3, 3]).is_none());
        assert!(EmbeddingTable::new(bytes.clone(), DatumType::Bool, vec![24]).is_none());
        assert!(EmbeddingTable::new(bytes, DatumType::F32, vec![]).is_none());
        let huge = vec![usize::MAX, 2];
        assert!(EmbeddingTable::new(Bytes::new(), DatumType::F32, huge).is_none());
    }
}
