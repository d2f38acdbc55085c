//! The runtime op registry: every execution op attnrt adds to tract or runs in place of tract's,
//! in one list ([`OPS`]), each with the ONNX op types whose parser it replaces, the name it has
//! in a planned graph (what `--profile` shows as a node's `tract_op`), what it counts as in
//! [`OpCounts`], and the [`SessionOptions`] switch that turns it on. The ONNX front-end a
//! session parses with ([`onnx_frontend_with`]) and the op counts of its reports are made from
//! this list; the graph rewrites made before tract parses the model are listed in
//! `lower/mod.rs`.
//!
//! A new execution op: its module defines the op, its name and an
//! `OnnxParser` static per ONNX op type it parses (`tract_parser.rs`); one entry here registers
//! it. An op that takes the place of tract's only where tract's optimization left its generic
//! form is instead an entry of [`PLAN_OPS`], whose entries rewrite each plan tract has
//! optimized. Folds into an op (a bias `Add` or a `Gelu` into a projection) are tract declutter
//! rules of the op, in its module (`projection.rs`, `gelu.rs`).

use tract_onnx::prelude::{TractResult, TypedModel};

use crate::options::{SessionOptions, Switch};
use crate::tract_parser::OnnxParser;
use crate::{
    attention, broadcast_binary, divide, flatten, gather, gelu, integer_to_float, layer_norm,
    matmul_integer, projection, quant_projection, quantize_linear, symbolic_mul,
};

/// What an op counts as in [`OpCounts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counted {
    /// [`OpCounts::attention`].
    Attention,
    /// [`OpCounts::projection`].
    Projection,
    /// [`OpCounts::quantized`].
    Quantized,
    /// [`OpCounts::tract`]: the other operations.
    Other,
}

/// One execution op of attnrt's (see the module docs).
pub(crate) struct RuntimeOp {
    /// Its name in a planned graph (`Op::name`): a profile's `tract_op`, what
    /// [`Session::op_names`](crate::Session::op_names) lists and [`OpCounts`] counts by.
    pub(crate) name: &'static str,
    /// attnrt's parsers for the ONNX op types (default domain) that become this op, each
    /// registered in place of tract's.
    pub(crate) parsers: &'static [&'static OnnxParser],
    /// What it counts as in reports.
    pub(crate) counts_as: Counted,
    /// When it is registered.
    pub(crate) switch: Switch,
}

/// Every execution op of attnrt's, in registration order.
pub(crate) static OPS: &[RuntimeOp] = &[
    RuntimeOp {
        name: attention::OP_NAME,
        parsers: &[&attention::PARSER],
        counts_as: Counted::Attention,
        switch: Switch::Always,
    },
    RuntimeOp {
        name: projection::OP_NAME,
        parsers: &[&projection::MATMUL, &projection::GEMM],
        counts_as: Counted::Projection,
        switch: Switch::AttnrtOps,
    },
    // The projections of quantized models: the rewrites `dynamic-quantize-matmul`
    // (`lower/quant.rs`) and `qdq-matmul` (`lower/qdq.rs`) write the op types, which tract has
    // no parser for.
    RuntimeOp {
        name: quant_projection::OP_NAME,
        parsers: &[&quant_projection::PARSER, &integer_to_float::PARSER],
        counts_as: Counted::Quantized,
        switch: Switch::AttnrtOps,
    },
    // `MatMulInteger` by a constant weight outside those chains.
    RuntimeOp {
        name: matmul_integer::OP_NAME,
        parsers: &[&matmul_integer::PARSER],
        counts_as: Counted::Quantized,
        switch: Switch::AttnrtOps,
    },
    // LayerNorm and Gelu are attnrt's ops, but the reports have counted them with tract's
    // since they were added (`ops: ... N other op(s) on tract`); a change there is a change of
    // every report.
    RuntimeOp {
        name: layer_norm::OP_NAME,
        parsers: &[&layer_norm::PARSER],
        counts_as: Counted::Other,
        switch: Switch::AttnrtOps,
    },
    // Without attnrt's ops, LayerNormalization still gets its axis check in front of tract's
    // expansion (nothing of attnrt's is left in the planned graph).
    RuntimeOp {
        name: layer_norm::CHECKED_NAME,
        parsers: &[&layer_norm::CHECKED_PARSER],
        counts_as: Counted::Other,
        switch: Switch::TractOps,
    },
    RuntimeOp {
        name: gelu::OP_NAME,
        parsers: &[&gelu::PARSER],
        counts_as: Counted::Other,
        switch: Switch::AttnrtOps,
    },
    // tract's `Gather` behind an index check (tract indexes without one): an operation of
    // tract's in every report, and in every session.
    RuntimeOp {
        name: gather::OP_NAME,
        parsers: &[&gather::PARSER, &gather::ELEMENTS_PARSER],
        counts_as: Counted::Other,
        switch: Switch::Always,
    },
    // Integer `Div` and `Mod` behind a check of their operands (tract's panic on a zero divisor
    // or on `MIN / -1`): in every session, like the index check.
    RuntimeOp {
        name: divide::OP_NAME,
        parsers: &[&divide::DIV, &divide::MOD],
        counts_as: Counted::Other,
        switch: Switch::Always,
    },
    // `Flatten` with its own shape rule, which multiplies symbolic dimensions (tract's refuses
    // two): tract's reshapes in the plan, in every session.
    RuntimeOp {
        name: flatten::OP_NAME,
        parsers: &[&flatten::PARSER],
        counts_as: Counted::Other,
        switch: Switch::Always,
    },
    // `Mul` with a symbolic constant operand evaluated in front of tract's product (tract's
    // simplification of the product fails on it): tract's ops in the plan, in every session.
    RuntimeOp {
        name: symbolic_mul::OP_NAME,
        parsers: &[&symbolic_mul::PARSER],
        counts_as: Counted::Other,
        switch: Switch::Always,
    },
    // `QuantizeLinear` with its input clamped where tract's integer add would overflow: tract's
    // op and two of its element-wise ones in the plan, in every session.
    RuntimeOp {
        name: quantize_linear::OP_NAME,
        parsers: &[&quantize_linear::PARSER],
        counts_as: Counted::Other,
        switch: Switch::Always,
    },
];

