//! ONNX graphs built in Rust for the benchmarks (so nothing large is committed): the attention
//! core as one `Attention` node or as the decomposed chain, a single MHA layer written the way
//! the TorchScript exporter writes one, and a small BERT-shaped encoder.
//!
//! Weights are seeded uniform noise: timings do not depend on the values, and the numeric
//! comparisons between the fused and unfused paths need attention that is not uniform.

use anyhow::{ensure, Result};
use attnrt_onnx::attr::{make_float, make_int, make_ints};
use attnrt_onnx::{AttributeProto, DataType, ModelProto};
use attnrt_testkit::{node_with_attrs, tensor_f32, tensor_i64_1d, value_info};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The symbolic sequence dimension of every graph here, bound when a session is built.
pub const SEQ: &str = "sequence";

/// One dimension of a graph input or output: `Dim::Fixed(extent)` or `Dim::Sym(name)`.
pub type Dim = attnrt_testkit::Dim<'static>;

/// `n` uniform values in `[-bound, bound]` from a seeded generator.
pub fn seeded_values(seed: u64, n: usize, bound: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-bound..=bound)).collect()
}

/// A small builder for one ONNX graph: nodes get unique names and outputs, weights are seeded.
#[derive(Default)]
pub struct GraphBuilder {
    graph: attnrt_testkit::GraphBuilder,
    seed: u64,
}

impl GraphBuilder {
    /// An empty graph whose weights will be drawn from `seed`.
    pub fn new(name: &str, seed: u64) -> Self {
        GraphBuilder {
            graph: attnrt_testkit::GraphBuilder::new(name),
            seed,
        }
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, elem: DataType, dims: &[Dim]) -> String {
        self.graph.input(value_info(name, elem, dims))
    }

    /// Declares `value` as a graph output (renaming is not needed: it is any produced tensor).
    pub fn output(&mut self, value: &str, elem: DataType, dims: &[Dim]) {
        self.graph.output(value_info(value, elem, dims));
    }

    /// A float initializer with the given values.
    pub fn constant_f32(&mut self, name: &str, dims: &[i64], values: &[f32]) -> String {
        self.graph.initializer(tensor_f32(name, dims, values))
    }

    /// An int64 initializer (reshape targets).
    pub fn constant_i64(&mut self, name: &str, values: &[i64]) -> String {
        self.graph.initializer(tensor_i64_1d(name, values))
    }

    /// A seeded random weight of shape `dims`, uniform in `±bound`.
    pub fn weight(&mut self, name: &str, dims: &[i64], bound: f32) -> String {
        let n = dims.iter().product::<i64>() as usize;
        self.seed = self.seed.wrapping_add(1);
        let values = seeded_values(self.seed, n, bound);
        self.constant_f32(name, dims, &values)
    }

    /// Adds a node with one output and returns the output's name.
    pub fn node(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        // Nodes are numbered from 0 (`MatMul_0`); the testkit's ids start at 1.
        let name = format!("{op}_{}", self.graph.next_id() - 1);
        let out = format!("{name}_out");
        self.graph
            .node(node_with_attrs(&name, op, inputs, &[&out], attrs))
    }

    /// The model, importing the default domain at `opset`.
    pub fn finish(self, opset: i64) -> ModelProto {
        ModelProto {
            producer_name: "attnrt-benches".into(),
            ..self.graph.into_model(opset)
        }
    }
}

/// Shape of an attention problem with `B = 1` and a symbolic sequence length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Number of heads.
    pub heads: usize,
    /// Size of one head.
    pub head_dim: usize,
}

impl AttentionShape {
    /// `heads · head_dim`.
    pub fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    fn check(&self) -> Result<()> {
        ensure!(
            self.heads > 0 && self.head_dim > 0,
            "attention shape {self:?} must have heads and head size > 0"
        );
        Ok(())
    }

    /// The `[1, H, L, D]` dims of the 4-D layout.
    pub fn dims_4d(&self) -> [Dim; 4] {
        [
            Dim::Fixed(1),
            Dim::Fixed(self.heads as i64),
            Dim::Sym(SEQ),
            Dim::Fixed(self.head_dim as i64),
        ]
    }

    /// The `[1, L, H·D]` dims of the 3-D layout.
    pub fn dims_3d(&self) -> [Dim; 3] {
        [
            Dim::Fixed(1),
            Dim::Sym(SEQ),
            Dim::Fixed(self.hidden() as i64),
        ]
    }
}

/// Layout of Q/K/V in the attention-core graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreLayout {
    /// `[B, H, L, D]` inputs and output.
    FourD,
    /// `[B, L, H·D]` inputs and output (the head split/merge is part of the graph).
    ThreeD,
}

