//! The shape check of a symbolic plan ([`crate::plan`]), prepared once per plan.
//!
//! A symbolic plan's run compares every node's outputs with the shapes tract planned for them
//! (what tract's `TypedFact::matches` decides: the same element type, the same rank, and every
//! planned size that evaluates to a number under the run's symbol values equal to the value's).
//! Evaluating each planned dimension per node and run cost a decode step more than many of its
//! nodes: here the planned sizes are read once, the constants kept as numbers, and each distinct
//! symbolic size is evaluated once per run, when the first node that has it has run (a symbol
//! tract resolves from an output part way through a run is known from then on; a size that does
//! not evaluate to a number yet is evaluated again at the next node that has it).

use anyhow::bail;
use tract_onnx::prelude::*;

/// One word of the planned shapes: an output's header, or one of its planned sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Word {
    /// An output of this element type (by index into [`PlannedShapes::types`]) and rank; its
    /// sizes follow.
    Output { dt: u32, rank: u32 },
    /// A constant size (as tract's `TDim::Val`).
    Value(i64),
    /// The distinct symbolic size of this index.
    Symbolic(u32),
}

/// The shapes tract planned for every node's outputs (see the module docs), packed in one
/// array in the plan's order: a node's words, and mostly those of the nodes run before and
/// after it, share cache lines (a decode step's weights stream through the caches between two
/// nodes, so every other layout costs a miss per output and size).
#[derive(Debug, Default)]
pub(crate) struct PlannedShapes {
    /// The distinct symbolic sizes.
    symbolic: Vec<TDim>,
    /// The distinct element types.
    types: Vec<DatumType>,
    /// Per node id, where its outputs' words start in `words`, and how many outputs it has
    /// (read here, not from the node, whose outputs are a cache miss of their own).
    starts: Vec<(u32, u32)>,
    words: Vec<Word>,
}

/// A run's values of the planned symbolic sizes, as far as known (`None`: not evaluated yet,
/// or not a number yet).
pub(crate) struct RunSizes(Vec<Option<i64>>);

/// `item`'s index in `items`, added when new.
fn index_of<T: PartialEq + Clone>(items: &mut Vec<T>, item: &T) -> u32 {
    let at = items.iter().position(|i| i == item).unwrap_or_else(|| {
        items.push(item.clone());
        items.len() - 1
    });
    at as u32
}

impl PlannedShapes {
    /// The planned output shapes of `model`'s nodes, laid out in the plan's `order` (the
    /// nodes outside it after).
    pub(crate) fn of(model: &TypedModel, order: &[usize]) -> PlannedShapes {
        let mut shapes = PlannedShapes {
            starts: vec![(u32::MAX, 0); model.nodes().len()],
            ..PlannedShapes::default()
        };
        for id in order.iter().copied().chain(0..model.nodes().len()) {
            if shapes.starts[id].0 != u32::MAX {
                continue; // placed in order already
            }
            let outputs = &model.node(id).outputs;
            shapes.starts[id] = (shapes.words.len() as u32, outputs.len() as u32);
            for o in outputs {
                let dt = index_of(&mut shapes.types, &o.fact.datum_type);
                let rank = o.fact.shape.len() as u32;
                shapes.words.push(Word::Output { dt, rank });
                for d in o.fact.shape.iter() {
                    let word = match d {
                        TDim::Val(v) => Word::Value(*v),
                        d => Word::Symbolic(index_of(&mut shapes.symbolic, d)),
                    };
                    shapes.words.push(word);
                }
            }
        }
        shapes
    }

    /// A run's sizes, none evaluated yet.
    pub(crate) fn run_sizes(&self) -> RunSizes {
        RunSizes(vec![None; self.symbolic.len()])
    }

    /// Refuses outputs of `node` whose shapes differ from what tract planned for it (see the
    /// module docs), under the run's `symbols`.
    pub(crate) fn check(
        &self,
        sizes: &mut RunSizes,
        symbols: &SymbolValues,
        node: &TypedNode,
        outputs: &[TValue],
    ) -> TractResult<()> {
        let (mut at, planned) = match self.starts.get(node.id) {
            Some(&(at, planned)) if at != u32::MAX => (at as usize, planned as usize),
            _ => bail!("symbolic plan: node '{}' has no planned shapes", node.name),
        };
        for (ix, value) in outputs.iter().take(planned).enumerate() {
            let Some(&Word::Output { dt, rank }) = self.words.get(at) else {
                bail!(
                    "symbolic plan: node '{}' output {ix} has no planned shape",
                    node.name
                );
            };
            let dims = &self.words[at + 1..at + 1 + rank as usize];
            at += 1 + rank as usize;
            if !self.matches(sizes, symbols, self.types[dt as usize], dims, value) {
                bail!(
                    "symbolic plan: node '{}' output {ix} is {:?} {:?}, tract planned {:?}",
                    node.name,
                    value.datum_type(),
                    value.shape(),
                    node.outputs[ix].fact
                );
            }
        }
        Ok(())
    }

