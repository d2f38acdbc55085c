//! The memory a planned run needs, from the plan's facts, checked against a [`MemoryBudget`]
//! before the run: a shape that would exhaust the machine is refused with an error naming the
//! tensor and the size, instead of the process being killed halfway.
//!
//! tract runs a plan's nodes in order and drops a node's values once the last node that reads
//! them has run (the graph's outputs, and values nothing reads, stay to the end); while a node
//! runs, its inputs and its new outputs are alive with everything not yet dropped. The walk
//! below adds the sizes the same way and keeps the peak. It leaves out what tract does not plan
//! as values (the weights, already resident; the scratch an op allocates inside, such as matmul
//! packing or attention tiles), so it is a lower bound; the budget's default share of the
//! available memory leaves the headroom for those. A size that depends on a symbol the inputs
//! do not bind (a data-dependent length) counts as zero.

use anyhow::Result;
use attnrt_onnx::budget::{format_bytes, tensor_bytes, MemoryBudget};
use tract_onnx::prelude::*;

use crate::tensor::dtype_name;

/// One value of a plan: a graph input or a node output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueSize {
    /// How the error names it: `input 'x'` or `node 'n' output 'y'`.
    pub label: String,
    /// Its shape at this run's input shapes.
    pub shape: Vec<u64>,
    /// Its element type.
    pub datum_type: DatumType,
    /// Its bytes.
    pub bytes: u64,
}

impl std::fmt::Display for ValueSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} {}",
            self.label,
            self.shape,
            dtype_name(self.datum_type)
        )
    }
}

/// Refuses a typed graph, before tract optimizes it, where a node's output of known shape is over
/// `budget` on its own: tract's optimization allocates in proportion to some such values (a
/// convolution's padding tables) before a plan exists for [`PlanSizes::check`] to judge a run.
/// Constants are left out (they are already in memory).
pub fn check_typed_outputs(model: &TypedModel, budget: &MemoryBudget) -> Result<()> {
    let known = SymbolValues::default();
    for node in model.nodes().iter().filter(|n| n.op.name() != "Const") {
        for slot in 0..node.outputs.len() {
            let outlet = OutletId::new(node.id, slot);
            // Only shapes known without the run's inputs: a symbol evaluates to nothing here.
            let Some(value) = value_size(model, outlet, false, &known) else {
                continue;
            };
            budget.check(value.bytes, || value.to_string())?;
        }
    }
    Ok(())
}

/// What one run of a plan keeps in memory at its peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// The most bytes alive at once (graph inputs included).
    pub peak: u64,
    /// The node running at the peak.
    pub peak_node: String,
    /// The largest single value.
    pub largest: Option<ValueSize>,
}

impl MemoryEstimate {
    /// Refuses the run when its largest value, or its peak, is over `budget`; `what` names the
    /// model.
    pub fn check(&self, budget: &MemoryBudget, what: &str) -> Result<()> {
        if let Some(v) = &self.largest {
            budget.check(v.bytes, || format!("{what}: {v}"))?;
        }
        budget.check(self.peak, || {
            let largest = self.largest.as_ref().map_or(String::new(), |v| {
                format!(", the largest {v} of {}", format_bytes(v.bytes))
            });
            format!(
                "{what}: the run at node '{}' (inputs and intermediates alive at once{largest})",
                self.peak_node
            )
        })
    }
}

/// The sizes of a plan's values, prepared once per plan: a run's estimate is then a few
/// multiplications and additions per value (a decode step must not pay for the check).
pub struct PlanSizes {
    /// The distinct symbolic dimensions of the values (evaluated once per run).
    dims: Vec<TDim>,
    /// Per step of the plan's order: its node.
    steps: Vec<usize>,
    /// Per step, the sizes of its values.
    sizes: Ragged<Size>,
    /// Per value (of every step, in order), its symbolic dimensions (indices into `dims`).
    symbolic: Ragged<usize>,
    /// Per step, the earlier steps whose values are dropped once it has run.
    drops: Ragged<usize>,
    /// How the inputs' shapes bind the symbols: input, axis, symbol, and the constant the axis
    /// adds to it (`past_sequence + 1` binds `past_sequence` to the size less 1).
    binds: Vec<(usize, usize, Symbol, i64)>,
}

