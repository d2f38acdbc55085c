//! Hand-built attention graphs, one per exporter variant (the approach of ONNX Runtime's
//! `bert_model_generator.py`): each must fuse into one `Attention` node with the asserted
//! inputs and attributes, or must not fuse, with the asserted reason.

use attnrt_fusion::{fuse, structure_text, Fused, FusionOptions};
use attnrt_onnx::proto::tensor_shape_proto::{dimension, Dimension};
use attnrt_onnx::proto::{type_proto, TensorShapeProto, TypeProto};
use attnrt_onnx::{
    attr, tensor, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    ValueInfoProto,
};
use prost::Message;

/// A tiny graph builder: inputs with symbolic or static dims, initializers, nodes with
/// generated output names.
#[derive(Default)]
struct Builder {
    g: GraphProto,
    count: usize,
}

fn vi(name: &str, dims: &[&str]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d.parse::<i64>() {
                Ok(v) => dimension::Value::DimValue(v),
                Err(_) => dimension::Value::DimParam(d.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: attnrt_onnx::DataType::Float as i32,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl Builder {
    fn input(&mut self, name: &str, dims: &[&str]) -> String {
        self.g.input.push(vi(name, dims));
        name.to_string()
    }
    fn bool_input(&mut self, name: &str, dims: &[&str]) -> String {
        let mut v = vi(name, dims);
        if let Some(type_proto::Value::TensorType(t)) =
            v.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            t.elem_type = attnrt_onnx::DataType::Bool as i32;
        }
        self.g.input.push(v);
        name.to_string()
    }
    fn f32(&mut self, dims: &[i64], values: &[f32]) -> String {
        self.count += 1;
        let name = format!("c{}", self.count);
        self.g
            .initializer
            .push(tensor::from_f32(&name, dims, values));
        name
    }
    fn weight(&mut self, rows: i64, cols: i64) -> String {
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 500.0)
            .collect();
        self.f32(&[rows, cols], &vals)
    }
    fn i64s(&mut self, values: &[i64]) -> String {
        self.count += 1;
        let name = format!("c{}", self.count);
        self.g
            .initializer
            .push(tensor::from_i64(&name, &[values.len() as i64], values));
        name
    }
    fn op(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        self.count += 1;
        let out = format!("t{}", self.count);
        self.g.node.push(NodeProto {
            name: format!("{op}_{}", self.count),
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.clone()],
            attribute: attrs,
            ..Default::default()
        });
        out
    }
    fn transpose(&mut self, x: &str, perm: &[i64]) -> String {
        self.op("Transpose", &[x], vec![attr::make_ints("perm", perm)])
    }
    fn reshape(&mut self, x: &str, target: &[i64]) -> String {
        let t = self.i64s(target);
        self.op("Reshape", &[x, &t], vec![])
    }
    fn output(&mut self, name: &str, dims: &[&str]) {
        self.g.output.push(vi(name, dims));
    }
    fn model(self, opset: i64) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            graph: Some(self.g),
            ..Default::default()
        }
    }
}

/// The exporter variants a test can switch on.
#[derive(Clone)]
struct Cfg {
    scale: Scale,
    k_twice: bool,
    mask: Mask,
    softmax_axis: i64,
    merge_perm: Vec<i64>,
    kv_heads: i64,
    cross: bool,
    scores_used_elsewhere: bool,
    probs_is_output: bool,
}

#[derive(Clone)]
enum Scale {
    Div(f32),
    Mul(f32),
    None,
    Split(f32),
    Input,
}

