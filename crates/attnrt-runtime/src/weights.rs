//! Where a session's weights live: each large initializer is handed to tract or to its kernel
//! once, from the model's own bytes, and never copied through an encoded model.
//!
//! The graph tract parses has no data for the large initializers ([`hold_large`] takes it out
//! before the model is re-encoded for tract, [`declare`] declares them as inputs instead). After
//! parsing, [`place`] gives each one its home:
//!
//! - a float32 matrix read only as the weight `B` of projections (attnrt's constant-weight
//!   `MatMul`s, and `Gemm`s without `transA`, all reading it the same way round) is packed for
//!   the projection kernel at once, and those nodes become `PackedProjection` / `PackedGemm`
//!   (`packed.rs`): the packed panels are the weight's only copy in the session, shared by
//!   every plan;
//! - a table read only by `Gather`s of whole rows (an embedding table) stays where it is: the
//!   lookups copy the rows they need from the model's bytes (`embedding.rs`), so only those
//!   rows' pages of the mapped file become resident;
//! - any other becomes a tract constant, built from the bytes, shared by every plan.
//!
//! The bytes come from the model: slices of the mapped model file or of its mapped external
//! data (`attnrt_onnx::mapped`; initializers inline in the `.onnx` and external ones alike),
//! whose pages are given back once copied here, so resident memory holds each weight once.
//! Sessions built from the same mapped bytes (the fused and unfused sessions of `attnrt run`)
//! share the packed weights and constants too ([`Shared`]), and read the same embedding bytes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};

use attnrt_kernels::projection::PackedWeight;
use attnrt_onnx::proto::tensor_proto::DataLocation;
use attnrt_onnx::{DataType, ModelProto};
use bytes::Bytes;
use rayon::prelude::*;
use tract_onnx::pb;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;
use tract_onnx::tract_hir::ops::expandable::expand;
use tract_onnx::tract_hir::ops::konst::Const;

use crate::embedding::{EmbeddingLookup, EmbeddingTable};
use crate::gather;
use crate::packed::{PackedGemm, PackedProjection};
use crate::projection::{ProjectionGemm, ProjectionMatMul};

/// Initializers with at least this many bytes of data are held out of tract's graph.
pub(crate) const HOLD_AT_LEAST: usize = 4 << 10;

/// A large initializer of the main graph, its data held apart from tract's graph.
pub(crate) struct HeldWeight {
    name: String,
    data_type: i32,
    dims: Vec<i64>,
    data: Bytes,
}

/// Takes the data of `model`'s large main-graph initializers out of it (a shared `Bytes`, not a
/// copy): those of a type tract reads from raw bytes, stored in `raw_data`, and not also
/// declared as graph inputs (which a caller may feed instead).
pub(crate) fn hold_large(model: &mut ModelProto) -> Vec<HeldWeight> {
    let Some(g) = model.graph.as_mut() else {
        return Vec::new();
    };
    let inputs: HashSet<String> = g.input.iter().map(|i| i.name.clone()).collect();
    let mut held = Vec::new();
    for t in &mut g.initializer {
        // Half-precision weights stay: the rewrite `half-as-float` (lower/half.rs) widens them
        // in tract's graph.
        let holdable = t.raw_data.len() >= HOLD_AT_LEAST
            && t.data_location != DataLocation::External as i32
            && datum_type(t.data_type).is_some_and(|dt| dt != DatumType::F16)
            && !inputs.contains(&t.name);
        if holdable {
            held.push(HeldWeight {
                name: t.name.clone(),
                data_type: t.data_type,
                dims: t.dims.clone(),
                data: std::mem::take(&mut t.raw_data),
            });
        }
    }
    let names: HashSet<&str> = held.iter().map(|w| w.name.as_str()).collect();
    g.initializer.retain(|t| !names.contains(t.name.as_str()));
    held
}

