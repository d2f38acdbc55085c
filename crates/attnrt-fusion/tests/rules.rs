//! Hand-built attention graphs, one per exporter variant (the approach of ONNX Runtime's
//! `bert_model_generator.py`): each must fuse into one `Attention` node with the asserted
//! inputs and attributes, or must not fuse, with the asserted reason.

use attnrt_fusion::{fuse, structure_text, Fused, FusionOptions};
use attnrt_onnx::{attr, AttributeProto, DataType, ModelProto, NodeProto, TensorProto};
use attnrt_testkit::{
    model, node_with_attrs, tensor_f32, tensor_i64, tensor_i64_1d, value_info, GraphBuilder,
};
use prost::Message;

/// A tiny graph builder: inputs with symbolic or static dims, initializers, nodes with
/// generated names from one counter (`c<n>` constants, `<op>_<n>` nodes, `t<n>` their
/// outputs), which the asserted reasons and node names depend on.
#[derive(Default)]
struct Builder {
    g: GraphBuilder,
}

impl Builder {
    fn input(&mut self, name: &str, dims: &[&str]) -> String {
        self.g.input(value_info(name, DataType::Float, dims))
    }
    fn bool_input(&mut self, name: &str, dims: &[&str]) -> String {
        self.g.input(value_info(name, DataType::Bool, dims))
    }
    /// An initializer named `c<n>`, made by `make` from that name.
    fn constant(&mut self, make: impl FnOnce(&str) -> TensorProto) -> String {
        let name = format!("c{}", self.g.next_id());
        self.g.initializer(make(&name))
    }
    fn f32(&mut self, dims: &[i64], values: &[f32]) -> String {
        self.constant(|name| tensor_f32(name, dims, values))
    }
    fn weight(&mut self, rows: i64, cols: i64) -> String {
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 500.0)
            .collect();
        self.f32(&[rows, cols], &vals)
    }
    fn i64s(&mut self, values: &[i64]) -> String {
        self.constant(|name| tensor_i64_1d(name, values))
    }
    fn i64_scalar(&mut self, value: i64) -> String {
        self.constant(|name| tensor_i64(name, &[], &[value]))
    }
    fn op(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        let id = self.g.next_id();
        let out = format!("t{id}");
        self.g.node(node_with_attrs(
            &format!("{op}_{id}"),
            op,
            inputs,
            &[&out],
            attrs,
        ))
    }
    fn transpose(&mut self, x: &str, perm: &[i64]) -> String {
        self.op("Transpose", &[x], vec![attr::make_ints("perm", perm)])
    }
    fn reshape(&mut self, x: &str, target: &[i64]) -> String {
        let t = self.i64s(target);
        self.op("Reshape", &[x, &t], vec![])
    }
    fn output(&mut self, name: &str, dims: &[&str]) {
        self.g.output(value_info(name, DataType::Float, dims));
    }
    /// 4-D inputs `q: q_dims`, `k`, `v: kv_dims` and `MatMul(q, Transpose[0,1,3,2](k))`;
    /// returns the scores and `v`.
    fn qk_scores_4d(&mut self, q_dims: &[&str], kv_dims: &[&str]) -> (String, String) {
        let q = self.input("q", q_dims);
        let k = self.input("k", kv_dims);
        let v = self.input("v", kv_dims);
        let kt = self.transpose(&k, &[0, 1, 3, 2]);
        (self.op("MatMul", &[&q, &kt], vec![]), v)
    }
    /// `Softmax(scores, axis) → MatMul(·, v)` as the graph output with `dims`.
    fn softmax_context(&mut self, scores: &str, axis: i64, v: &str, dims: &[&str]) {
        let p = self.op("Softmax", &[scores], vec![attr::make_int("axis", axis)]);
        let o = self.op("MatMul", &[&p, v], vec![]);
        self.output(&o, dims);
    }
    fn model(self, opset: i64) -> ModelProto {
        ModelProto {
            ir_version: 8,
            ..model(self.g.finish(), opset)
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
    /// A `Cast(to)` between the scale and the mask (ONNX expansions' softmax_precision).
    scores_cast: Option<i64>,
    /// `c · tanh(x / c)` after the scale; `true`: before the mask (as ONNX Attention does),
    /// `false`: after it.
    softcap: Option<(f32, bool)>,
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
    /// nanoGPT: `Where(Equal(Slice(tril buffer, start:L, start:L), 0), -inf, scores)`; the
    /// 8×8 buffer is 1 where `j ≤ i + diag`.
    Tril {
        start: i64,
        diag: i64,
    },
    /// transformers: `Add(scores, Where(cmp(kv_idx, q_idx) [∧ pad], 0, fill))` over
    /// `Range(0, L)` positions.
    Positions {
        cmp: &'static str,
        pad: bool,
        fill: f32,
    },
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
            scores_cast: None,
            softcap: None,
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
    if let Some(to) = cfg.scores_cast {
        s = b.op("Cast", &[&s], vec![attr::make_int("to", to)]);
    }
    if let Some((c, true)) = cfg.softcap {
        s = softcap(&mut b, &s, c);
    }
    s = mask(&mut b, &cfg.mask, &x, s);
    if let Some((c, false)) = cfg.softcap {
        s = softcap(&mut b, &s, c);
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

/// `c · tanh(x / c)`.
fn softcap(b: &mut Builder, x: &str, c: f32) -> String {
    let c = b.f32(&[], &[c]);
    let d = b.op("Div", &[x, &c], vec![]);
    let t = b.op("Tanh", &[&d], vec![]);
    b.op("Mul", &[&t, &c], vec![])
}

/// The scores `s` masked as `mask` says (positions and lengths taken from the input `x`).
fn mask(b: &mut Builder, mask: &Mask, x: &str, mut s: String) -> String {
    match mask {
        Mask::None => {}
        Mask::Tril { start, diag } => {
            let n = 8i64;
            let vals: Vec<f32> = (0..n * n)
                .map(|k| if k % n <= k / n + diag { 1.0 } else { 0.0 })
                .collect();
            let buf = b.f32(&[1, 1, n, n], &vals);
            let len = b.op(
                "Shape",
                &[x],
                vec![attr::make_int("start", 1), attr::make_int("end", 2)],
            );
            let st = b.i64s(&[*start]);
            let (ax2, ax3) = (b.i64s(&[2]), b.i64s(&[3]));
            let rows = b.op("Slice", &[&buf, &st, &len, &ax2], vec![]);
            let tri = b.op("Slice", &[&rows, &st, &len, &ax3], vec![]);
            let zero = b.f32(&[], &[0.0]);
            let cond = b.op("Equal", &[&tri, &zero], vec![]);
            let fill = b.f32(&[], &[f32::NEG_INFINITY]);
            s = b.op("Where", &[&cond, &fill, &s], vec![]);
        }
        Mask::Positions { cmp, pad, fill } => {
            let shape = b.op("Shape", &[x], vec![]);
            let one = b.i64_scalar(1);
            let len = b.op("Gather", &[&shape, &one], vec![attr::make_int("axis", 0)]);
            let zero = b.i64_scalar(0);
            let pos = b.op("Range", &[&zero, &len, &one], vec![]);
            let (ax0, ax1) = (b.i64s(&[0]), b.i64s(&[1]));
            let kv = b.op("Unsqueeze", &[&pos, &ax0], vec![]);
            let q = b.op("Unsqueeze", &[&pos, &ax1], vec![]);
            let mut cond = b.op(cmp, &[&kv, &q], vec![]);
            if *pad {
                let m = b.bool_input("pad", &["B", "1", "1", "L"]);
                cond = b.op("And", &[&cond, &m], vec![]);
            }
            let (z, f) = (b.f32(&[], &[0.0]), b.f32(&[], &[*fill]));
            let term = b.op("Where", &[&cond, &z, &f], vec![]);
            s = b.op("Add", &[&s, &term], vec![]);
        }
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
    s
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

/// Whether any node of the fused model is an `op`.
fn has_op(f: &Fused, op: &str) -> bool {
    f.model
        .graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .any(|n| n.op_type == op)
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

/// The block must not fuse, and its one near miss must say `reason`.
fn assert_not_fused_because(cfg: &Cfg, reason: &str) {
    let r = not_fused(cfg);
    assert!(r.contains(reason), "{r}");
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
    assert!(!has_op(&f, "Mul"));
}

#[test]
fn k_transposed_twice() {
    let (f, n) = fused_one(&Cfg {
        k_twice: true,
        ..Default::default()
    });
    assert_eq!(int_attr(&n, "q_num_heads"), Some(4));
    assert!(!has_op(&f, "Transpose"));
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
    let strict = fuse(
        &mha(&cfg),
        &FusionOptions {
            strict: true,
            ..Default::default()
        },
    )
    .unwrap();
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
    assert!(!has_op(&f, "Expand"));
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
    let (s, v) = b.qk_scores_4d(&["B", "4", "L", "16"], &["B", "4", "S", "16"]);
    b.softmax_context(&s, 3, &v, &["B", "4", "L", "16"]);
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
    assert_not_fused_because(
        &Cfg {
            softmax_axis: 2,
            ..Default::default()
        },
        "softmax over axis 2",
    );
}

#[test]
fn near_miss_scale_not_constant() {
    assert_not_fused_because(
        &Cfg {
            scale: Scale::Input,
            ..Default::default()
        },
        "not a single number known before run time",
    );
}

#[test]
fn near_miss_intermediate_used_elsewhere() {
    // The unscaled QK product (the Div comes after it) is none of the op's output stages.
    assert_not_fused_because(
        &Cfg {
            scores_used_elsewhere: true,
            ..Default::default()
        },
        "is also used outside the block and is not one qk_matmul_output stage",
    );
}

#[test]
fn probs_as_graph_output_become_qk_matmul_output_mode_3() {
    let (f, n) = fused_one(&Cfg {
        probs_is_output: true,
        ..Default::default()
    });
    let g = f.model.graph.as_ref().unwrap();
    let probs = &g.output[1].name;
    assert_eq!(n.output.len(), 4, "{}", structure_text(&f.model));
    assert_eq!(&n.output[3], probs);
    assert_eq!(n.output[1], "");
    assert_eq!(int_attr(&n, "qk_matmul_output_mode"), Some(3));
    assert!(f.report.blocks[0].rule.contains("qk_matmul_output=3"));
    assert!(!g.node.iter().any(|n| n.op_type == "Softmax"));
}

#[test]
fn near_miss_two_taps_on_the_scores() {
    // The probabilities and the raw product both leave the block: one output stage only.
    assert_not_fused_because(
        &Cfg {
            probs_is_output: true,
            scores_used_elsewhere: true,
            ..Default::default()
        },
        "not one qk_matmul_output stage",
    );
}

#[test]
fn near_miss_mask_not_broadcastable() {
    assert_not_fused_because(
        &Cfg {
            mask: Mask::Add(vec!["B", "1", "L", "T"]),
            ..Default::default()
        },
        "does not broadcast",
    );
}

#[test]
fn near_miss_heads_mismatch() {
    // Heads that may differ: fixed ones that do (4 against 3) would not broadcast, and the
    // model would be refused as invalid before fusion.
    let mut b = Builder::default();
    let q = b.input("q", &["B", "H", "L", "16"]);
    let kt = b.input("kt", &["B", "G", "16", "L"]);
    let v = b.input("v", &["B", "G", "L", "16"]);
    let s = b.op("MatMul", &[&q, &kt], vec![]);
    b.softmax_context(&s, -1, &v, &["B", "H", "L", "16"]);
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

fn int_attr_or_0(n: &NodeProto, name: &str) -> i64 {
    int_attr(n, name).unwrap_or(0)
}

#[test]
fn causal_from_a_constant_tril_sliced_from_zero() {
    let (f, n) = fused_one(&Cfg {
        mask: Mask::Tril { start: 0, diag: 0 },
        ..Default::default()
    });
    assert_eq!(
        int_attr(&n, "is_causal"),
        Some(1),
        "{}",
        structure_text(&f.model)
    );
    assert_eq!(n.input.len(), 3, "the triangle was the whole mask");
    let b = &f.report.blocks[0];
    assert!(b.is_causal);
    assert_eq!(b.mask, "none");
    // -inf fill, but with is_causal key 0 is always visible: no fully-masked row.
    assert!(b.caveats.is_empty(), "{:?}", b.caveats);
    let note = b.causal_note.as_deref().unwrap();
    assert!(
        note.starts_with("is_causal=1") && note.contains("8×8"),
        "{note}"
    );
    // The buffer, its slices and the comparison are gone with the mask.
    let g = f.model.graph.as_ref().unwrap();
    assert!(!g
        .node
        .iter()
        .any(|n| n.op_type == "Slice" || n.op_type == "Equal"));
    assert!(!g.initializer.iter().any(|t| t.dims == [1, 1, 8, 8]));
}

#[test]
fn near_miss_triangle_off_by_one_is_not_causal() {
    // The buffer excludes the diagonal (j < i): query 0 sees no key. A mask, never is_causal.
    let (f, n) = fused_one(&Cfg {
        mask: Mask::Tril { start: 0, diag: -1 },
        ..Default::default()
    });
    assert_eq!(int_attr_or_0(&n, "is_causal"), 0);
    assert_eq!(n.input.len(), 4, "the mask stays an input");
    let b = &f.report.blocks[0];
    assert!(!b.is_causal);
    let note = b.causal_note.as_deref().unwrap();
    assert!(
        note.starts_with("is_causal not used") && note.contains("off the causal diagonal by one"),
        "{note}"
    );
    // The same with positions: `kv < q` is off the diagonal by one.
    let (f, n) = fused_one(&Cfg {
        mask: Mask::Positions {
            cmp: "Less",
            pad: false,
            fill: f32::NEG_INFINITY,
        },
        ..Default::default()
    });
    assert_eq!(int_attr_or_0(&n, "is_causal"), 0);
    let note = f.report.blocks[0].causal_note.clone().unwrap();
    assert!(note.contains("off the causal diagonal by -1"), "{note}");
    assert!(f
        .report
        .explain_lines()
        .iter()
        .any(|l| l.contains("is_causal not used")));
}

/// 4-D attention with static L = 5 masked by `Slice(tril 8×8, start:start+5)` on both axes.
fn static_tril_block(start: i64) -> ModelProto {
    let mut b = Builder::default();
    let (s, v) = b.qk_scores_4d(&["1", "4", "5", "16"], &["1", "4", "5", "16"]);
    let n = 8i64;
    let vals: Vec<f32> = (0..n * n)
        .map(|k| if k % n <= k / n { 1.0 } else { 0.0 })
        .collect();
    let buf = b.f32(&[1, 1, n, n], &vals);
    let (starts, ends, axes) = (
        b.i64s(&[start, start]),
        b.i64s(&[start + 5, start + 5]),
        b.i64s(&[2, 3]),
    );
    let tri = b.op("Slice", &[&buf, &starts, &ends, &axes], vec![]);
    let zero = b.f32(&[], &[0.0]);
    let cond = b.op("Equal", &[&tri, &zero], vec![]);
    let fill = b.f32(&[], &[f32::NEG_INFINITY]);
    let s = b.op("Where", &[&cond, &fill, &s], vec![]);
    b.softmax_context(&s, -1, &v, &["1", "4", "5", "16"]);
    b.model(17)
}

#[test]
fn near_miss_slice_not_starting_at_zero_is_not_causal() {
    // [0:5, 0:5] of the tril is the 5×5 tril: causal.
    let f = fuse(&static_tril_block(0), &FusionOptions::default()).unwrap();
    assert_eq!(int_attr(attention(&f), "is_causal"), Some(1));
    // [1:6, 1:6] is also lower-triangular, but a block cut off the diagonal is not trusted
    // (in general it is not the causal rule): the mask stays.
    let f = fuse(&static_tril_block(1), &FusionOptions::default()).unwrap();
    let n = attention(&f);
    assert_eq!(int_attr_or_0(n, "is_causal"), 0);
    assert_eq!(n.input.len(), 4);
    let note = f.report.blocks[0].causal_note.clone().unwrap();
    assert!(note.contains("from 1"), "{note}");
}

#[test]
fn causal_from_positions_with_padding_keeps_the_padding_mask() {
    // With a -inf fill the triangle becomes is_causal and the padding stays as the mask.
    let cfg = Cfg {
        mask: Mask::Positions {
            cmp: "LessOrEqual",
            pad: true,
            fill: f32::NEG_INFINITY,
        },
        ..Default::default()
    };
    let (f, n) = fused_one(&cfg);
    assert_eq!(int_attr(&n, "is_causal"), Some(1));
    assert_eq!(n.input.len(), 4, "the padding stays as the mask");
    let g = f.model.graph.as_ref().unwrap();
    assert!(!g
        .node
        .iter()
        .any(|n| n.op_type == "Range" || n.op_type == "LessOrEqual"));
}

#[test]
fn causal_with_padding_and_a_finite_fill_keeps_the_whole_mask() {
    // transformers' finfo.min: a query row whose every visible key is padded (left padding)
    // spreads its weight over all keys in the original, future keys included; is_causal would
    // give it the visible keys only. Exact or not at all: the combined mask is fused as it is,
    // with no caveat, and the note says why is_causal was not used.
    let cfg = Cfg {
        mask: Mask::Positions {
            cmp: "LessOrEqual",
            pad: true,
            fill: f32::MIN,
        },
        ..Default::default()
    };
    for strict in [false, true] {
        let f = fuse(
            &mha(&cfg),
            &FusionOptions {
                strict,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(f.report.blocks.len(), 1);
        let b = &f.report.blocks[0];
        assert!(!b.is_causal && b.caveats.is_empty(), "{:?}", b.caveats);
        let note = b.causal_note.as_deref().unwrap();
        assert!(
            note.starts_with("is_causal not used") && note.contains("left-padded row"),
            "{note}"
        );
        let n = attention(&f);
        assert_eq!(int_attr_or_0(n, "is_causal"), 0);
        assert_eq!(n.input.len(), 4, "the combined mask is the op's mask");
    }
    // `kv > q` kept: the upper triangle (anti-causal), never is_causal.
    let (f, n) = fused_one(&Cfg {
        mask: Mask::Positions {
            cmp: "Greater",
            pad: false,
            fill: f32::NEG_INFINITY,
        },
        ..Default::default()
    });
    assert_eq!(int_attr_or_0(&n, "is_causal"), 0);
    assert!(!f.report.blocks[0].is_causal);
}

#[test]
fn same_type_cast_on_the_scores_is_accepted() {
    let (f, _) = fused_one(&Cfg {
        scores_cast: Some(DataType::Float as i64),
        ..Default::default()
    });
    assert!(
        f.report.blocks[0].rule.contains("scores-cast"),
        "{}",
        f.report.blocks[0].rule
    );
    assert!(!has_op(&f, "Cast"));
}

#[test]
fn near_miss_type_changing_cast_on_the_scores() {
    assert_not_fused_because(
        &Cfg {
            scores_cast: Some(DataType::Float16 as i64),
            ..Default::default()
        },
        "not provably the identity (casts float to float16)",
    );
}

#[test]
fn softcap_before_the_mask_becomes_the_attribute() {
    let (f, n) = fused_one(&Cfg {
        softcap: Some((30.0, true)),
        mask: Mask::Add(vec!["B", "1", "1", "L"]),
        ..Default::default()
    });
    assert_eq!(attr::float(&n, "softcap").unwrap(), Some(30.0));
    assert_eq!(scale_attr(&n), Some(0.25));
    assert_eq!(f.report.blocks[0].softcap, Some(30.0));
    assert!(!has_op(&f, "Tanh"));
}

#[test]
fn near_miss_softcap_after_the_mask() {
    // ONNX Attention caps before masking (a capped -inf would leak weight): not expressible.
    assert_not_fused_because(
        &Cfg {
            softcap: Some((30.0, false)),
            mask: Mask::Add(vec!["B", "1", "1", "L"]),
            ..Default::default()
        },
        "a mask applied before the softcap",
    );
}

#[test]
fn all_zero_additive_mask_is_dropped() {
    // transformers' bidirectional mask with nothing to mask: Where(kv >= 0, 0, finfo.min)
    // over constants only, as ViT exports it, folds to zeros.
    let mut b = Builder::default();
    let (s, v) = b.qk_scores_4d(&["B", "4", "5", "16"], &["B", "4", "5", "16"]);
    // int32_data rather than raw_data: bools as some exporters store them.
    let ones = b.constant(|name| TensorProto {
        name: name.into(),
        dims: vec![1, 1, 5, 1],
        data_type: DataType::Bool as i32,
        int32_data: vec![1; 5],
        ..Default::default()
    });
    let (z, fmin) = (b.f32(&[], &[0.0]), b.f32(&[], &[f32::MIN]));
    let term = b.op("Where", &[&ones, &z, &fmin], vec![]);
    let s = b.op("Add", &[&s, &term], vec![]);
    b.softmax_context(&s, -1, &v, &["B", "4", "5", "16"]);
    let f = fuse(&b.model(17), &FusionOptions::default()).unwrap();
    let n = attention(&f);
    assert_eq!(n.input.len(), 3, "{}", structure_text(&f.model));
    assert_eq!(f.report.blocks[0].mask, "none");
    assert!(f.report.blocks[0].rule.contains("zero-mask-dropped"));
}

#[test]
fn causal_triangle_with_a_weak_fill_stays_a_mask() {
    // -1e9 leaves masked keys a weight when scores are huge: not provably is_causal.
    let (f, n) = fused_one(&Cfg {
        mask: Mask::Positions {
            cmp: "LessOrEqual",
            pad: false,
            fill: -1e9,
        },
        ..Default::default()
    });
    assert_eq!(int_attr_or_0(&n, "is_causal"), 0);
    let note = f.report.blocks[0].causal_note.clone().unwrap();
    assert!(
        note.contains("-1e9") && note.contains("not 0 and -inf"),
        "{note}"
    );
}
