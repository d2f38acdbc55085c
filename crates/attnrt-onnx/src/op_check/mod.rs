//! Operator-level validation: the attribute and input rules that ONNX's checker and shape
//! inference enforce when a model is loaded (ONNX Runtime refuses such a model before running
//! it), and the ones every run would trip over (an index out of its dimension). A model that
//! breaks them must be refused here, naming the node and the attribute or input: past this
//! point tract may hang or allocate without bound on it.
//!
//! The rules use only what the file states (see `facts.rs`): declared shapes, initializers and
//! `Constant` nodes. A rule whose operands are not stated is skipped; nothing is inferred.
//! Subgraphs (If/Loop/Scan bodies) are checked with the same rules; bodies of model-local
//! functions are not (their attributes may be references to the caller's).

mod arity;
mod arity_bounds;
mod arity_table;
mod axes;
mod broadcast;
mod error;
mod facts;
mod indices;
mod reshape;
mod shapes;
mod slicing;

pub use error::{OpError, Operand, Problem};

use std::collections::HashSet;

use crate::attr;
use crate::opset::is_default_domain;
use crate::proto::{GraphProto, ModelProto, NodeProto};
use facts::{Facts, Shape};

/// Checks every default-domain node of `model` (main graph and subgraphs) against its
/// operator's rules at the model's opset.
pub fn check_model(model: &ModelProto) -> Result<(), OpError> {
    let (Some(graph), Some(opset)) = (&model.graph, crate::opset::default_version(model)) else {
        return Ok(()); // no graph or no default-domain import: the structural checks say so
    };
    let functions: HashSet<(&str, &str)> = model
        .functions
        .iter()
        .map(|f| (f.domain.as_str(), f.name.as_str()))
        .collect();
    check_graph(graph, None, opset, &functions)
}

fn check_graph<'a>(
    g: &'a GraphProto,
    outer: Option<&'a Facts<'a>>,
    opset: i64,
    functions: &HashSet<(&str, &str)>,
) -> Result<(), OpError> {
    let facts = Facts::of_graph(g, outer);
    for node in &g.node {
        let is_call = functions.contains(&(node.domain.as_str(), node.op_type.as_str()));
        if is_default_domain(&node.domain) && !is_call {
            check_node(&NodeCx {
                node,
                facts: &facts,
                opset,
            })?;
        }
        for a in &node.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                check_graph(sub, Some(&facts), opset, functions)?;
            }
        }
    }
    Ok(())
}

fn check_node(cx: &NodeCx) -> Result<(), OpError> {
    arity::check(cx)?;
    match cx.node.op_type.as_str() {
        "Transpose" => shapes::transpose(cx),
        "Concat" => shapes::concat(cx),
        "Expand" => shapes::expand(cx),
        "Tile" => shapes::tile(cx),
        "MatMul" => shapes::matmul(cx),
        "Gemm" => shapes::gemm(cx),
        "Reshape" => reshape::check(cx),
        "Slice" => slicing::slice(cx),
        "Split" => slicing::split(cx),
        "Squeeze" => axes::squeeze(cx),
        "Unsqueeze" => axes::unsqueeze(cx),
        "Flatten" => axes::flatten(cx),
        "CumSum" => axes::cumsum(cx),
        "Softmax" | "LogSoftmax" | "Hardmax" => axes::softmax(cx),
        "ArgMax" | "ArgMin" => axes::axis_attribute(cx, 0),
        "TopK" | "LayerNormalization" | "RMSNormalization" => axes::axis_attribute(cx, -1),
        "Gather" | "GatherElements" | "ScatterElements" => indices::along_axis(cx),
        "GatherND" | "ScatterND" => indices::nd(cx),
        "Cast" => cx.required_attribute("to"),
        op if op.starts_with("Reduce") => axes::reduce(cx),
        op if broadcast::is_multidirectional(op, cx.opset) => broadcast::check(cx),
        _ => Ok(()),
    }
}

/// One node under check, with what the file states around it.
pub(super) struct NodeCx<'a> {
    node: &'a NodeProto,
    facts: &'a Facts<'a>,
    opset: i64,
}

impl<'a> NodeCx<'a> {
    /// The error of this node.
    fn fail(&self, problem: Problem) -> OpError {
        OpError {
            node: crate::node_label(self.node),
            op_type: self.node.op_type.clone(),
            problem: Box::new(problem),
        }
    }

    /// Input `i`'s name, unless absent or given as "" (an omitted optional input).
    fn input(&self, i: usize) -> Option<&'a str> {
        self.node
            .input
            .get(i)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    fn shape(&self, i: usize) -> Option<Shape> {
        self.facts.shape(self.input(i)?)
    }

    fn rank(&self, i: usize) -> Option<usize> {
        self.facts.rank(self.input(i)?)
    }

    /// The values of input `i` when it is an integer constant of the file.
    fn ints(&self, i: usize) -> Option<Vec<i64>> {
        self.facts.ints(self.input(i)?)
    }

    /// Input `i` as an error names it, with `value` when known.
    fn input_operand(&self, i: usize, value: Option<Vec<i64>>) -> Operand {
        Operand::Input {
            index: i,
            name: self.node.input.get(i).cloned().unwrap_or_default(),
            value,
        }
    }

    /// "input i 'name'", for the `of` of an axis error.
    fn input_phrase(&self, i: usize) -> String {
        format!("input {i} '{}'", self.input(i).unwrap_or_default())
    }

    /// An `INT` attribute; a value of another type is refused.
    fn int_attribute(&self, name: &str) -> Result<Option<i64>, OpError> {
        attr::int(self.node, name).map_err(|_| self.wrong_type(name, "INT"))
    }

    /// An `INTS` attribute; a value of another type is refused.
    fn ints_attribute(&self, name: &str) -> Result<Option<&'a [i64]>, OpError> {
        attr::ints(self.node, name).map_err(|_| self.wrong_type(name, "INTS"))
    }

    fn wrong_type(&self, name: &str, expected: &str) -> OpError {
        self.fail(Problem::AttributeType {
            name: name.to_string(),
            expected: expected.to_string(),
        })
    }

    fn required_attribute(&self, name: &str) -> Result<(), OpError> {
        match attr::find(self.node, name) {
            Some(_) => Ok(()),
            None => Err(self.fail(Problem::MissingAttribute {
                name: name.to_string(),
            })),
        }
    }

    /// A list of integers the operator takes as attribute `name` before opset `input_from`
    /// and as input `index` from then on (axes, split sizes, starts/ends): its operand and
    /// values, when given and known. The attribute at an opset that moved it to an input is
    /// refused, as ONNX's checker refuses an attribute the schema does not have.
    fn list(
        &self,
        name: &str,
        index: usize,
        input_from: i64,
    ) -> Result<Option<(Operand, Vec<i64>)>, OpError> {
        if self.opset < input_from {
            return Ok(self.ints_attribute(name)?.map(|v| {
                let operand = Operand::Attribute {
                    name: name.to_string(),
                    value: Some(v.to_vec()),
                };
                (operand, v.to_vec())
            }));
        }
        if attr::find(self.node, name).is_some() {
            return Err(self.fail(Problem::StaleAttribute {
                name: name.to_string(),
                op_type: self.node.op_type.clone(),
                opset: self.opset,
                hint: format!("from opset {input_from} on it is input {index}"),
            }));
        }
        Ok(self
            .ints(index)
            .map(|v| (self.input_operand(index, Some(v.clone())), v)))
    }
}