/// One of attnrt's ops put in place of tract's in a plan tract has optimized (nothing in the
/// parser changes): named, counted and switched as [`RuntimeOp`]s are.
pub(crate) struct PlanOp {
    /// Its name in a planned graph.
    pub(crate) name: &'static str,
    /// What it counts as in reports.
    pub(crate) counts_as: Counted,
    /// When plans get it.
    pub(crate) switch: Switch,
    /// Puts it in place of the ops of tract's optimized plan that its module chooses.
    pub(crate) take_over: fn(&mut TypedModel) -> TractResult<()>,
}

/// Every op put into optimized plans, in the order they are put in.
pub(crate) static PLAN_OPS: &[PlanOp] = &[
    // Float32 `Add`/`Sub`/`Mul`/`Div` that tract left on its generic broadcast (the rotary
    // embedding of a batch): counted with tract's element-wise ops, as the reports have them.
    PlanOp {
        name: broadcast_binary::OP_NAME,
        counts_as: Counted::Other,
        switch: Switch::AttnrtOps,
        take_over: broadcast_binary::take_over_generic_binops,
    },
];

/// `model`, a plan tract has optimized, with every op of [`PLAN_OPS`] that `options` switch on
/// in place of tract's.
pub(crate) fn take_over_plan(model: &mut TypedModel, options: &SessionOptions) -> TractResult<()> {
    for op in PLAN_OPS.iter().filter(|op| op.switch.is_on(options)) {
        (op.take_over)(model)?;
    }
    Ok(())
}

/// tract's names of the nodes that hold graph inputs and constants: not operations, neither
/// counted nor profiled.
const NOT_OPERATIONS: [&str; 2] = ["Source", "Const"];

/// Whether a planned node whose op is named `name` is an operation (not a graph input or a
/// constant).
pub(crate) fn is_operation(name: &str) -> bool {
    !NOT_OPERATIONS.contains(&name)
}

/// The ONNX front-end of tract with attnrt's ops registered as the default
/// [`SessionOptions`] say: `Attention` on attnrt's kernel, and constant-weight `MatMul`s
/// and `Gemm`s, `LayerNormalization` and `Gelu` on attnrt's ops.
pub fn onnx_frontend() -> tract_onnx::Onnx {
    onnx_frontend_with(&SessionOptions::default())
}

/// The ONNX front-end of tract with every registered op that `options` switch on in place of
/// tract's.
pub fn onnx_frontend_with(options: &SessionOptions) -> tract_onnx::Onnx {
    let mut onnx = tract_onnx::onnx();
    for op in OPS.iter().filter(|op| op.switch.is_on(options)) {
        for parser in op.parsers {
            parser.register(&mut onnx.op_register);
        }
    }
    onnx
}

/// What a planned graph runs, by implementation (see [`Session::op_counts`](crate::Session::op_counts)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpCounts {
    /// Attention operations on attnrt's kernel.
    pub attention: usize,
    /// Constant-weight projections on attnrt's op (its panel kernel or `gemm`).
    pub projection: usize,
    /// Integer projections of quantized models on attnrt's integer kernels (a quantized
    /// projection's whole chain, or a `MatMulInteger` by a constant weight); not serialized
    /// when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub quantized: usize,
    /// Every other operation (tract's, and attnrt's `LayerNormalization` and `Gelu`).
    pub tract: usize,
}

