//! Readable renderings: a deterministic text form of a model's structure (for snapshots) and
//! Graphviz DOT of one fused block before and after.

use std::collections::HashSet;
use std::fmt::Write;

use attnrt_onnx::proto::attribute_proto::AttributeType;
use attnrt_onnx::{node_label, tensor, AttributeProto, ModelProto, ValueInfoProto};

use crate::graph::{tensor_value, Value};
use crate::report::Fused;

fn attr_text(a: &AttributeProto) -> String {
    let ty = AttributeType::try_from(a.r#type).unwrap_or(AttributeType::Undefined);
    let v = match ty {
        AttributeType::Int => a.i.to_string(),
        AttributeType::Float => format!("{}", a.f),
        AttributeType::Ints => format!("{:?}", a.ints),
        AttributeType::Floats => format!("{:?}", a.floats),
        AttributeType::String => format!("{:?}", String::from_utf8_lossy(&a.s)),
        AttributeType::Tensor => a.t.as_ref().map_or("tensor".into(), |t| {
            format!("tensor{:?}{}", t.dims, small_value(t))
        }),
        AttributeType::Graph => "graph".into(),
        _ => "…".into(),
    };
    format!("{}={v}", a.name)
}

fn small_value(t: &attnrt_onnx::TensorProto) -> String {
    let count = tensor::element_count(&t.dims, 1 << 20).unwrap_or(u64::MAX);
    if count > 8 {
        return String::new();
    }
    match tensor_value(t) {
        Some(Value::Floats(_, v)) => format!("{v:?}"),
        Some(Value::Ints(_, v)) => format!(
            "[{}]",
            v.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Some(Value::Bools(_, v)) => format!("{v:?}"),
        None => String::new(),
    }
}

fn vi_text(vi: &ValueInfoProto) -> String {
    use attnrt_onnx::proto::tensor_shape_proto::dimension::Value as DV;
    use attnrt_onnx::proto::type_proto::Value as TV;
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(TV::TensorType(tt)) => {
            let dims = tt.shape.as_ref().map(|s| {
                s.dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(DV::DimValue(v)) => v.to_string(),
                        Some(DV::DimParam(p)) => p.clone(),
                        None => "?".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            format!(
                "{} {}[{}]",
                vi.name,
                tensor::type_name(tt.elem_type),
                dims.unwrap_or_else(|| "…".into())
            )
        }
        _ => vi.name.clone(),
    }
}

/// Readable, deterministic text form of a model's structure: opset imports, inputs, outputs,
/// initializer shapes (values only for tiny ones), and every node in order with its key
/// attributes and edges. No weights.
pub fn structure_text(model: &ModelProto) -> String {
    let mut s = String::new();
    let mut imports: Vec<String> = model
        .opset_import
        .iter()
        .map(|o| {
            format!(
                "{}={}",
                if o.domain.is_empty() {
                    "ai.onnx"
                } else {
                    &o.domain
                },
                o.version
            )
        })
        .collect();
    imports.sort();
    let _ = writeln!(
        s,
        "ir_version {}; opsets {}",
        model.ir_version,
        imports.join(", ")
    );
    let Some(g) = model.graph.as_ref() else {
        s.push_str("(no graph)\n");
        return s;
    };
    let inits: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    for i in g.input.iter().filter(|i| !inits.contains(i.name.as_str())) {
        let _ = writeln!(s, "input  {}", vi_text(i));
    }
    for o in &g.output {
        let _ = writeln!(s, "output {}", vi_text(o));
    }
    let _ = writeln!(s, "initializers {}", g.initializer.len());
    for t in &g.initializer {
        if tensor::element_count(&t.dims, 1 << 40).unwrap_or(u64::MAX) <= 8 {
            let _ = writeln!(
                s,
                "  {} {}{:?} {}",
                t.name,
                tensor::type_name(t.data_type),
                t.dims,
                small_value(t)
            );
        }
    }
    let _ = writeln!(s, "nodes {}", g.node.len());
    for n in &g.node {
        let domain = if n.domain.is_empty() {
            String::new()
        } else {
            format!("{}::", n.domain)
        };
        let attrs: Vec<String> = n.attribute.iter().map(attr_text).collect();
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{}}}", attrs.join(", "))
        };
        let _ = writeln!(
            s,
            "  {domain}{}{attrs} [{}] ({}) -> ({})",
            n.op_type,
            node_label(n),
            n.input.join(", "),
            n.output.join(", ")
        );
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Graphviz DOT text of fused block `block` before (the nodes it replaced, in `original`) and
/// after (the fused node and the nodes inserted with it, in `fused.model`).
pub fn block_dot(original: &ModelProto, fused: &Fused, block: usize) -> String {
    let mut s = String::from(
        "digraph attnrt_block {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n",
    );
    let Some(b) = fused.report.blocks.get(block) else {
        let _ = writeln!(s, "  missing [label=\"no block {block}\"];\n}}");
        return s;
    };
    let replaced: HashSet<&str> = b.replaced.iter().map(String::as_str).collect();
    let cluster = |s: &mut String, tag: &str, title: &str, nodes: Vec<&attnrt_onnx::NodeProto>| {
        let _ = writeln!(
            s,
            "  subgraph cluster_{tag} {{\n    label=\"{}\";",
            esc(title)
        );
        let produced: HashSet<&str> = nodes
            .iter()
            .flat_map(|n| n.output.iter().map(String::as_str))
            .collect();
        for (i, n) in nodes.iter().enumerate() {
            let _ = writeln!(
                s,
                "    {tag}_n{i} [label=\"{}\\n{}\"];",
                esc(&n.op_type),
                esc(&node_label(n))
            );
        }
        let mut externals: Vec<&str> = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            for inp in n.input.iter().filter(|x| !x.is_empty()) {
                match nodes.iter().position(|m| m.output.contains(inp)) {
                    Some(j) => {
                        let _ =
                            writeln!(s, "    {tag}_n{j} -> {tag}_n{i} [label=\"{}\"];", esc(inp));
                    }
                    None => {
                        let k = externals.iter().position(|e| e == inp).unwrap_or_else(|| {
                            externals.push(inp);
                            externals.len() - 1
                        });
                        let _ = writeln!(s, "    {tag}_t{k} -> {tag}_n{i};");
                    }
                }
            }
        }
        for (k, e) in externals.iter().enumerate() {
            let _ = writeln!(s, "    {tag}_t{k} [shape=ellipse, label=\"{}\"];", esc(e));
        }
        let _ = produced;
        s.push_str("  }\n");
    };
    let before: Vec<&attnrt_onnx::NodeProto> = original
        .graph
        .iter()
        .flat_map(|g| g.node.iter())
        .filter(|n| replaced.contains(node_label(n).as_str()))
        .collect();
    let prefix = format!("{}/", b.node);
    let after: Vec<&attnrt_onnx::NodeProto> = fused
        .model
        .graph
        .iter()
        .flat_map(|g| g.node.iter())
        .filter(|n| n.name == b.node || n.name.starts_with(&prefix))
        .collect();
    cluster(
        &mut s,
        "before",
        &format!("before: {} nodes", before.len()),
        before,
    );
    cluster(&mut s, "after", &format!("after: {}", b.node), after);
    s.push_str("}\n");
    s
}