/// The size of one value: a fixed factor (element size times the fixed dimensions) times its
/// symbolic dimensions ([`PlanSizes::symbolic`]).
struct Size {
    slot: usize,
    fixed: u64,
}

/// Rows of different lengths in one array: the walk of every run reads memory in order, not a
/// vector per step and value (each a cache miss once a decode step's weights have streamed
/// through the caches).
struct Ragged<T> {
    /// Where each row ends in `items`.
    ends: Vec<usize>,
    items: Vec<T>,
}

impl<T> Ragged<T> {
    fn new() -> Ragged<T> {
        Ragged {
            ends: Vec::new(),
            items: Vec::new(),
        }
    }

    fn push(&mut self, row: impl IntoIterator<Item = T>) {
        self.items.extend(row);
        self.ends.push(self.items.len());
    }

    /// Row `i`, and where it starts in the items.
    fn row(&self, i: usize) -> (usize, &[T]) {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        (start, &self.items[start..self.ends[i]])
    }
}

/// The peak of one run, before anything is named.
#[derive(Clone, Copy, Debug, Default)]
struct Peak {
    bytes: u64,
    step: usize,
    /// The largest value: step, output slot, bytes.
    largest: Option<(usize, usize, u64)>,
}

impl PlanSizes {
    /// Prepares the sizes of the values of `model` run in `order` (constants left out).
    pub fn new(model: &TypedModel, order: &[usize]) -> PlanSizes {
        let mut dims: Vec<TDim> = Vec::new();
        let (mut sizes, mut symbolic) = (Ragged::new(), Ragged::new());
        for &id in order {
            let mut row = Vec::new();
            for (slot, o) in model.node(id).outputs.iter().enumerate() {
                let (size, dims) = size_of_fact(&o.fact, slot, &mut dims);
                row.push(size);
                symbolic.push(dims);
            }
            sizes.push(row);
        }
        let mut drops = Ragged::new();
        for row in drops_after(model, order) {
            drops.push(row);
        }
        PlanSizes {
            dims,
            steps: order.to_vec(),
            sizes,
            symbolic,
            drops,
            binds: binds(model),
        }
    }

    /// Refuses a run on inputs of these shapes whose largest value, or whose peak, is over
    /// `budget`, naming the value or the node (`what` names the model). Names are made only
    /// for the error.
    pub fn check(
        &self,
        model: &TypedModel,
        inputs: &[&[usize]],
        budget: &MemoryBudget,
        what: &str,
    ) -> Result<()> {
        let peak = self.peak(&self.symbol_values(inputs));
        let largest = peak.largest.map_or(0, |(_, _, b)| b);
        if peak.bytes <= budget.bytes() && largest <= budget.bytes() {
            return Ok(());
        }
        self.estimate(model, inputs).check(budget, what)
    }

    /// What a run on inputs of these shapes keeps in memory at its peak, with names.
    pub fn estimate(&self, model: &TypedModel, inputs: &[&[usize]]) -> MemoryEstimate {
        let values = self.symbol_values(inputs);
        let peak = self.peak(&values);
        let input_nodes: Vec<usize> = model
            .input_outlets()
            .map(|o| o.iter().map(|o| o.node).collect())
            .unwrap_or_default();
        let largest = peak.largest.and_then(|(step, slot, _)| {
            let id = self.steps[step];
            value_size(
                model,
                OutletId::new(id, slot),
                input_nodes.contains(&id),
                &values,
            )
        });
        MemoryEstimate {
            peak: peak.bytes,
            peak_node: self
                .steps
                .get(peak.step)
                .map_or(String::new(), |id| model.node(*id).name.clone()),
            largest,
        }
    }

