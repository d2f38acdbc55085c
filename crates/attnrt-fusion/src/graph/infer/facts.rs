//! What the forward pass knows about each tensor, and the small helpers every op's function
//! uses to read its inputs and record its outputs.

use std::collections::HashMap;

use attnrt_onnx::NodeProto;

use crate::graph::dim::Dim;
use crate::graph::value::Value;

/// What the forward pass found, by tensor name.
#[derive(Default)]
pub(crate) struct Facts {
    pub shapes: HashMap<String, Vec<Dim>>,
    pub values: HashMap<String, Value>,
    pub elem_types: HashMap<String, i32>,
}

impl Facts {
    /// The shape of input `i` of `n`.
    pub(super) fn in_shape(&self, n: &NodeProto, i: usize) -> Option<Vec<Dim>> {
        n.input
            .get(i)
            .filter(|s| !s.is_empty())
            .and_then(|t| self.shapes.get(t))
            .cloned()
    }

    /// The value of input `i` of `n`.
    pub(super) fn in_value(&self, n: &NodeProto, i: usize) -> Option<&Value> {
        n.input
            .get(i)
            .filter(|s| !s.is_empty())
            .and_then(|t| self.values.get(t))
    }

    /// Records output `i` of `n`; a value without a shape gives the value's dims.
    pub(super) fn set(
        &mut self,
        n: &NodeProto,
        i: usize,
        shape: Option<Vec<Dim>>,
        value: Option<Value>,
    ) {
        let Some(name) = n.output.get(i).filter(|s| !s.is_empty()) else {
            return;
        };
        if let Some(s) = shape {
            self.shapes.insert(name.clone(), s);
        }
        if let Some(v) = value {
            if !self.shapes.contains_key(name) {
                self.shapes.insert(
                    name.clone(),
                    v.dims().iter().map(|&d| Dim::known(d)).collect(),
                );
            }
            self.values.insert(name.clone(), v);
        }
    }

    /// Output `i` of `n` has element type `ty`.
    pub(super) fn set_type(&mut self, n: &NodeProto, i: usize, ty: i32) {
        if let Some(o) = n.output.get(i) {
            self.elem_types.insert(o.clone(), ty);
        }
    }

    /// The first output of `n` has the element type of its first input.
    pub(super) fn copy_type(&mut self, n: &NodeProto) {
        if let Some(t) = self.first_input_type(n) {
            self.set_type(n, 0, t);
        }
    }

    pub(super) fn first_input_type(&self, n: &NodeProto) -> Option<i32> {
        n.input
            .first()
            .and_then(|i| self.elem_types.get(i))
            .copied()
    }
}

/// Normalises a possibly negative axis of a rank-`r` tensor (not range-checked).
pub(super) fn axis(a: i64, r: i64) -> i64 {
    if a < 0 {
        a + r
    } else {
        a
    }
}