/// The attention core as one ONNX `Attention` node (opset 23), inputs `q`, `k`, `v`, output `y`,
/// no mask, default scale `1/√D`.
pub fn attention_op_model(shape: AttentionShape, layout: CoreLayout) -> Result<ModelProto> {
    shape.check()?;
    let mut g = GraphBuilder::new("attention_core_fused", 1);
    let dims: Vec<Dim> = match layout {
        CoreLayout::FourD => shape.dims_4d().to_vec(),
        CoreLayout::ThreeD => shape.dims_3d().to_vec(),
    };
    for name in ["q", "k", "v"] {
        g.input(name, DataType::Float, &dims);
    }
    let attrs = match layout {
        CoreLayout::FourD => vec![],
        CoreLayout::ThreeD => vec![
            make_int("q_num_heads", shape.heads as i64),
            make_int("kv_num_heads", shape.heads as i64),
        ],
    };
    let y = g.node("Attention", &["q", "k", "v"], attrs);
    g.output(&y, DataType::Float, &dims);
    Ok(g.finish(23))
}

/// Shape of one decode step of attention with a key/value cache, `B = 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (`q_heads` a multiple of it: grouped-query attention).
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
}

/// The symbolic past length of [`attention_decode_model`].
pub const PAST: &str = "past";

/// One decode step as a single ONNX `Attention` node (opset 23, 4-D layout): inputs `q`
/// `[1, Hq, 1, D]`, `k`/`v` `[1, Hkv, 1, D]`, `past_key`/`past_value` `[1, Hkv, past, D]`;
/// outputs `y`, `present_key`, `present_value` (`past + 1` keys). No mask, default scale.
pub fn attention_decode_model(shape: DecodeShape) -> Result<ModelProto> {
    let DecodeShape {
        q_heads,
        kv_heads,
        head_dim,
    } = shape;
    ensure!(
        kv_heads > 0 && head_dim > 0 && q_heads % kv_heads == 0,
        "decode shape {shape:?} needs kv heads and head size > 0 and q heads a multiple of kv heads"
    );
    let mut g = GraphBuilder::new("attention_decode", 1);
    let (hq, hkv, d) = (q_heads as i64, kv_heads as i64, head_dim as i64);
    let one = Dim::Fixed(1);
    g.input(
        "q",
        DataType::Float,
        &[one, Dim::Fixed(hq), one, Dim::Fixed(d)],
    );
    for name in ["k", "v"] {
        g.input(
            name,
            DataType::Float,
            &[one, Dim::Fixed(hkv), one, Dim::Fixed(d)],
        );
    }
    let past = [one, Dim::Fixed(hkv), Dim::Sym(PAST), Dim::Fixed(d)];
    for name in ["past_key", "past_value"] {
        g.input(name, DataType::Float, &past);
    }
    let outputs = ["y", "present_key", "present_value"];
    g.graph.node(node_with_attrs(
        "Attention_0",
        "Attention",
        &["q", "k", "v", "", "past_key", "past_value"],
        &outputs,
        vec![],
    ));
    g.output(
        "y",
        DataType::Float,
        &[one, Dim::Fixed(hq), one, Dim::Fixed(d)],
    );
    let present = [one, Dim::Fixed(hkv), Dim::Sym("total"), Dim::Fixed(d)];
    for name in &outputs[1..] {
        g.output(name, DataType::Float, &present);
    }
    Ok(g.finish(23))
}

/// The same attention decomposed as PyTorch exports it: `MatMul(Q, Kᵀ) → Mul(1/√D) → Softmax →
/// MatMul(·, V)`; in the 3-D layout with the `Reshape → Transpose` head split before and the
/// `Transpose → Reshape` head merge after. Opset 17 (what the TorchScript exporter writes).
pub fn attention_chain_model(shape: AttentionShape, layout: CoreLayout) -> Result<ModelProto> {
    shape.check()?;
    let (h, d) = (shape.heads as i64, shape.head_dim as i64);
    let mut g = GraphBuilder::new("attention_core_unfused", 1);
    let scale = g.constant_f32("scale", &[], &[1.0 / (d as f32).sqrt()]);
    let (q, kt, v, dims) = match layout {
        CoreLayout::FourD => {
            let dims = shape.dims_4d().to_vec();
            for name in ["q", "k", "v"] {
                g.input(name, DataType::Float, &dims);
            }
            let kt = g.node("Transpose", &["k"], vec![make_ints("perm", &[0, 1, 3, 2])]);
            ("q".to_string(), kt, "v".to_string(), dims)
        }
        CoreLayout::ThreeD => {
            let dims = shape.dims_3d().to_vec();
            for name in ["q", "k", "v"] {
                g.input(name, DataType::Float, &dims);
            }
            let split = g.constant_i64("head_split", &[0, -1, h, d]);
            let (q, kt, v) = head_split(&mut g, "q", "k", "v", &split);
            (q, kt, v, dims)
        }
    };
    let context = attention_scores_context(&mut g, &q, &kt, &v, &scale, None);
    let y = match layout {
        CoreLayout::FourD => context,
        CoreLayout::ThreeD => {
            let merge = g.constant_i64("head_merge", &[0, -1, h * d]);
            head_merge(&mut g, &context, &merge)
        }
    };
    g.output(&y, DataType::Float, &dims);
    Ok(g.finish(17))
}

