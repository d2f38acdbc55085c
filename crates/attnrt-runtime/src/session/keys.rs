//! Which plan serves a run: the [`PlanKey`] of its inputs under the session's
//! [`ShapePolicy`](crate::ShapePolicy).

use anyhow::{bail, Result};
use tract_onnx::tract_hir::infer::{Factoid, InferenceFact};

use super::{InputSpec, Session};
use crate::options::ShapePolicy;
use crate::plan::{self, DimKey, PlanKey};
use crate::tensor::NamedTensor;

impl Session {
    /// The key of the plan that serves these inputs under `policy` (the session's, or a run's
    /// own). Refuses an input whose rank differs from the declared one.
    pub(super) fn key_for(&self, inputs: &[&NamedTensor], policy: &ShapePolicy) -> Result<PlanKey> {
        let anchor = match policy {
            ShapePolicy::DynamicDims(names) | ShapePolicy::DynamicDimsFree { tied: names, .. } => {
                names.first().cloned()
            }
            _ => None,
        };
        let anchor_value = anchor.as_ref().and_then(|a| self.symbol_value(a, inputs));
        let mut key = Vec::with_capacity(inputs.len());
        for (spec, t) in self.inputs.iter().zip(inputs) {
            let shape = t.tensor.shape();
            if let Some(rank) = spec.rank {
                if rank != shape.len() {
                    bail!(
                        "{}: input '{}' has rank {}, the model declares rank {rank}",
                        self.what,
                        spec.name,
                        shape.len()
                    );
                }
            }
            let dims = shape
                .iter()
                .enumerate()
                .map(|(axis, &size)| {
                    let anchor = (anchor.as_deref(), anchor_value);
                    dim_key(policy, spec.dim(axis), size, anchor)
                })
                .collect();
            key.push((t.tensor.datum_type(), dims));
        }
        let anchor = anchor.filter(|_| anchor_value.is_some());
        Ok(PlanKey {
            inputs: key,
            anchor,
            branch: self.branch_value(inputs)?,
        })
    }

    /// The value fed to the input that chooses the graph's branch, when the model has one.
    fn branch_value(&self, inputs: &[&NamedTensor]) -> Result<Option<bool>> {
        let Some(ix) = self.branch_input else {
            return Ok(None);
        };
        let t = &inputs[ix].tensor;
        let values = t.cast_to::<bool>()?;
        match values.try_as_plain_ram()?.as_slice::<bool>()? {
            [v] => Ok(Some(*v)),
            _ => bail!(
                "{}: input '{}' chooses the graph's branch and must hold one boolean, not {:?}",
                self.what,
                self.input_names[ix],
                t.shape()
            ),
        }
    }

    /// The size the inputs give the declared symbol `name` (the first axis declared as it).
    fn symbol_value(&self, name: &str, inputs: &[&NamedTensor]) -> Option<usize> {
        self.inputs.iter().zip(inputs).find_map(|(spec, t)| {
            (0..t.tensor.rank()).find_map(|axis| {
                let syms = &spec.dim(axis).symbols;
                (syms.len() == 1 && syms[0] == name).then(|| t.tensor.shape()[axis])
            })
        })
    }
}

/// How `axis` of an input is planned under `policy`: symbolic when it keeps its declared name
/// symbolic (as the anchor, or free) and the file does not fix its size (a size the file fixes
/// but the caller contradicts is bound, as given); tied to the anchor for the other kept names.
fn dim_key(
    policy: &ShapePolicy,
    declared: &DeclaredDim,
    size: usize,
    (anchor, anchor_value): (Option<&str>, Option<usize>),
) -> DimKey {
    if declared.fixed.is_some() {
        return DimKey::Bound(size);
    }
    let (names, free) = match policy {
        ShapePolicy::PerShape => return DimKey::Bound(size),
        ShapePolicy::Dynamic => return DimKey::Symbolic,
        ShapePolicy::DynamicDims(names) => (names, &[][..]),
        ShapePolicy::DynamicDimsFree { tied, free } => (tied, &free[..]),
    };
    let syms = &declared.symbols;
    if let [sym] = &syms[..] {
        if free.contains(sym) {
            return DimKey::Symbolic;
        }
    }
    let kept = !syms.is_empty() && syms.iter().all(|s| names.contains(s));
    // An expression over the anchor and names other axes bind (optimum's mask, `[batch,
    // past_sequence_length + sequence_length]`): its size less the anchor's is the bound
    // part, so it is tied like a kept name (else every decode step planned anew).
    let over_anchor = syms.len() > 1 && anchor.is_some_and(|a| syms.iter().any(|s| s == a));
    match (anchor, anchor_value) {
        (Some(a), _) if kept && syms.len() == 1 && syms[0] == a => DimKey::Symbolic,
        (Some(_), Some(v)) if (kept && syms.len() == 1) || over_anchor => {
            DimKey::Tied(size as i64 - v as i64)
        }
        // Not kept, or a kept name with no anchor value to relate it to: bound.
        _ => DimKey::Bound(size),
    }
}

/// What an input declares for one axis (tract's fact as parsed, read once per session).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct DeclaredDim {
    /// The size the file fixes.
    pub(super) fixed: Option<usize>,
    /// The symbols of its size (empty when static or unknown).
    pub(super) symbols: Vec<String>,
}

/// An axis the input does not declare: neither fixed nor named.
static UNDECLARED: DeclaredDim = DeclaredDim {
    fixed: None,
    symbols: Vec::new(),
};

impl InputSpec {
    /// What the input `name` declares in `fact`.
    pub(super) fn of(name: String, fact: &InferenceFact) -> InputSpec {
        let rank = fact.shape.rank().concretize().map(|r| r as usize);
        // (an open shape may know its leading axes)
        let dims = (0..fact.shape.dims().count())
            .map(|axis| DeclaredDim {
                fixed: plan::declared_static(fact, axis),
                symbols: plan::declared_symbols(fact, axis),
            })
            .collect();
        InputSpec { name, rank, dims }
    }

    /// What the input declares for `axis` (nothing beyond the axes its fact knows).
    pub(super) fn dim(&self, axis: usize) -> &DeclaredDim {
        self.dims.get(axis).unwrap_or(&UNDECLARED)
    }
}

/// `key` for messages: each input's type and dims (`?` symbolic, `anchor+c` tied).
pub(super) fn key_str(key: &PlanKey) -> String {
    key.inputs
        .iter()
        .map(|(dt, dims)| {
            let anchor = key.anchor.as_deref().unwrap_or("?");
            let dims: Vec<String> = dims
                .iter()
                .map(|d| match d {
                    DimKey::Bound(v) => v.to_string(),
                    DimKey::Symbolic => "?".to_string(),
                    DimKey::Tied(c) => format!("{anchor}{c:+}"),
                })
                .collect();
            format!("{dt:?}[{}]", dims.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}