    /// Whether `value` has the element type `dt` and the planned sizes `dims`.
    fn matches(
        &self,
        sizes: &mut RunSizes,
        symbols: &SymbolValues,
        dt: DatumType,
        dims: &[Word],
        value: &Tensor,
    ) -> bool {
        if value.datum_type() != dt || value.rank() != dims.len() {
            return false;
        }
        dims.iter().zip(value.shape()).all(|(d, &size)| {
            let planned = match *d {
                Word::Value(v) => Some(v),
                Word::Symbolic(ix) => {
                    let known = &mut sizes.0[ix as usize];
                    if known.is_none() {
                        *known = self.symbolic[ix as usize].eval(symbols).as_i64();
                    }
                    *known
                }
                Word::Output { .. } => return false,
            };
            // (a size not known as a number is not checked, as tract's `matches` does)
            planned.is_none_or(|v| v as usize == size)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::tract_core::ops::math::add;

    /// A model `x: [n, 3] f32` → `y = x + x` planned `[n, 3]`, and its symbol `n`.
    fn model() -> (TypedModel, Symbol) {
        let mut model = TypedModel::default();
        let n = model.symbols.sym("n");
        let x = model
            .add_source(
                "x",
                TypedFact::dt_shape(f32::datum_type(), [n.to_dim(), 3.to_dim()]),
            )
            .unwrap();
        let y = model.wire_node("y", add(), &[x, x]).unwrap();
        model.select_output_outlets(&y).unwrap();
        (model, n)
    }

    fn values(n: &Symbol, v: i64) -> SymbolValues {
        let mut s = SymbolValues::default();
        s.set(n, v);
        s
    }

    /// The prepared check decides as tract's `TypedFact::matches` on every node and value:
    /// bound and unbound symbols, wrong sizes, ranks and types.
    #[test]
    fn decides_as_tracts_matches() {
        let (model, n) = model();
        let shapes = PlannedShapes::of(&model, &model.eval_order().unwrap());
        let cases: Vec<Tensor> = vec![
            Tensor::zero::<f32>(&[4, 3]).unwrap(),
            Tensor::zero::<f32>(&[5, 3]).unwrap(),
            Tensor::zero::<f32>(&[4, 2]).unwrap(),
            Tensor::zero::<f32>(&[4]).unwrap(),
            Tensor::zero::<f32>(&[4, 3, 1]).unwrap(),
            Tensor::zero::<i64>(&[4, 3]).unwrap(),
        ];
        for symbols in [values(&n, 4), SymbolValues::default()] {
            for node in model.nodes() {
                for t in &cases {
                    let value = t.clone().into_tvalue();
                    let tract = node.outputs[0]
                        .fact
                        .matches(&value, Some(&symbols))
                        .unwrap();
                    let mut sizes = shapes.run_sizes();
                    let ours = shapes.check(&mut sizes, &symbols, node, &[value]);
                    assert_eq!(
                        ours.is_ok(),
                        tract,
                        "{} on {t:?} under {symbols:?}",
                        node.name
                    );
                }
            }
        }
    }

    /// A wrong shape is refused with the node's name and what tract planned; a symbolic size
    /// evaluated once serves the later nodes of the run.
    #[test]
    fn refuses_naming_the_node() {
        let (model, n) = model();
        let shapes = PlannedShapes::of(&model, &model.eval_order().unwrap());
        let symbols = values(&n, 4);
        let mut sizes = shapes.run_sizes();
        let y = model.node(model.output_outlets().unwrap()[0].node);
        let good = Tensor::zero::<f32>(&[4, 3]).unwrap().into_tvalue();
        shapes.check(&mut sizes, &symbols, y, &[good]).unwrap();
        assert_eq!(sizes.0, vec![Some(4)]);
        let bad = Tensor::zero::<f32>(&[2, 3]).unwrap().into_tvalue();
        let e = shapes.check(&mut sizes, &symbols, y, &[bad]).unwrap_err();
        let msg = format!("{e}");
        assert!(
            msg.starts_with("symbolic plan: node 'y' output 0 is F32 [2, 3], tract planned"),
            "{msg}"
        );
    }

    /// A size not yet a number (its symbol unresolved) is not checked, and is evaluated again
    /// once the symbol is known.
    #[test]
    fn unresolved_size_is_evaluated_again() {
        let (model, n) = model();
        let shapes = PlannedShapes::of(&model, &model.eval_order().unwrap());
        let y = model.node(model.output_outlets().unwrap()[0].node);
        let mut sizes = shapes.run_sizes();
        let t = Tensor::zero::<f32>(&[7, 3]).unwrap().into_tvalue();
        let unbound = SymbolValues::default();
        shapes
            .check(&mut sizes, &unbound, y, std::slice::from_ref(&t))
            .unwrap();
        assert!(shapes.check(&mut sizes, &values(&n, 4), y, &[t]).is_err());
    }
}