/// `Reshape → Transpose` of Q, K, V into heads; K is transposed to `[B, H, D, L]` in one
/// `Transpose[0,2,3,1]` as the TorchScript exporter merges it.
fn head_split(
    g: &mut GraphBuilder,
    q: &str,
    k: &str,
    v: &str,
    split: &str,
) -> (String, String, String) {
    let perm_qv = || vec![make_ints("perm", &[0, 2, 1, 3])];
    let qr = g.node("Reshape", &[q, split], vec![]);
    let q = g.node("Transpose", &[&qr], perm_qv());
    let kr = g.node("Reshape", &[k, split], vec![]);
    let kt = g.node("Transpose", &[&kr], vec![make_ints("perm", &[0, 2, 3, 1])]);
    let vr = g.node("Reshape", &[v, split], vec![]);
    let v = g.node("Transpose", &[&vr], perm_qv());
    (q, kt, v)
}

/// `Transpose[0,2,1,3] → Reshape [B, L, H·D]`.
fn head_merge(g: &mut GraphBuilder, context: &str, merge: &str) -> String {
    let t = g.node(
        "Transpose",
        &[context],
        vec![make_ints("perm", &[0, 2, 1, 3])],
    );
    g.node("Reshape", &[&t, merge], vec![])
}

/// `MatMul(Q, Kᵀ) → Mul(scale) → [Add(bias)] → Softmax(-1) → MatMul(·, V)`.
fn attention_scores_context(
    g: &mut GraphBuilder,
    q: &str,
    kt: &str,
    v: &str,
    scale: &str,
    bias: Option<&str>,
) -> String {
    let s = g.node("MatMul", &[q, kt], vec![]);
    let mut s = g.node("Mul", &[&s, scale], vec![]);
    if let Some(b) = bias {
        s = g.node("Add", &[&s, b], vec![]);
    }
    let p = g.node("Softmax", &[&s], vec![make_int("axis", -1)]);
    g.node("MatMul", &[&p, v], vec![])
}

/// `MatMul(x, W) + b` with a seeded `[d_in, d_out]` weight and `[d_out]` bias.
fn linear(g: &mut GraphBuilder, x: &str, name: &str, d_in: usize, d_out: usize) -> String {
    let bound = 1.0 / (d_in as f32).sqrt();
    let w = g.weight(
        &format!("{name}.weight"),
        &[d_in as i64, d_out as i64],
        bound,
    );
    let b = g.weight(&format!("{name}.bias"), &[d_out as i64], bound);
    let y = g.node("MatMul", &[x, &w], vec![]);
    g.node("Add", &[&y, &b], vec![])
}

/// One self-attention block (Q/K/V projections with bias, attention, output projection) on
/// `x: [B, L, d_model]`, written as the TorchScript exporter writes `nn.Module` attention.
fn mha_block(
    g: &mut GraphBuilder,
    x: &str,
    prefix: &str,
    shape: AttentionShape,
    bias: Option<&str>,
) -> String {
    let (h, d) = (shape.heads as i64, shape.head_dim as i64);
    let dm = shape.hidden();
    let q = linear(g, x, &format!("{prefix}.q_proj"), dm, dm);
    let k = linear(g, x, &format!("{prefix}.k_proj"), dm, dm);
    let v = linear(g, x, &format!("{prefix}.v_proj"), dm, dm);
    let split = g.constant_i64(&format!("{prefix}.head_split"), &[0, -1, h, d]);
    let (qh, kt, vh) = head_split(g, &q, &k, &v, &split);
    let scale = g.constant_f32(&format!("{prefix}.scale"), &[], &[1.0 / (d as f32).sqrt()]);
    let context = attention_scores_context(g, &qh, &kt, &vh, &scale, bias);
    let merge = g.constant_i64(&format!("{prefix}.head_merge"), &[0, -1, h * d]);
    let merged = head_merge(g, &context, &merge);
    linear(g, &merged, &format!("{prefix}.out_proj"), dm, dm)
}