#[derive(Clone)]
enum Mask {
    None,
    Add(Vec<&'static str>),
    Fill(f32),
}

impl Default for Cfg {
    fn default() -> Self {
        Cfg {
            scale: Scale::Div(4.0),
            k_twice: false,
            mask: Mask::None,
            softmax_axis: -1,
            merge_perm: vec![0, 2, 1, 3],
            kv_heads: 4,
            cross: false,
            scores_used_elsewhere: false,
            probs_is_output: false,
        }
    }
}

/// Hand-written MHA as TorchScript exports it: d_model 64, 4 heads of 16, dynamic B and L.
fn mha(cfg: &Cfg) -> ModelProto {
    let mut b = Builder::default();
    // GQA's repeat targets are constants here, so its batch and length are static.
    let x = if cfg.kv_heads != 4 {
        b.input("x", &["2", "5", "64"])
    } else {
        b.input("x", &["B", "L", "64"])
    };
    let kv_src = if cfg.cross {
        b.input("y", &["B", "S", "64"])
    } else {
        x.clone()
    };
    let kv_dim = cfg.kv_heads * 16;
    let (wq, wk, wv) = (b.weight(64, 64), b.weight(64, kv_dim), b.weight(64, kv_dim));
    let q = b.op("MatMul", &[&x, &wq], vec![]);
    let k = b.op("MatMul", &[&kv_src, &wk], vec![]);
    let v = b.op("MatMul", &[&kv_src, &wv], vec![]);
    let q = b.reshape(&q, &[0, -1, 4, 16]);
    let mut q4 = b.transpose(&q, &[0, 2, 1, 3]);
    let k = b.reshape(&k, &[0, -1, cfg.kv_heads, 16]);
    let v = b.reshape(&v, &[0, -1, cfg.kv_heads, 16]);
    let mut v4 = b.transpose(&v, &[0, 2, 1, 3]);
    let mut kt = if cfg.k_twice {
        let k4 = b.transpose(&k, &[0, 2, 1, 3]);
        b.transpose(&k4, &[0, 1, 3, 2])
    } else {
        b.transpose(&k, &[0, 2, 3, 1])
    };
    if cfg.kv_heads != 4 {
        // LLaMA repeat_kv: Unsqueeze → Expand → Reshape, on Kᵀ's source and on V. Static
        // B=2, L=5 here so the targets can be constants.
        let rep = 4 / cfg.kv_heads;
        let ax = b.i64s(&[2]);
        let k4 = b.transpose(&k, &[0, 2, 1, 3]);
        let ku = b.op("Unsqueeze", &[&k4, &ax], vec![]);
        let shape = b.i64s(&[2, cfg.kv_heads, rep, 5, 16]);
        let ke = b.op("Expand", &[&ku, &shape], vec![]);
        let kr = b.reshape(&ke, &[2, 4, 5, 16]);
        kt = b.transpose(&kr, &[0, 1, 3, 2]);
        let vu = b.op("Unsqueeze", &[&v4, &ax], vec![]);
        let ve = b.op("Expand", &[&vu, &shape], vec![]);
        v4 = b.reshape(&ve, &[2, 4, 5, 16]);
    }
    if let Scale::Split(s) = cfg.scale {
        let c = b.f32(&[], &[s]);
        q4 = b.op("Mul", &[&q4, &c], vec![]);
        kt = b.op("Mul", &[&kt, &c], vec![]);
    }
    let mut s = b.op("MatMul", &[&q4, &kt], vec![]);
    let scores = s.clone();
    match cfg.scale {
        Scale::Div(d) => {
            let c = b.f32(&[], &[d]);
            s = b.op("Div", &[&s, &c], vec![]);
        }
        Scale::Mul(m) => {
            let c = b.f32(&[], &[m]);
            s = b.op("Mul", &[&c, &s], vec![]);
        }
        Scale::Input => {
            let c = b.input("temperature", &[]);
            s = b.op("Div", &[&s, &c], vec![]);
        }
        Scale::None | Scale::Split(_) => {}
    }
    match &cfg.mask {
        Mask::None => {}
        Mask::Add(dims) => {
            let m = b.input("mask", dims);
            s = b.op("Add", &[&s, &m], vec![]);
        }
        Mask::Fill(f) => {
            let m = b.bool_input("pad", &["B", "1", "1", "L"]);
            let c = b.f32(&[], &[*f]);
            s = b.op("Where", &[&m, &c, &s], vec![]);
        }
    }
    let p = b.op(
        "Softmax",
        &[&s],
        vec![attr::make_int("axis", cfg.softmax_axis)],
    );
    let ctx = b.op("MatMul", &[&p, &v4], vec![]);
    let t = b.transpose(&ctx, &cfg.merge_perm);
    let out = b.reshape(&t, &[0, -1, 64]);
    let out_name = out.clone();
    b.output(&out_name, &["B", "L", "64"]);
    if cfg.scores_used_elsewhere {
        let e = b.op("Identity", &[&scores], vec![]);
        b.output(&e, &["B", "4", "L", "L"]);
    }
    if cfg.probs_is_output {
        b.output(&p, &["B", "4", "L", "L"]);
    }
    b.model(17)
}

fn run(cfg: &Cfg) -> Fused {
    let m = mha(cfg);
    attnrt_onnx::validate_model(&m).expect("test graph valid");
    let f = fuse(&m, &FusionOptions::default()).expect("fuse");
    attnrt_onnx::validate_model(&f.model).expect("fused graph valid");
    let again = fuse(&m, &FusionOptions::default()).unwrap();
    assert_eq!(
        f.model.encode_to_vec(),
        again.model.encode_to_vec(),
        "deterministic"
    );
    f
}

fn attention(f: &Fused) -> &NodeProto {
    let g = f.model.graph.as_ref().unwrap();
    let nodes: Vec<&NodeProto> = g.node.iter().filter(|n| n.op_type == "Attention").collect();
    assert_eq!(
        nodes.len(),
        1,
        "one Attention node expected:\n{}",
        structure_text(&f.model)
    );
    nodes[0]
}

fn int_attr(n: &NodeProto, name: &str) -> Option<i64> {
    attr::int(n, name).unwrap()
}

fn scale_attr(n: &NodeProto) -> Option<f32> {
    attr::float(n, "scale").unwrap()
}

/// The producer of the fused node's mask input, looking through the Expand that makes the
/// mask's last two axes [Lq, Lk] for ONNX Runtime.
fn mask_producer<'a>(f: &'a Fused, n: &NodeProto) -> Option<&'a NodeProto> {
    let g = f.model.graph.as_ref().unwrap();
    let p = g.node.iter().find(|m| m.output.contains(&n.input[3]))?;
    if p.op_type == "Expand" {
        return g.node.iter().find(|m| m.output.contains(&p.input[0]));
    }
    Some(p)
}