/// Declares every held weight as an input of tract's graph (with its type and shape), so that
/// its consumers parse as they would with the initializer there.
pub(crate) fn declare(g: &mut pb::GraphProto, held: &[HeldWeight]) {
    use pb::tensor_shape_proto::{dimension, Dimension};
    for w in held {
        let dim = w
            .dims
            .iter()
            .map(|&d| Dimension {
                value: Some(dimension::Value::DimValue(d)),
                ..Default::default()
            })
            .collect();
        let tensor = pb::type_proto::Tensor {
            elem_type: w.data_type,
            shape: Some(pb::TensorShapeProto { dim }),
        };
        g.input.push(pb::ValueInfoProto {
            name: w.name.clone(),
            r#type: Some(pb::TypeProto {
                value: Some(pb::type_proto::Value::TensorType(tensor)),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
}

/// tract's element type of an ONNX type whose raw bytes tract reads as they are (booleans are
/// one byte each on disk but not in tract).
fn datum_type(data_type: i32) -> Option<DatumType> {
    crate::tensor::onnx_to_datum(data_type).filter(|dt| *dt != DatumType::Bool)
}

/// What a held weight becomes in the session.
enum Home {
    /// Packed for the projection kernel; these nodes read it.
    Packed(Arc<PackedWeight>, Vec<(usize, Reader)>),
    /// Left in the model's bytes; these row `Gather`s (node id, ONNX name) read it in place.
    Table(EmbeddingTable, Vec<(usize, String)>),
    /// A tract constant.
    Const(Arc<Tensor>),
}

/// How the nodes of the parsed graph read a held weight.
enum Readers {
    /// Only attnrt's projections, as their `B`, all the same way round.
    Projections(Vec<(usize, Reader)>),
    /// Only `Gather`s of whole rows, as their data.
    Rows(Vec<(usize, String)>),
    /// Anything else.
    Other,
}

/// A projection node that reads a packable weight as its `B`, as parsed.
#[derive(Clone)]
enum Reader {
    MatMul(ProjectionMatMul),
    Gemm(ProjectionGemm),
}

impl Reader {
    /// Whether the node reads its weight transposed (`Gemm`'s `transB`): stored `[N, K]`.
    fn transposed(&self) -> bool {
        matches!(self, Reader::Gemm(g) if g.trans_b)
    }
}

/// Gives every held weight its home in `model` (just parsed from the graph [`declare`] made):
/// packed for its projections, or a constant; its graph input is gone either way. Packing runs
/// in parallel on the caller's thread pool.
pub(crate) fn place(model: &mut InferenceModel, held: Vec<HeldWeight>) -> TractResult<()> {
    let ids = held
        .iter()
        .map(|w| Ok(model.node_by_name(&w.name)?.id))
        .collect::<TractResult<Vec<usize>>>()?;
    let readers: Vec<_> = held
        .iter()
        .zip(&ids)
        .map(|(w, &id)| readers_of(model, w, id))
        .collect();
    // Largest first, handed out in that order: while a weight is copied its file pages add to
    // the copies made so far, so the last ones in flight, when those copies are nearly all made,
    // should be the small ones (the peak, not the total, is what this changes).
    let mut jobs: Vec<_> = held.iter().zip(readers).enumerate().collect();
    jobs.sort_by_key(|(_, (w, _))| std::cmp::Reverse(w.data.len()));
    let mut placed: Vec<(usize, TractResult<Home>)> = jobs
        .into_iter()
        .par_bridge()
        .map(|(i, (w, readers))| {
            let home = home_of(w, readers);
            // The values are in the session's memory now: the file's pages are not needed (and
            // giving them back at once keeps the file's pages and the copies from adding up).
            // A table read in place was not read at all.
            if !matches!(home, Ok(Home::Table(..))) {
                attnrt_onnx::mapped::release(&w.data);
            }
            (i, home)
        })
        .collect();
    placed.sort_by_key(|(i, _)| *i);
    let homes = placed
        .into_iter()
        .map(|(_, home)| home)
        .collect::<TractResult<Vec<Home>>>()?;
    for (id, home) in ids.into_iter().zip(homes) {
        let konst = match home {
            Home::Const(t) => t,
            Home::Packed(packed, readers) => {
                model.node_mut(id).outputs[0].successors.clear();
                for (r, reader) in readers {
                    read_packed(model, r, reader, &packed)?;
                }
                // What stays in the weight's place: a constant no node reads.
                tensor0(0f32).into_arc_tensor()
            }
            Home::Table(table, readers) => {
                model.node_mut(id).outputs[0].successors.clear();
                for (r, node) in readers {
                    read_in_place(model, r, node, &table);
                }
                tensor0(0f32).into_arc_tensor()
            }
        };
        let node = model.node_mut(id);
        node.outputs[0].fact = InferenceFact::from(TypedFact::try_from(konst.clone())?);
        node.op = Box::new(Const::new(konst)?);
        model.inputs.retain(|o| o.node != id);
    }
    Ok(())
}

/// How the nodes of `model` read `w` (node `id`); a weight that is a graph output is read by
/// the caller too ([`Readers::Other`]).
fn readers_of(model: &InferenceModel, w: &HeldWeight, id: usize) -> Readers {
    let Some(output) = model.node(id).outputs.first() else {
        return Readers::Other;
    };
    if model.outputs.iter().any(|o| o.node == id) {
        return Readers::Other;
    }
    let inlets = &output.successors;
    let node = |inlet: &InletId| model.node(inlet.node);
    if let Some(readers) = projection_readers(model, w, inlets) {
        return Readers::Projections(readers);
    }
    let rows = inlets
        .iter()
        .map(|i| Some((i.node, gather::row_gather(node(i), i.slot, w.dims.len())?)))
        .collect::<Option<Vec<_>>>();
    match rows {
        Some(rows) if !rows.is_empty() => Readers::Rows(rows),
        _ => Readers::Other,
    }
}

/// The nodes at `inlets` when all of them are attnrt's projections taking `w` as their `B`,
/// all the same way round, and `w` is a float32 matrix whose bytes hold its values (a short
/// one is left to the constant's checked build); `None` otherwise.
fn projection_readers(
    model: &InferenceModel,
    w: &HeldWeight,
    inlets: &[InletId],
) -> Option<Vec<(usize, Reader)>> {
    let &[rows, cols] = &w.dims[..] else {
        return None;
    };
    let (rows, cols) = (usize::try_from(rows).ok()?, usize::try_from(cols).ok()?);
    let bytes = rows.checked_mul(cols).and_then(|v| v.checked_mul(4));
    if w.data_type != DataType::Float as i32 || bytes != Some(w.data.len()) {
        return None;
    }
    let readers = inlets
        .iter()
        .map(|inlet| Some((inlet.node, reader_of(model.node(inlet.node), inlet.slot)?)))
        .collect::<Option<Vec<_>>>()?;
    let transposed = readers.first()?.1.transposed();
    readers
        .iter()
        .all(|(_, r)| r.transposed() == transposed)
        .then_some(readers)
}

/// The node as a reader of its input `slot`, when it is attnrt's projection `MatMul`, or its
/// projection `Gemm` without `transA`, and `slot` is its `B`.
fn reader_of(node: &InferenceNode, slot: usize) -> Option<Reader> {
    let op = node
        .op
        .as_op()
        .downcast_ref::<Box<dyn Expansion>>()?
        .as_any();
    if slot != 1 {
        return None;
    }
    if let Some(m) = op.downcast_ref::<ProjectionMatMul>() {
        return (node.inputs.len() == 2).then(|| Reader::MatMul(m.clone()));
    }
    let g = op.downcast_ref::<ProjectionGemm>()?;
    (!g.trans_a && (2..=3).contains(&node.inputs.len())).then(|| Reader::Gemm(g.clone()))
}

/// The weight packed for its projection `readers`, left in place for its row `Gather`s, or as
/// a tract constant.
fn home_of(w: &HeldWeight, readers: Readers) -> TractResult<Home> {
    let shape: Vec<usize> = w.dims.iter().map(|&d| d as usize).collect();
    let dt = datum_type(w.data_type).context("held weight of an unread type")?;
    match readers {
        Readers::Projections(readers) => {
            let transposed = readers.first().is_some_and(|(_, r)| r.transposed());
            let key = (Kind::Packed { transposed }, w.data.clone());
            let packed = SHARED.packed.get_or_make(key, || {
                let (rows, cols) = (shape[0], shape[1]);
                // Read from the bytes as they lie (inline weights sit at any offset of the
                // file), each value once, panels in parallel.
                Ok(if transposed {
                    // `w` is `[N, K]`: element (k, j) of the product's weight is `w[j][k]`.
                    PackedWeight::from_le_bytes(&w.data, cols, rows, 1, cols)
                } else {
                    PackedWeight::from_le_bytes(&w.data, rows, cols, cols, 1)
                })
            })?;
            Ok(Home::Packed(packed, readers))
        }
        // The rows are copied as they are: ONNX's little-endian bytes are tract's values only
        // on a little-endian target.
        Readers::Rows(readers) if cfg!(target_endian = "little") => {
            match EmbeddingTable::new(w.data.clone(), dt, shape.clone()) {
                Some(table) => Ok(Home::Table(table, readers)),
                None => constant(w, dt, &shape),
            }
        }
        Readers::Rows(_) | Readers::Other => constant(w, dt, &shape),
    }
}

/// `w` as a tract constant of `dt` and `shape` (one per mapped bytes, shared by sessions).
fn constant(w: &HeldWeight, dt: DatumType, shape: &[usize]) -> TractResult<Home> {
    let key = (Kind::Const(dt), w.data.clone());
    let tensor = SHARED
        .consts
        .get_or_make(key, || tensor_from_bytes(dt, shape, &w.data))
        .with_context(|| format!("initializer '{}'", w.name))?;
    Ok(Home::Const(tensor))
}

/// A tract tensor of `dt` and `shape` from its little-endian bytes.
fn tensor_from_bytes(dt: DatumType, shape: &[usize], data: &[u8]) -> TractResult<Tensor> {
    // Safety: `from_raw` copies `data` into a tensor of `dt` after checking its length.
    unsafe {
        match dt {
            DatumType::F32 => Tensor::from_raw::<f32>(shape, data),
            DatumType::F16 => Tensor::from_raw::<f16>(shape, data),
            DatumType::F64 => Tensor::from_raw::<f64>(shape, data),
            DatumType::I8 => Tensor::from_raw::<i8>(shape, data),
            DatumType::I16 => Tensor::from_raw::<i16>(shape, data),
            DatumType::I32 => Tensor::from_raw::<i32>(shape, data),
            DatumType::I64 => Tensor::from_raw::<i64>(shape, data),
            DatumType::U8 => Tensor::from_raw::<u8>(shape, data),
            DatumType::U16 => Tensor::from_raw::<u16>(shape, data),
            DatumType::U32 => Tensor::from_raw::<u32>(shape, data),
            DatumType::U64 => Tensor::from_raw::<u64>(shape, data),
            other => bail!("cannot build a {other:?} tensor from raw bytes"),
        }
    }
}

/// Makes node `id` (`reader`, whose weight was packed) read `packed` instead of its input `B`,
/// which it no longer has (a `Gemm`'s `C` moves up to input 1).
fn read_packed(
    model: &mut InferenceModel,
    id: usize,
    reader: Reader,
    packed: &Arc<PackedWeight>,
) -> TractResult<()> {
    let weight = packed.clone();
    let op = match reader {
        Reader::MatMul(m) => expand(PackedProjection {
            node: m.node,
            weight,
        }),
        Reader::Gemm(gemm) => expand(PackedGemm { gemm, weight }),
    };
    let node = model.node_mut(id);
    node.op = op;
    node.inputs.remove(1);
    if let Some(&c) = node.inputs.get(1) {
        let successors = &mut model.node_mut(c.node).outputs[c.slot].successors;
        for inlet in successors
            .iter_mut()
            .filter(|i| i.node == id && i.slot == 2)
        {
            inlet.slot = 1;
        }
    }
    Ok(())
}

/// Makes node `id`, a row `Gather` named `node` in the model, read `table` in place instead of
/// its data input, which it no longer has (its indices move up to input 0).
fn read_in_place(model: &mut InferenceModel, id: usize, node: String, table: &EmbeddingTable) {
    let lookup = EmbeddingLookup {
        node,
        table: table.clone(),
    };
    let n = model.node_mut(id);
    n.op = expand(lookup);
    n.inputs.remove(0);
    let indices = n.inputs[0];
    let successors = &mut model.node_mut(indices.node).outputs[indices.slot].successors;
    for inlet in successors
        .iter_mut()
        .filter(|i| i.node == id && i.slot == 1)
    {
        inlet.slot = 0;
    }
}

/// What a weight's bytes were made into.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Packed { transposed: bool },
    Const(DatumType),
}

/// Packed weights and constants made from mapped bytes, by those bytes, while a session holds
/// them: a second session of the same model (or of its fused form, which shares the bytes)
/// takes them instead of making its own.
struct Shared {
    packed: Cache<PackedWeight>,
    consts: Cache<Tensor>,
}

static SHARED: Shared = Shared {
    packed: Cache::new(),
    consts: Cache::new(),
};

/// What a cached value is made as, and from which bytes.
type Key = (Kind, Bytes);

/// Values made from bytes, keyed by the bytes' address, length and what was made. An entry
/// keeps its bytes, so no other bytes can take that address while it is there; entries whose
/// value is gone are dropped as new ones come.
struct Cache<T> {
    entries: Mutex<Vec<(Key, Weak<T>)>>,
}

impl<T> Cache<T> {
    const fn new() -> Self {
        Cache {
            entries: Mutex::new(Vec::new()),
        }
    }

    /// The value made from `key`'s bytes: a live one, or `make()`'s, kept when the bytes are
    /// mapped (heap bytes are not kept alive for a cache).
    fn get_or_make(&self, key: Key, make: impl FnOnce() -> TractResult<T>) -> TractResult<Arc<T>> {
        let same =
            |k: &Key| k.0 == key.0 && k.1.as_ptr() == key.1.as_ptr() && k.1.len() == key.1.len();
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let live = entries
                .iter()
                .find(|(k, _)| same(k))
                .and_then(|(_, v)| v.upgrade());
            if let Some(v) = live {
                return Ok(v);
            }
        }
        let value = Arc::new(make()?);
        if attnrt_onnx::mapped::is_mapped(&key.1) {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.retain(|(k, v)| v.strong_count() > 0 && !same(k));
            entries.push((key, Arc::downgrade(&value)));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NamedTensor, Session, SessionOptions, Threads};
    use attnrt_onnx::attr;
    use attnrt_testkit::{
        node, node_with_attrs, seeded_values, tensor_f32, value_info, GraphBuilder,
    };

    /// `y = x · W` (x `[2, 32]`), `u = v · W` (v `[32]`, rank 1), `g0 = Gemm(x, W)`: one packed
    /// `W` for three readers; `p = x · S` and `q = t + S`: `S` is read by an `Add` too, so it is
    /// a constant. `g1 = 0.5 · x · Gᵀ + 2 · c` (a bias row) and `g2 = x · Gᵀ + m` (`m` an input):
    /// `G` is packed transposed.
    fn model() -> ModelProto {
        let gemm = |name: &str, inputs: &[&str], out: &str, alpha: f32, beta: f32| {
            let attrs = vec![
                attr::make_float("alpha", alpha),
                attr::make_float("beta", beta),
                attr::make_int("transB", 1),
            ];
            node_with_attrs(name, "Gemm", inputs, &[out], attrs)
        };
        let mut g = GraphBuilder::new("g");
        g.input(value_info("m", DataType::Float, &[2, 48]));
        g.initializer(tensor_f32("gw", &[48, 32], &seeded_values(48 * 32, 6)));
        g.initializer(tensor_f32("c", &[48], &seeded_values(48, 7)));
        g.node(gemm("gemm_1", &["x", "gw", "c"], "g1", 0.5, 2.0));
        g.node(gemm("gemm_2", &["x", "gw", "m"], "g2", 1.0, 1.0));
        g.node(node("gemm_0", "Gemm", &["x", "w"], &["g0"]));
        g.output(value_info("g0", DataType::Float, &[2, 64]));
        g.output(value_info("g1", DataType::Float, &[2, 48]));
        g.output(value_info("g2", DataType::Float, &[2, 48]));
        g.input(value_info("x", DataType::Float, &[2, 32]));
        g.input(value_info("v", DataType::Float, &[32]));
        g.input(value_info("t", DataType::Float, &[32, 64]));
        g.initializer(tensor_f32("w", &[32, 64], &seeded_values(32 * 64, 1)));
        g.initializer(tensor_f32("s", &[32, 64], &seeded_values(32 * 64, 2)));
        g.initializer(tensor_f32("small", &[2, 2], &[1.0, 2.0, 3.0, 4.0]));
        g.node(node("mm_x", "MatMul", &["x", "w"], &["y"]));
        g.node(node("mm_v", "MatMul", &["v", "w"], &["u"]));
        g.node(node("mm_s", "MatMul", &["x", "s"], &["p"]));
        g.node(node("add_s", "Add", &["t", "s"], &["q"]));
        g.output(value_info("y", DataType::Float, &[2, 64]));
        g.output(value_info("u", DataType::Float, &[64]));
        g.output(value_info("p", DataType::Float, &[2, 64]));
        g.output(value_info("q", DataType::Float, &[32, 64]));
        g.into_model(17)
    }

    fn inputs() -> Vec<NamedTensor> {
        let t = |name: &str, shape: &[usize], seed| NamedTensor {
            name: name.into(),
            tensor: Tensor::from_shape(shape, &seeded_values(shape.iter().product(), seed))
                .unwrap(),
        };
        vec![
            t("x", &[2, 32], 3),
            t("v", &[32], 4),
            t("t", &[32, 64], 5),
            t("m", &[2, 48], 8),
        ]
    }

    #[test]
    fn large_initializers_are_held_and_small_ones_stay() {
        let mut m = model();
        let held = hold_large(&mut m);
        let names: Vec<&str> = held.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["gw", "w", "s"]);
        let left: Vec<&str> = m
            .graph
            .as_ref()
            .unwrap()
            .initializer
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(left, ["c", "small"]);
    }

    #[test]
    fn projection_weights_are_packed_once_and_others_are_constants() {
        let threads = Threads::new(Some(1)).unwrap();
        let model = model();
        let ours = Session::build(&model, &inputs(), &threads, "m").unwrap();
        let names = ours.op_names();
        let projections = names
            .iter()
            .filter(|n| *n == crate::projection::OP_NAME)
            .count();
        // `x · w`, `v · w` and `Gemm(x, w)` read the packed `w`, both `Gemm`s the packed `gw`;
        // `x · s` packs `s` from its constant, as it did before.
        assert_eq!(projections, 6, "{names:?}");
        let tract = SessionOptions {
            attnrt_ops: false,
            ..SessionOptions::per_shape()
        };
        let theirs = Session::build_with_options(&model, &inputs(), &threads, "m", &tract).unwrap();
        let (a, b) = (ours.run(&inputs()).unwrap(), theirs.run(&inputs()).unwrap());
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(a.name, b.name);
            assert_eq!(a.tensor.shape(), b.tensor.shape());
            let (a, b) = (
                crate::tensor::f32_data(&a.tensor).unwrap(),
                crate::tensor::f32_data(&b.tensor).unwrap(),
            );
            let diff = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(diff < 1e-4, "{diff}");
        }
    }
}