/// A single multi-head-attention layer: input `x: [1, L, d_model]`, output `[1, L, d_model]`,
/// Q/K/V/out projections with bias, scale `1/√head_dim`, no mask. Unfused, opset 17; fuse it
/// with `attnrt_fusion::fuse` for the fused path.
pub fn mha_layer_model(shape: AttentionShape, seed: u64) -> Result<ModelProto> {
    shape.check()?;
    let mut g = GraphBuilder::new("mha_layer", seed);
    let dims = shape.dims_3d();
    g.input("x", DataType::Float, &dims);
    let y = mha_block(&mut g, "x", "attn", shape, None);
    g.output(&y, DataType::Float, &dims);
    Ok(g.finish(17))
}

/// `LayerNormalization` over the last axis with seeded scale and bias near 1 and 0.
fn layer_norm(g: &mut GraphBuilder, x: &str, name: &str, d: usize) -> String {
    let gamma: Vec<f32> = seeded_values(g.seed.wrapping_add(1000), d, 0.05)
        .iter()
        .map(|v| 1.0 + v)
        .collect();
    let gamma = g.constant_f32(&format!("{name}.weight"), &[d as i64], &gamma);
    let beta = g.weight(&format!("{name}.bias"), &[d as i64], 0.05);
    g.node(
        "LayerNormalization",
        &[x, &gamma, &beta],
        vec![make_int("axis", -1), make_float("epsilon", 1e-12)],
    )
}

/// GELU as exported from PyTorch: `0.5·x·(1 + erf(x/√2))`.
fn gelu(g: &mut GraphBuilder, x: &str, name: &str) -> String {
    let inv_sqrt2 = g.constant_f32(
        &format!("{name}.inv_sqrt2"),
        &[],
        &[std::f32::consts::FRAC_1_SQRT_2],
    );
    let one = g.constant_f32(&format!("{name}.one"), &[], &[1.0]);
    let half = g.constant_f32(&format!("{name}.half"), &[], &[0.5]);
    let t = g.node("Mul", &[x, &inv_sqrt2], vec![]);
    let t = g.node("Erf", &[&t], vec![]);
    let t = g.node("Add", &[&t, &one], vec![]);
    let t = g.node("Mul", &[x, &t], vec![]);
    g.node("Mul", &[&t, &half], vec![])
}

/// Sizes of the BERT-shaped encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncoderShape {
    /// Attention heads and head size (`d_model = heads · head_dim`).
    pub attention: AttentionShape,
    /// Number of encoder layers.
    pub layers: usize,
    /// Feed-forward inner size.
    pub ffn: usize,
}

/// A BERT-shaped encoder (post-LayerNorm, GELU feed-forward) on `x: [1, L, d_model]` with an
/// additive padding bias `mask_bias: [1, 1, 1, L]` (BERT's `(1 − mask)·−10000`, given as input),
/// output `[1, L, d_model]`. Embeddings are left out: they cost nothing next to the layers.
pub fn bert_encoder_model(shape: EncoderShape, seed: u64) -> Result<ModelProto> {
    shape.attention.check()?;
    ensure!(
        shape.layers > 0 && shape.ffn > 0,
        "encoder shape {shape:?} needs layers and ffn > 0"
    );
    let dm = shape.attention.hidden();
    let mut g = GraphBuilder::new("bert_encoder", seed);
    let dims = shape.attention.dims_3d();
    g.input("x", DataType::Float, &dims);
    g.input(
        "mask_bias",
        DataType::Float,
        &[Dim::Fixed(1), Dim::Fixed(1), Dim::Fixed(1), Dim::Sym(SEQ)],
    );
    let mut h = "x".to_string();
    for layer in 0..shape.layers {
        let p = format!("layer.{layer}");
        let a = mha_block(
            &mut g,
            &h,
            &format!("{p}.attention"),
            shape.attention,
            Some("mask_bias"),
        );
        let r = g.node("Add", &[&h, &a], vec![]);
        h = layer_norm(&mut g, &r, &format!("{p}.attention.norm"), dm);
        let f = linear(&mut g, &h, &format!("{p}.intermediate"), dm, shape.ffn);
        let f = gelu(&mut g, &f, &format!("{p}.gelu"));
        let f = linear(&mut g, &f, &format!("{p}.output"), shape.ffn, dm);
        let r = g.node("Add", &[&h, &f], vec![]);
        h = layer_norm(&mut g, &r, &format!("{p}.output.norm"), dm);
    }
    g.output(&h, DataType::Float, &dims);
    Ok(g.finish(17))
}
