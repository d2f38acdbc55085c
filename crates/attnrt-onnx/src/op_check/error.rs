//! The error of the operator checks: which node, and what about its attributes or inputs ONNX
//! refuses.

use std::fmt;

/// An attribute or input of a node, as the error names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    /// Attribute `name`, with its value when it is a list of integers.
    Attribute {
        /// The attribute's name.
        name: String,
        /// Its value, when a list of integers.
        value: Option<Vec<i64>>,
    },
    /// `INT` attribute `name` of value `value`.
    IntAttribute {
        /// The attribute's name.
        name: String,
        /// Its value.
        value: i64,
        /// Whether the node leaves it out and `value` is the operator's default.
        default: bool,
    },
    /// Input number `index` (from 0), named `name`, with its value when the file states it.
    Input {
        /// Position among the node's inputs.
        index: usize,
        /// The tensor's name.
        name: String,
        /// Its value, when a constant of the file.
        value: Option<Vec<i64>>,
    },
}

/// The values shown in a message: the first few only, a long list of indices helps nobody.
fn show_values(f: &mut fmt::Formatter<'_>, values: &[i64]) -> fmt::Result {
    const SHOWN: usize = 8;
    let head: Vec<String> = values.iter().take(SHOWN).map(i64::to_string).collect();
    let more = if values.len() > SHOWN { ", ..." } else { "" };
    write!(f, " [{}{more}]", head.join(", "))
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = match self {
            Operand::IntAttribute {
                name,
                value,
                default,
            } => {
                let note = if *default { " (the default)" } else { "" };
                return write!(f, "attribute {name} {value}{note}");
            }
            Operand::Attribute { name, value } => {
                write!(f, "attribute {name}")?;
                value
            }
            Operand::Input { index, name, value } => {
                write!(f, "input {index} '{name}'")?;
                value
            }
        };
        match value {
            Some(v) => show_values(f, v),
            None => Ok(()),
        }
    }
}

/// What is wrong; each variant's message completes "node 'n' (Op): ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// Too few or too many inputs for the operator's schema at the model's opset.
    #[error("has {count} input(s); {op_type} at opset {opset} takes {}", range(*min, *max))]
    InputCount {
        /// The operator.
        op_type: String,
        /// Inputs given (empty names of optional inputs count, as in ONNX's checker).
        count: usize,
        /// Fewest allowed.
        min: usize,
        /// Most allowed (`usize::MAX`: any number).
        max: usize,
        /// The model's default-domain opset.
        opset: i64,
    },
    /// Too few or too many outputs.
    #[error("has {count} output(s); {op_type} at opset {opset} gives {}", range(*min, *max))]
    OutputCount {
        /// The operator.
        op_type: String,
        /// Outputs given.
        count: usize,
        /// Fewest allowed.
        min: usize,
        /// Most allowed.
        max: usize,
        /// The model's default-domain opset.
        opset: i64,
    },
    /// A required input is given as "" (the spelling of an omitted optional input).
    #[error("input {index} is required but empty")]
    EmptyInput {
        /// Its position.
        index: usize,
    },
    /// A required attribute is absent.
    #[error("attribute {name} is required but missing")]
    MissingAttribute {
        /// The attribute.
        name: String,
    },
    /// An attribute of the wrong type.
    #[error("attribute {name} must be of type {expected}")]
    AttributeType {
        /// The attribute.
        name: String,
        /// The type the operator needs.
        expected: String,
    },
    /// An attribute the operator does not have at the model's opset (it became an input).
    #[error("attribute {name} is not an attribute of {op_type} at opset {opset}: {hint}")]
    StaleAttribute {
        /// The attribute.
        name: String,
        /// The operator.
        op_type: String,
        /// The model's opset.
        opset: i64,
        /// Where the value goes instead.
        hint: String,
    },
    /// An axis outside the range the tensor's rank allows.
    #[error("{} outside [{}, {}) for {of} of rank {rank}", axis_phrase(operand, *axis), -(*rank as i64), *rank as i64 + i64::from(*inclusive))]
    AxisOutOfRange {
        /// Where the axis is.
        operand: Operand,
        /// The axis.
        axis: i64,
        /// The rank it indexes.
        rank: usize,
        /// The tensor whose rank that is (e.g. "input 'x'", "the output").
        of: String,
        /// Whether `rank` itself is allowed (Flatten's axis).
        inclusive: bool,
    },
    /// The same axis appears twice (after negative axes are counted from the end).
    #[error("{operand} repeats axis {axis}")]
    RepeatedAxis {
        /// Where the axes are.
        operand: Operand,
        /// The repeated axis.
        axis: i64,
    },
    /// A tensor's rank does not fit what the operator needs.
    #[error("{operand} has rank {rank}, {expected}")]
    Rank {
        /// The input.
        operand: Operand,
        /// Its rank.
        rank: usize,
        /// What was needed, as a phrase ("expected 2", "but input 0 'x' has rank 3").
        expected: String,
    },
    /// A list whose length does not fit.
    #[error("{operand} has {len} value(s), {expected}")]
    Length {
        /// Where the list is.
        operand: Operand,
        /// Its length.
        len: usize,
        /// What was needed, as a phrase.
        expected: String,
    },
    /// An index outside its dimension.
    #[error("{operand} holds index {index}, outside [{}, {extent}) of {of}", -extent)]
    IndexOutOfRange {
        /// Where the index is.
        operand: Operand,
        /// The index.
        index: i64,
        /// The dimension's extent.
        extent: i64,
        /// Which dimension of which tensor ("axis 1 of input 'x'").
        of: String,
    },
    /// A value the operator cannot take, with the reason.
    #[error("{operand} {reason}")]
    Value {
        /// Where the value is.
        operand: Operand,
        /// Why it is wrong, as a phrase ("has more than one -1").
        reason: String,
    },
}

/// "attribute axis 5 is" for an `INT` attribute, "attribute axes [0, 5] has axis 5," for a list
/// that holds it.
fn axis_phrase(operand: &Operand, axis: i64) -> String {
    match operand {
        Operand::IntAttribute { .. } => format!("{operand} is"),
        _ => format!("{operand} has axis {axis},"),
    }
}

fn range(min: usize, max: usize) -> String {
    match (min, max) {
        (min, usize::MAX) => format!("{min} or more"),
        (min, max) if min == max => format!("{min}"),
        (min, max) => format!("{min} to {max}"),
    }
}

/// A node whose attributes or inputs break its operator's rules; ONNX's checker or shape
/// inference refuses the model (ONNX Runtime at load), or every run of it would fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node '{node}' ({op_type}): {problem}")]
pub struct OpError {
    /// The node ([`crate::node_label`]).
    pub node: String,
    /// Its operator.
    pub op_type: String,
    /// What is wrong (boxed: errors travel through every `?` of the checks, and are rare).
    pub problem: Box<Problem>,
}
