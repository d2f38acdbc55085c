//! What fusion did and did not do, as data (`--json`) and as text (`attnrt fuse`'s summary and
//! `--explain` lines). Every near miss comes from one [`Mismatch`]; this is the one place that
//! turns it into words.

use attnrt_onnx::ModelProto;
use serde::Serialize;

use crate::mismatch::{Check, Mismatch};

/// The fused model and what happened.
#[derive(Clone, Debug)]
pub struct Fused {
    /// The rewritten model (the input unchanged when nothing was fused).
    pub model: ModelProto,
    /// The report.
    pub report: FusionReport,
}

/// What fusion did and did not do.
#[derive(Serialize, Clone, Debug, Default)]
pub struct FusionReport {
    /// Fused blocks, in the order of their Softmax nodes.
    pub blocks: Vec<FusedBlock>,
    /// Fused activations (GELU), in graph order.
    pub activations: Vec<FusedActivation>,
    /// Softmax nodes that were not fused, with the failed predicate.
    pub near_misses: Vec<NearMiss>,
    /// Model-level notes (opset raise, converted nodes, why nothing was fused).
    pub notes: Vec<String>,
    /// Default-domain opset of the input.
    pub opset_before: i64,
    /// Default-domain opset of the output.
    pub opset_after: i64,
}

/// One fused attention block.
#[derive(Serialize, Clone, Debug)]
pub struct FusedBlock {
    /// The fused node's name (`attnrt/Attention_<i>`).
    pub node: String,
    /// The rule and the variants it matched.
    pub rule: String,
    /// The Softmax node of the block.
    pub softmax: String,
    /// Labels of the nodes removed.
    pub replaced: Vec<String>,
    /// "3d" (head split absorbed) or "4d".
    pub layout: String,
    /// Query heads, when known.
    pub q_heads: Option<i64>,
    /// Key/value heads, when known.
    pub kv_heads: Option<i64>,
    /// The emitted `scale` attribute (`None`: the op's default 1/sqrt(head_size)).
    pub scale: Option<f32>,
    /// "none", "additive", "bool", or a combination ("additive+fill").
    pub mask: String,
    /// Whether `is_causal` was set.
    pub is_causal: bool,
    /// How the causal triangle was proven, or why `is_causal` was not used (absent when the
    /// block has no mask).
    pub causal_note: Option<String>,
    /// The emitted `softcap` attribute, when the block caps its scores.
    pub softcap: Option<f32>,
    /// Where the fused result differs from the original on edge inputs.
    pub caveats: Vec<String>,
}

/// One fused activation.
#[derive(Serialize, Clone, Debug)]
pub struct FusedActivation {
    /// The fused node's name (`attnrt/Gelu_<i>`).
    pub node: String,
    /// The rule and form (`gelu[tanh]`, `gelu[erf]`).
    pub rule: String,
    /// The anchor node (the `Tanh` or `Erf`).
    pub anchor: String,
    /// Labels of the nodes removed.
    pub replaced: Vec<String>,
}

/// A Softmax that looked like attention but was not fused.
#[derive(Serialize, Clone, Debug)]
pub struct NearMiss {
    /// The Softmax node.
    pub softmax: String,
    /// The rule tried.
    pub rule: String,
    /// The node where the rule failed.
    pub node: String,
    /// The failed predicate, in words: what was found and what was expected.
    pub reason: String,
    /// The name of the check that failed.
    pub check: Check,
    /// What the rule needs at `node`.
    pub expected: String,
    /// What the graph has at `node`.
    pub found: String,
}

impl NearMiss {
    /// The near miss of the block of Softmax `softmax` (its label) that failed with `m`.
    pub fn new(softmax: String, m: Mismatch) -> NearMiss {
        NearMiss::of_rule("attention", softmax, m)
    }

    /// The near miss of rule `rule` anchored at node `anchor` (its label; for attention, the
    /// Softmax) that failed with `m`.
    pub fn of_rule(rule: &str, anchor: String, m: Mismatch) -> NearMiss {
        NearMiss {
            softmax: anchor,
            rule: rule.into(),
            reason: m.reason(),
            node: m.node,
            check: m.check,
            expected: m.expected,
            found: m.found,
        }
    }
}

impl FusionReport {
    /// Whether anything was fused.
    pub fn changed(&self) -> bool {
        !self.blocks.is_empty() || !self.activations.is_empty()
    }

    /// One line per fused block and activation, then the counts and the opset change.
    pub fn summary_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.blocks.iter().map(FusedBlock::summary_line).collect();
        lines.extend(self.activations.iter().map(|a| {
            format!(
                "{}: {} → Gelu ({}, {} nodes replaced)",
                a.node,
                a.anchor,
                a.rule,
                a.replaced.len()
            )
        }));
        let attention_misses = self
            .near_misses
            .iter()
            .filter(|m| m.rule == "attention")
            .count();
        let gelus = match self.activations.len() {
            0 => String::new(),
            n => format!(", {n} GELU(s) fused"),
        };
        lines.push(format!(
            "{} block(s) fused, {attention_misses} not fused{gelus}; opset {} → {}",
            self.blocks.len(),
            self.opset_before,
            self.opset_after
        ));
        lines
    }

    /// Every near miss with its node, check and reason, every caveat, and the notes.
    pub fn explain_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for b in &self.blocks {
            lines.push(format!("fused {} ({}): rule {}", b.node, b.softmax, b.rule));
            if let Some(n) = &b.causal_note {
                lines.push(format!("  {n}"));
            }
            for c in &b.caveats {
                lines.push(format!("  caveat: {c}"));
            }
        }
        for a in &self.activations {
            lines.push(format!("fused {} ({}): rule {}", a.node, a.anchor, a.rule));
        }
        for m in &self.near_misses {
            lines.push(format!(
                "not fused: {} (rule {}): at {} [{}]: {}",
                m.softmax, m.rule, m.node, m.check, m.reason
            ));
        }
        lines.extend(self.notes.iter().map(|n| format!("note: {n}")));
        lines
    }
}

impl FusedBlock {
    fn summary_line(&self) -> String {
        let heads = match (self.q_heads, self.kv_heads) {
            (Some(q), Some(k)) if q != k => format!(" heads={q}/{k}"),
            (Some(q), _) => format!(" heads={q}"),
            _ => String::new(),
        };
        let scale = self.scale.map_or("default".to_string(), |s| format!("{s}"));
        let caveats = if self.caveats.is_empty() {
            String::new()
        } else {
            format!(" caveats={}", self.caveats.len())
        };
        format!(
            "{}: {} → Attention {}{heads} scale={scale} mask={}{} ({} nodes replaced){caveats}",
            self.node,
            self.softmax,
            self.layout,
            self.mask,
            if self.is_causal { " causal" } else { "" },
            self.replaced.len()
        )
    }
}