/// The mask tensor feeding the fused node, looking through the Expand.
fn mask_tensor(f: &Fused, n: &NodeProto) -> String {
    let g = f.model.graph.as_ref().unwrap();
    match g.node.iter().find(|m| m.output.contains(&n.input[3])) {
        Some(p) if p.op_type == "Expand" => p.input[0].clone(),
        _ => n.input[3].clone(),
    }
}

fn fused_one(cfg: &Cfg) -> (Fused, NodeProto) {
    let f = run(cfg);
    assert_eq!(f.report.blocks.len(), 1, "{:?}", f.report.explain_lines());
    let n = attention(&f).clone();
    (f, n)
}

fn not_fused(cfg: &Cfg) -> String {
    let f = run(cfg);
    assert!(
        f.report.blocks.is_empty(),
        "should not fuse:\n{}",
        structure_text(&f.model)
    );
    assert_eq!(f.report.near_misses.len(), 1);
    assert_eq!(
        f.report.opset_after, 17,
        "opset untouched when nothing fuses"
    );
    let nm = &f.report.near_misses[0];
    format!("{}: {}", nm.node, nm.reason)
}

#[test]
fn canonical_div_scale_fuses_3d() {
    let (f, n) = fused_one(&Cfg::default());
    // Q/K/V are the projections themselves: head split and merge absorbed.
    assert_eq!(n.input.len(), 3);
    let g = f.model.graph.as_ref().unwrap();
    for i in &n.input {
        let p = g.node.iter().find(|m| m.output.contains(i)).unwrap();
        assert_eq!(p.op_type, "MatMul", "input {i} should be a projection");
    }
    assert_eq!(int_attr(&n, "q_num_heads"), Some(4));
    assert_eq!(int_attr(&n, "kv_num_heads"), Some(4));
    assert_eq!(scale_attr(&n), Some(0.25));
    assert_eq!(n.output, vec![g.output[0].name.clone()]);
    assert_eq!(f.report.opset_after, 23);
    assert!(f.model.ir_version >= 11);
    // Only the projections and the fused node remain.
    assert_eq!(g.node.len(), 4, "{}", structure_text(&f.model));
    // Reshape-target initializers went with their nodes.
    assert_eq!(g.initializer.len(), 3);
    assert_eq!(f.report.blocks[0].layout, "3d");
    assert_eq!(n.name, "attnrt/Attention_0");
}