    /// The symbol values the inputs' shapes give.
    fn symbol_values(&self, inputs: &[&[usize]]) -> SymbolValues {
        let mut values = SymbolValues::default();
        for (input, axis, symbol, offset) in &self.binds {
            if let Some(&size) = inputs.get(*input).and_then(|s| s.get(*axis)) {
                values.set(symbol, size as i64 - offset);
            }
        }
        values
    }

    /// The liveness walk (see the module documentation).
    fn peak(&self, values: &SymbolValues) -> Peak {
        let dims: Vec<u64> = self
            .dims
            .iter()
            .map(|d| {
                d.eval(values)
                    .to_i64()
                    .ok()
                    .and_then(|v| u64::try_from(v).ok())
            })
            .map(|v| v.unwrap_or(0))
            .collect();
        let mut made = vec![0u64; self.steps.len()];
        let (mut live, mut peak) = (0u64, Peak::default());
        for step in 0..self.steps.len() {
            let (first, sizes) = self.sizes.row(step);
            for (value, s) in (first..).zip(sizes) {
                let (_, symbolic) = self.symbolic.row(value);
                let bytes = symbolic
                    .iter()
                    .fold(s.fixed, |acc, &d| acc.saturating_mul(dims[d]));
                made[step] = made[step].saturating_add(bytes);
                if peak.largest.is_none_or(|(_, _, b)| bytes > b) {
                    peak.largest = Some((step, s.slot, bytes));
                }
            }
            live = live.saturating_add(made[step]);
            if live > peak.bytes {
                peak.bytes = live;
                peak.step = step;
            }
            for &d in self.drops.row(step).1 {
                live = live.saturating_sub(made[d]);
            }
        }
        peak
    }
}

/// The size of a value of `fact` and its symbolic dimensions, added to `dims` when new.
fn size_of_fact(fact: &TypedFact, slot: usize, dims: &mut Vec<TDim>) -> (Size, Vec<usize>) {
    let mut size = Size {
        slot,
        fixed: fact.datum_type.size_of() as u64,
    };
    let mut symbolic = Vec::new();
    for d in fact.shape.dims() {
        match d.to_i64() {
            Ok(v) => size.fixed = size.fixed.saturating_mul(u64::try_from(v).unwrap_or(0)),
            Err(_) => {
                let at = dims.iter().position(|k| k == d).unwrap_or_else(|| {
                    dims.push(d.clone());
                    dims.len() - 1
                });
                symbolic.push(at);
            }
        }
    }
    (size, symbolic)
}

/// Per step of `order`, the steps whose values tract drops once that step has run: those
/// whose last reader it is (values the graph outputs, or nothing reads, are never dropped).
fn drops_after(model: &TypedModel, order: &[usize]) -> Vec<Vec<usize>> {
    let mut step_of = vec![None; model.nodes().len()];
    let mut last_read: Vec<Option<usize>> = vec![None; model.nodes().len()];
    for (step, &id) in order.iter().enumerate() {
        step_of[id] = Some(step);
        for i in &model.node(id).inputs {
            last_read[i.node] = Some(step);
        }
    }
    for o in model
        .output_outlets()
        .map(|o| o.to_vec())
        .unwrap_or_default()
    {
        last_read[o.node] = None;
    }
    let mut drops = vec![Vec::new(); order.len()];
    for (id, last) in last_read.iter().enumerate() {
        if let (Some(last), Some(made)) = (last, step_of[id]) {
            drops[*last].push(made);
        }
    }
    drops
}