impl OpCounts {
    /// The counts of a planned graph's op names (graph inputs and constants not counted).
    pub(crate) fn of_ops<'a>(names: impl IntoIterator<Item = &'a str>) -> OpCounts {
        let mut c = OpCounts::default();
        for name in names.into_iter().filter(|n| is_operation(n)) {
            let counted = OPS
                .iter()
                .find(|op| op.name == name)
                .map(|op| op.counts_as)
                .or_else(|| {
                    PLAN_OPS
                        .iter()
                        .find(|op| op.name == name)
                        .map(|op| op.counts_as)
                })
                .unwrap_or(Counted::Other);
            match counted {
                Counted::Attention => c.attention += 1,
                Counted::Projection => c.projection += 1,
                Counted::Quantized => c.quantized += 1,
                Counted::Other => c.tract += 1,
            }
        }
        c
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl std::fmt::Display for OpCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The kernels every session of this process takes (the CPU, `ATTNRT_KERNEL_ISA`).
        let kernels = crate::kernels::of_process();
        let isa = kernels.map_or_else(|| "no usable path".into(), |k| k.isa().to_string());
        let projection = kernels.map_or_else(
            || "no usable kernels".into(),
            |k| k.projection().to_string(),
        );
        write!(
            f,
            "{} attention on attnrt's kernel ({isa}), {} projection(s) on {projection}",
            self.attention, self.projection,
        )?;
        if self.quantized > 0 {
            let quant =
                kernels.map_or_else(|| "no usable kernels".into(), |k| k.quant().to_string());
            write!(f, ", {} int8 projection(s) on {quant}", self.quantized)?;
        }
        write!(f, ", {} other op(s) on tract", self.tract)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_op_is_named_once_and_every_onnx_op_type_parsed_by_one_op() {
        let mut names = HashSet::new();
        for op in OPS {
            assert!(names.insert(op.name), "{} is named twice", op.name);
            assert!(
                op.name.starts_with("Attnrt"),
                "{}: not attnrt's name",
                op.name
            );
            assert!(is_operation(op.name));
            assert!(!op.parsers.is_empty(), "{} has no parser", op.name);
        }
        for op in PLAN_OPS {
            assert!(names.insert(op.name), "{} is named twice", op.name);
            assert!(op.name.starts_with("Attnrt") && is_operation(op.name));
        }
        // In any one session, one parser per op type.
        for attnrt_ops in [true, false] {
            let options = SessionOptions {
                attnrt_ops,
                ..SessionOptions::default()
            };
            let mut op_types = HashSet::new();
            for op in OPS.iter().filter(|op| op.switch.is_on(&options)) {
                for p in op.parsers {
                    assert!(op_types.insert(p.op_type), "{} is parsed twice", p.op_type);
                }
            }
        }
    }

    #[test]
    fn every_op_is_registered_exactly_when_its_switch_is_on() {
        let tract = tract_onnx::onnx();
        for attnrt_ops in [true, false] {
            let options = SessionOptions {
                attnrt_ops,
                ..SessionOptions::default()
            };
            let ops = onnx_frontend_with(&options).op_register;
            for op in OPS {
                for p in op.parsers {
                    let registered = ops.0.get(p.op_type).copied();
                    let ours = registered.is_some_and(|r| std::ptr::fn_addr_eq(r, p.ours));
                    assert_eq!(
                        ours,
                        op.switch.is_on(&options),
                        "{} for {} (attnrt_ops {attnrt_ops})",
                        p.op_type,
                        op.name
                    );
                    // tract has a parser of its own for each (kept, or left in place), except
                    // for the op types only attnrt's rewrites write.
                    let new_op_type =
                        [quant_projection::OP_TYPE, integer_to_float::OP_TYPE].contains(&p.op_type);
                    assert!(
                        new_op_type || tract.op_register.0.contains_key(p.op_type),
                        "{}",
                        p.op_type
                    );
                }
            }
            // Nothing else is replaced.
            for (op_type, parser) in &ops.0 {
                let ours = OPS
                    .iter()
                    .any(|op| op.parsers.iter().any(|p| p.op_type == op_type));
                if !ours {
                    let tract = tract.op_register.0[op_type];
                    assert!(std::ptr::fn_addr_eq(*parser, tract), "{op_type} replaced");
                }
            }
        }
    }

    #[test]
    fn op_counts_follow_the_registry() {
        let names = [
            "Source",
            "Const",
            attention::OP_NAME,
            projection::OP_NAME,
            projection::OP_NAME,
            layer_norm::OP_NAME,
            gelu::OP_NAME,
            quant_projection::OP_NAME,
            matmul_integer::OP_NAME,
            "Add",
        ];
        let c = OpCounts::of_ops(names);
        let counts = (c.attention, c.projection, c.quantized, c.tract);
        assert_eq!(counts, (1, 2, 2, 3), "{names:?}");
    }
}