#[test]
fn mul_scale() {
    let (_, n) = fused_one(&Cfg {
        scale: Scale::Mul(0.125),
        ..Default::default()
    });
    assert_eq!(scale_attr(&n), Some(0.125));
}

#[test]
fn no_scale_sets_scale_one() {
    let (_, n) = fused_one(&Cfg {
        scale: Scale::None,
        ..Default::default()
    });
    assert_eq!(
        scale_attr(&n),
        Some(1.0),
        "the op's default is 1/sqrt(d), T5 has none"
    );
}

#[test]
fn split_scale_on_q_and_kt() {
    let (f, n) = fused_one(&Cfg {
        scale: Scale::Split(0.5),
        ..Default::default()
    });
    assert_eq!(scale_attr(&n), Some(0.25));
    assert!(!f
        .model
        .graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .any(|n| n.op_type == "Mul"));
}

#[test]
fn k_transposed_twice() {
    let (f, n) = fused_one(&Cfg {
        k_twice: true,
        ..Default::default()
    });
    assert_eq!(int_attr(&n, "q_num_heads"), Some(4));
    assert!(!f
        .model
        .graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .any(|n| n.op_type == "Transpose"));
}

#[test]
fn additive_mask_is_passed_through() {
    let (f, n) = fused_one(&Cfg {
        mask: Mask::Add(vec!["B", "1", "1", "L"]),
        ..Default::default()
    });
    assert_eq!(mask_tensor(&f, &n), "mask");
    assert_eq!(f.report.blocks[0].mask, "additive");
    assert!(f.report.blocks[0].caveats.is_empty());
}

#[test]
fn finite_fill_becomes_additive_with_caveat_and_strict_refuses() {
    let cfg = Cfg {
        mask: Mask::Fill(-1e9),
        ..Default::default()
    };
    let (f, n) = fused_one(&cfg);
    let w = mask_producer(&f, &n).unwrap();
    assert_eq!(w.op_type, "Where");
    assert_eq!(w.input[0], "pad");
    assert_eq!(f.report.blocks[0].caveats.len(), 1);
    let strict = fuse(&mha(&cfg), &FusionOptions { strict: true }).unwrap();
    assert!(strict.report.blocks.is_empty());
    assert!(strict.report.near_misses[0].reason.contains("strict"));
}

#[test]
fn neg_inf_fill_becomes_bool_mask() {
    let (f, n) = fused_one(&Cfg {
        mask: Mask::Fill(f32::NEG_INFINITY),
        ..Default::default()
    });
    let not = mask_producer(&f, &n).unwrap();
    assert_eq!(not.op_type, "Not");
    assert_eq!(not.input, vec!["pad".to_string()]);
    assert_eq!(f.report.blocks[0].mask, "bool");
}

#[test]
fn gqa_uses_kv_before_the_repeat() {
    let (f, n) = fused_one(&Cfg {
        kv_heads: 2,
        ..Default::default()
    });
    assert_eq!(
        int_attr(&n, "kv_num_heads"),
        Some(2),
        "{}",
        structure_text(&f.model)
    );
    assert_eq!(int_attr(&n, "q_num_heads"), Some(4));
    assert!(!f
        .model
        .graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .any(|n| n.op_type == "Expand"));
}

#[test]
fn cross_attention() {
    let (f, n) = fused_one(&Cfg {
        cross: true,
        ..Default::default()
    });
    let g = f.model.graph.as_ref().unwrap();
    let k_src = g
        .node
        .iter()
        .find(|m| m.output.contains(&n.input[1]))
        .unwrap();
    assert_eq!(k_src.input[0], "y");
}

