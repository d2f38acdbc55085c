//! The one failure type of the fusion rules.
//!
//! Every predicate — of the pattern language, of the attention rules, of the mask proofs —
//! fails with a [`Mismatch`]: the node it is about, the [`Check`] that failed, what the rule
//! needs there and what the graph has. The report turns it into `--explain` text and `--json`
//! fields in one place ([`crate::report::NearMiss`]).

use std::fmt;

use serde::Serialize;

/// The checks a rule makes, by name (`--json` writes them in kebab case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// The model's opset allows the rule and the fused op.
    Opset,
    /// The Softmax normalises the last (key) axis.
    SoftmaxAxis,
    /// The Softmax output reaches the context MatMul, through nothing but the probabilities'
    /// exporter no-ops.
    Context,
    /// A node of one of the expected op types produces the tensor.
    OpType,
    /// The node has the number of inputs the pattern lists.
    Inputs,
    /// A tensor the rule reads as a number (a scale, a fill) is known before run time.
    KnownValue,
    /// A pattern name binds one tensor and one node.
    Binding,
    /// One of the exporter variants matches.
    Variant,
    /// A node inside the block is the identity at inference (`Identity`, `Dropout` in inference
    /// mode, `Cast` to the same type).
    SkipThrough,
    /// The NaN guard after the Softmax replaces NaN by 0.
    NanGuard,
    /// The scale is a positive finite number known before run time.
    Scale,
    /// The scale, softcap and mask layers come in an order the op can express.
    LayerOrder,
    /// A node between the QK MatMul and the Softmax is a scale, softcap, mask or skip-through.
    ScoresPath,
    /// A mask term fits the scores and its fill is usable.
    Mask,
    /// The shapes the layout is proven from are known.
    Shapes,
    /// Q, K and V have the same rank (3 or 4).
    Rank,
    /// Q, K and V have the same batch.
    Batch,
    /// The heads of Q, K and V match (or divide, for grouped-query attention).
    Heads,
    /// The head split/merge around the block can be absorbed (3-D layout).
    HeadLayout,
    /// Intermediates of the block are used nowhere else.
    Exclusive,
    /// A tensor read outside the block is one `qk_matmul_output` stage of the op.
    QkOutput,
    /// `--strict`: the fused block has no caveat.
    Strict,
    /// A mask layer is the causal triangle.
    Causal,
    /// A decoder's cache joins can be produced by the fused node.
    KvCache,
}

impl Check {
    /// The kebab-case name, as `--json` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Check::Opset => "opset",
            Check::SoftmaxAxis => "softmax-axis",
            Check::Context => "context",
            Check::OpType => "op-type",
            Check::Inputs => "inputs",
            Check::KnownValue => "known-value",
            Check::Binding => "binding",
            Check::Variant => "variant",
            Check::SkipThrough => "skip-through",
            Check::NanGuard => "nan-guard",
            Check::Scale => "scale",
            Check::LayerOrder => "layer-order",
            Check::ScoresPath => "scores-path",
            Check::Mask => "mask",
            Check::Shapes => "shapes",
            Check::Rank => "rank",
            Check::Batch => "batch",
            Check::Heads => "heads",
            Check::HeadLayout => "head-layout",
            Check::Exclusive => "exclusive",
            Check::QkOutput => "qk-output",
            Check::Strict => "strict",
            Check::Causal => "causal",
            Check::KvCache => "kv-cache",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed check: the node it is about, the check, what was expected and what was found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Mismatch {
    /// The node (its label), or a tensor name in quotes, or `(model)`.
    pub node: String,
    /// The check that failed.
    pub check: Check,
    /// What the rule needs there.
    pub expected: String,
    /// What the graph has.
    pub found: String,
}

impl Mismatch {
    /// A failed `check` at `node`.
    pub fn new(
        node: impl Into<String>,
        check: Check,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Mismatch {
        Mismatch {
            node: node.into(),
            check,
            expected: expected.into(),
            found: found.into(),
        }
    }

    /// `found; expected …`: the reason, without the node and the check.
    pub fn reason(&self) -> String {
        format!("{}; expected {}", self.found, self.expected)
    }

    /// `node: found`, for a list of failures of one known check (the causal notes).
    pub fn brief(&self) -> String {
        format!("{}: {}", self.node, self.found)
    }

    /// This failure, seen from the node `outer` that reads it: `outer: context: node: found`.
    pub fn seen_from(self, outer: &str, context: &str) -> Mismatch {
        Mismatch {
            found: format!("{context}: {}", self.brief()),
            node: outer.to_string(),
            ..self
        }
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]: {}", self.node, self.check, self.reason())
    }
}