/// How the plan's input facts bind symbols: an axis that is one symbol plus a constant (with
/// slope 1) gives that symbol from the input's size.
fn binds(model: &TypedModel) -> Vec<(usize, usize, Symbol, i64)> {
    let mut out = Vec::new();
    let Ok(outlets) = model.input_outlets() else {
        return out;
    };
    for (input, outlet) in outlets.iter().enumerate() {
        let Ok(fact) = model.outlet_fact(*outlet) else {
            continue;
        };
        for (axis, dim) in fact.shape.dims().iter().enumerate() {
            let symbols: Vec<Symbol> = dim.symbols().into_iter().collect();
            let [symbol] = &symbols[..] else {
                continue;
            };
            let at = |v: i64| {
                let values = SymbolValues::default().with(symbol, v);
                dim.eval(&values).to_i64().ok()
            };
            if let (Some(offset), Some(next)) = (at(0), at(1)) {
                if next == offset + 1 {
                    out.push((input, axis, symbol.clone(), offset));
                }
            }
        }
    }
    out
}

/// The size of one value at these symbol values, named; `None` when a dimension stays unknown.
fn value_size(
    model: &TypedModel,
    outlet: OutletId,
    is_input: bool,
    symbols: &SymbolValues,
) -> Option<ValueSize> {
    let fact = model.outlet_fact(outlet).ok()?;
    let shape: Vec<u64> = fact
        .shape
        .dims()
        .iter()
        .map(|d| u64::try_from(d.eval(symbols).to_i64().ok()?).ok())
        .collect::<Option<_>>()?;
    let node = model.node(outlet.node);
    let label = match (is_input, model.outlet_label(outlet)) {
        (true, _) => format!("input '{}'", node.name),
        (false, Some(name)) => format!("node '{}' output '{name}'", node.name),
        (false, None) => format!("node '{}' output {}", node.name, outlet.slot),
    };
    let item = fact.datum_type.size_of() as u64;
    Some(ValueSize {
        bytes: tensor_bytes(shape.iter().copied(), item),
        label,
        shape,
        datum_type: fact.datum_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `y = x + x; z = y * y` on x `[s, 4]` f32, s symbolic, planned as tract plans it.
    fn chain() -> (TypedModel, Vec<usize>) {
        let mut m = TypedModel::default();
        let s = m.symbols.sym("s");
        let x = m
            .add_source("x", f32::fact(&[s.to_dim(), 4.to_dim()]))
            .unwrap();
        let y = m
            .wire_node("y", tract_onnx::tract_core::ops::math::add(), &[x, x])
            .unwrap();
        let z = m
            .wire_node("z", tract_onnx::tract_core::ops::math::mul(), &[y[0], y[0]])
            .unwrap();
        m.select_output_outlets(&z).unwrap();
        let order = m.eval_order().unwrap();
        (m, order)
    }

    #[test]
    fn the_peak_follows_liveness_and_symbols_resolve_from_the_inputs() {
        let (m, order) = chain();
        let sizes = PlanSizes::new(&m, &order);
        let e = sizes.estimate(&m, &[&[10, 4]]);
        // x (160 B) and y (160 B) alive when y is made; x dropped, then y and z.
        assert_eq!(e.peak, 320);
        assert_eq!(e.largest.as_ref().unwrap().bytes, 160);
        assert_eq!(e.largest.as_ref().unwrap().label, "input 'x'");
        let e = sizes.estimate(&m, &[&[1000, 4]]);
        assert_eq!(e.peak, 32_000);
        assert_eq!(e.peak_node, "y");
    }

    #[test]
    fn over_the_budget_names_the_value_or_the_peak() {
        let (m, order) = chain();
        let sizes = PlanSizes::new(&m, &order);
        let e = sizes.estimate(&m, &[&[10, 4]]);
        e.check(&MemoryBudget::new(320), "m").unwrap();
        sizes
            .check(&m, &[&[10, 4]], &MemoryBudget::new(320), "m")
            .unwrap();
        let err = sizes.check(&m, &[&[10, 4]], &MemoryBudget::new(319), "m");
        assert!(err.is_err());
        let err = e
            .check(&MemoryBudget::new(100), "m")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("m: input 'x' [10, 4] float32 needs 160 B, over the memory budget"),
            "{err}"
        );
        let err = e
            .check(&MemoryBudget::new(200), "m")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("m: the run at node 'y' (inputs and intermediates alive at once")
                && err.contains("needs 320 B"),
            "{err}"
        );
    }
}