#[test]
fn four_d_inputs_without_head_split() {
    let mut b = Builder::default();
    let q = b.input("q", &["B", "4", "L", "16"]);
    let k = b.input("k", &["B", "4", "S", "16"]);
    let v = b.input("v", &["B", "4", "S", "16"]);
    let kt = b.transpose(&k, &[0, 1, 3, 2]);
    let s = b.op("MatMul", &[&q, &kt], vec![]);
    let p = b.op("Softmax", &[&s], vec![attr::make_int("axis", 3)]);
    let o = b.op("MatMul", &[&p, &v], vec![]);
    b.output(&o, &["B", "4", "L", "16"]);
    let f = fuse(&b.model(17), &FusionOptions::default()).unwrap();
    let n = attention(&f);
    assert_eq!(
        n.input,
        vec!["q".to_string(), "k".into(), "v".into()],
        "Kᵀ's transpose cancels"
    );
    assert_eq!(int_attr(n, "q_num_heads"), None);
    assert_eq!(f.report.blocks[0].layout, "4d");
    assert_eq!(f.model.graph.as_ref().unwrap().node.len(), 1);
}

#[test]
fn wrong_merge_perm_keeps_4d() {
    let f = run(&Cfg {
        merge_perm: vec![0, 1, 2, 3],
        ..Default::default()
    });
    assert_eq!(f.report.blocks.len(), 1);
    assert_eq!(f.report.blocks[0].layout, "4d");
    assert!(
        f.report.blocks[0].rule.contains("Transpose[0, 2, 1, 3]"),
        "{}",
        f.report.blocks[0].rule
    );
}

#[test]
fn near_miss_softmax_on_another_axis() {
    let r = not_fused(&Cfg {
        softmax_axis: 2,
        ..Default::default()
    });
    assert!(r.contains("softmax over axis 2"), "{r}");
}

#[test]
fn near_miss_scale_not_constant() {
    let r = not_fused(&Cfg {
        scale: Scale::Input,
        ..Default::default()
    });
    assert!(
        r.contains("not a single number known before run time"),
        "{r}"
    );
}

#[test]
fn near_miss_intermediate_used_elsewhere() {
    let r = not_fused(&Cfg {
        scores_used_elsewhere: true,
        ..Default::default()
    });
    assert!(r.contains("is also used by"), "{r}");
}

#[test]
fn near_miss_intermediate_is_graph_output() {
    let r = not_fused(&Cfg {
        probs_is_output: true,
        ..Default::default()
    });
    assert!(r.contains("is a graph output"), "{r}");
}

#[test]
fn near_miss_mask_not_broadcastable() {
    let r = not_fused(&Cfg {
        mask: Mask::Add(vec!["B", "1", "L", "T"]),
        ..Default::default()
    });
    assert!(r.contains("does not broadcast"), "{r}");
}

#[test]
fn near_miss_heads_mismatch() {
    let mut b = Builder::default();
    let q = b.input("q", &["B", "4", "L", "16"]);
    let kt = b.input("kt", &["B", "3", "16", "L"]);
    let v = b.input("v", &["B", "3", "L", "16"]);
    let s = b.op("MatMul", &[&q, &kt], vec![]);
    let p = b.op("Softmax", &[&s], vec![attr::make_int("axis", -1)]);
    let o = b.op("MatMul", &[&p, &v], vec![]);
    b.output(&o, &["B", "4", "L", "16"]);
    let f = fuse(&b.model(17), &FusionOptions::default()).unwrap();
    assert!(f.report.blocks.is_empty());
    assert!(
        f.report.near_misses[0].reason.contains("heads"),
        "{:?}",
        f.report.near_misses
    );
}

#[test]
fn report_lines_and_dot() {
    let m = mha(&Cfg {
        mask: Mask::Fill(-1e9),
        ..Default::default()
    });
    let f = fuse(&m, &FusionOptions::default()).unwrap();
    let s = f.report.summary_lines();
    assert!(s[0].starts_with("attnrt/Attention_0: Softmax_"), "{s:?}");
    assert!(s.last().unwrap().contains("opset 17 → 23"));
    assert!(f
        .report
        .explain_lines()
        .iter()
        .any(|l| l.contains("caveat")));
    let dot = attnrt_fusion::block_dot(&m, &f, 0);
    assert!(dot.starts_with("digraph"));
    assert!(dot.contains("Softmax") && dot.contains("Attention"));
}
