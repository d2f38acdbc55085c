//! The `Attention` op (opset 23) run through tract with attnrt's parser, against an independent
//! f64 implementation of the ONNX reference written here (`onnx/reference/ops/op_attention.py`).

use attnrt_onnx::{attr, DataType, ModelProto};
use attnrt_runtime::{NamedTensor, Session, Tensor, Threads};
use attnrt_testkit::{model, node_with_attrs, value_info, GraphBuilder};
use ndarray::ArrayD;

/// A model with one Attention node; `inputs`/`outputs` are (name, type, symbolic dims) with
/// "" for an unwired slot.
fn attention_model(
    inputs: &[(&str, DataType, Vec<&str>)],
    outputs: &[(&str, Vec<&str>)],
    attrs: Vec<attnrt_onnx::AttributeProto>,
    elem: DataType,
) -> ModelProto {
    let ins: Vec<&str> = inputs.iter().map(|(n, _, _)| *n).collect();
    let outs: Vec<&str> = outputs.iter().map(|(n, _)| *n).collect();
    let mut g = GraphBuilder::new("g");
    g.node(node_with_attrs("attn", "Attention", &ins, &outs, attrs));
    for (n, t, d) in inputs.iter().filter(|(n, _, _)| !n.is_empty()) {
        g.input(value_info(n, *t, d));
    }
    for (n, d) in outputs.iter().filter(|(n, _)| !n.is_empty()) {
        g.output(value_info(n, elem, d));
    }
    ModelProto {
        ir_version: 10,
        ..model(g.finish(), 23)
    }
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::from(ArrayD::from_shape_vec(shape.to_vec(), data).unwrap())
}

fn named(name: &str, t: Tensor) -> NamedTensor {
    NamedTensor {
        name: name.into(),
        tensor: t,
    }
}

fn as_f32(t: &Tensor) -> Vec<f32> {
    t.cast_to::<f32>()
        .unwrap()
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .copied()
        .collect()
}

struct Case {
    /// [B, Hq, Lq, D] etc. in 4-D terms.
    b: usize,
    hq: usize,
    hkv: usize,
    lq: usize,
    lk: usize,
    past: usize,
    d: usize,
    dv: usize,
    scale: Option<f32>,
    causal: bool,
    softcap: f32,
    /// Mask of shape [?, ?, Lq, Lk_total] (4-D, leading dims 1 or full), bool or additive.
    mask: Option<(Vec<usize>, MaskValues)>,
}

enum MaskValues {
    Bool(Vec<bool>),
    Float(Vec<f32>),
}

/// ONNX reference in f64, on 4-D contiguous inputs. Returns (Y [B,Hq,Lq,Dv], scores at mode 3).
fn reference(c: &Case, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let total = c.past + c.lk;
    let scale = c
        .scale
        .map(|s| s as f64)
        .unwrap_or(1.0 / (c.d as f64).sqrt());
    let group = c.hq / c.hkv;
    let mut y = vec![0f64; c.b * c.hq * c.lq * c.dv];
    let mut probs = vec![0f64; c.b * c.hq * c.lq * total];
    for b in 0..c.b {
        for h in 0..c.hq {
            let kh = h / group;
            for i in 0..c.lq {
                let mut bias = vec![0f64; total];
                let mut s = vec![0f64; total];
                for j in 0..total {
                    let mut dot = 0f64;
                    for e in 0..c.d {
                        dot += q[((b * c.hq + h) * c.lq + i) * c.d + e] as f64
                            * k[((b * c.hkv + kh) * total + j) * c.d + e] as f64;
                    }
                    let mut x = dot * scale;
                    if c.softcap > 0.0 {
                        x = c.softcap as f64 * (x / c.softcap as f64).tanh();
                    }
                    if let Some((shape, m)) = &c.mask {
                        let idx = [b, h, i, j];
                        let mut off = 0;
                        for a in 0..4 {
                            off = off * shape[a] + if shape[a] == 1 { 0 } else { idx[a] };
                        }
                        bias[j] += match m {
                            MaskValues::Bool(m) => {
                                if m[off] {
                                    0.0
                                } else {
                                    f64::NEG_INFINITY
                                }
                            }
                            MaskValues::Float(m) => m[off] as f64,
                        };
                    }
                    if c.causal && j > i + c.past {
                        bias[j] = f64::NEG_INFINITY;
                    }
                    s[j] = x + bias[j];
                }
                let all_masked = bias.iter().all(|x| *x == f64::NEG_INFINITY);
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s
                    .iter()
                    .map(|x| if all_masked { 0.0 } else { (x - mx).exp() })
                    .collect();
                let sum: f64 = e.iter().sum();
                for j in 0..total {
                    let p = if all_masked { 0.0 } else { e[j] / sum };
                    probs[((b * c.hq + h) * c.lq + i) * total + j] = p;
                    for f in 0..c.dv {
                        y[((b * c.hq + h) * c.lq + i) * c.dv + f] +=
                            p * v[((b * c.hkv + kh) * total + j) * c.dv + f] as f64;
                    }
                }
            }
        }
    }
    (y, probs)
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// [B, H, L, D] → [B, L, H·D].
fn to_3d(x: &[f32], b: usize, h: usize, l: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for bi in 0..b {
        for hi in 0..h {
            for li in 0..l {
                for di in 0..d {
                    out[((bi * l + li) * h + hi) * d + di] = x[((bi * h + hi) * l + li) * d + di];
                }
            }
        }
    }
    out
}

#[test]
fn gqa_3d_with_symbolic_dims_matches_reference() {
    let c = Case {
        b: 2,
        hq: 4,
        hkv: 2,
        lq: 5,
        lk: 7,
        past: 0,
        d: 8,
        dv: 6,
        scale: None,
        causal: false,
        softcap: 0.0,
        mask: None,
    };
    let q = values(c.b * c.hq * c.lq * c.d, 1);
    let k = values(c.b * c.hkv * c.lk * c.d, 2);
    let v = values(c.b * c.hkv * c.lk * c.dv, 3);
    let (y, _) = reference(&c, &q, &k, &v);
    let model = attention_model(
        &[
            ("Q", DataType::Float, vec!["batch", "q_seq", "32"]),
            ("K", DataType::Float, vec!["batch", "kv_seq", "16"]),
            ("V", DataType::Float, vec!["batch", "kv_seq", "12"]),
        ],
        &[("Y", vec!["batch", "q_seq", "24"])],
        vec![
            attr::make_int("q_num_heads", 4),
            attr::make_int("kv_num_heads", 2),
        ],
        DataType::Float,
    );
    let inputs = vec![
        named("Q", tensor(&[2, 5, 32], to_3d(&q, 2, 4, 5, 8))),
        named("K", tensor(&[2, 7, 16], to_3d(&k, 2, 2, 7, 8))),
        named("V", tensor(&[2, 7, 12], to_3d(&v, 2, 2, 7, 6))),
    ];
    let threads = Threads::new(Some(2)).unwrap();
    let s = Session::build(&model, &inputs, &threads, "test").unwrap();
    let out = s.run(&inputs).unwrap();
    assert_eq!(out[0].name, "Y");
    assert_eq!(out[0].tensor.shape(), &[2, 5, 24]);
    let want3d: Vec<f64> = {
        let y32: Vec<f32> = y.iter().map(|x| *x as f32).collect();
        to_3d(&y32, 2, 4, 5, 6).iter().map(|x| *x as f64).collect()
    };
    assert_close(&as_f32(&out[0].tensor), &want3d, 1e-5, "Y");
}

#[test]
fn causal_past_bool_mask_present_and_probabilities_4d() {
    let (b, hq, hkv, lq, lk, past, d) = (1, 2, 1, 3, 3, 2, 4);
    let total = past + lk;
    // Key 1 masked for every query: with causal+past, query 0 still sees keys 0, 2.
    let mask: Vec<bool> = (0..lq * total).map(|i| i % total != 1).collect();
    let c = Case {
        b,
        hq,
        hkv,
        lq,
        lk,
        past,
        d,
        dv: d,
        scale: Some(0.7),
        causal: true,
        softcap: 0.0,
        mask: Some((vec![1, 1, lq, total], MaskValues::Bool(mask.clone()))),
    };
    let q = values(b * hq * lq * d, 4);
    let k_new = values(b * hkv * lk * d, 5);
    let v_new = values(b * hkv * lk * d, 6);
    let pk = values(b * hkv * past * d, 7);
    let pv = values(b * hkv * past * d, 8);
    let k_all: Vec<f32> = pk.iter().chain(&k_new).copied().collect();
    let v_all: Vec<f32> = pv.iter().chain(&v_new).copied().collect();
    let (y, probs) = reference(&c, &q, &k_all, &v_all);
    let model = attention_model(
        &[
            ("Q", DataType::Float, vec!["1", "2", "3", "4"]),
            ("K", DataType::Float, vec!["1", "1", "3", "4"]),
            ("V", DataType::Float, vec!["1", "1", "3", "4"]),
            ("M", DataType::Bool, vec!["3", "5"]),
            ("PK", DataType::Float, vec!["1", "1", "2", "4"]),
            ("PV", DataType::Float, vec!["1", "1", "2", "4"]),
        ],
        &[
            ("Y", vec!["1", "2", "3", "4"]),
            ("present_key", vec!["1", "1", "5", "4"]),
            ("present_value", vec!["1", "1", "5", "4"]),
            ("qk", vec!["1", "2", "3", "5"]),
        ],
        vec![
            attr::make_int("is_causal", 1),
            attr::make_float("scale", 0.7),
            attr::make_int("qk_matmul_output_mode", 3),
        ],
        DataType::Float,
    );
    let inputs = vec![
        named("Q", tensor(&[1, 2, 3, 4], q.clone())),
        named("K", tensor(&[1, 1, 3, 4], k_new)),
        named("V", tensor(&[1, 1, 3, 4], v_new)),
        named(
            "M",
            Tensor::from(ArrayD::from_shape_vec(vec![3, 5], mask).unwrap()),
        ),
        named("PK", tensor(&[1, 1, 2, 4], pk)),
        named("PV", tensor(&[1, 1, 2, 4], pv)),
    ];
    let threads = Threads::new(Some(1)).unwrap();
    let out = Session::build(&model, &inputs, &threads, "test")
        .unwrap()
        .run(&inputs)
        .unwrap();
    assert_close(&as_f32(&out[0].tensor), &y, 1e-5, "Y");
    let k_all64: Vec<f64> = k_all.iter().map(|x| *x as f64).collect();
    let v_all64: Vec<f64> = v_all.iter().map(|x| *x as f64).collect();
    assert_close(&as_f32(&out[1].tensor), &k_all64, 0.0, "present_key");
    assert_close(&as_f32(&out[2].tensor), &v_all64, 0.0, "present_value");
    assert_eq!(out[3].tensor.shape(), &[1, 2, 3, 5]);
    assert_close(&as_f32(&out[3].tensor), &probs, 1e-5, "qk_matmul_output");
}

#[test]
fn softcap_additive_mask_and_f16() {
    let (b, hq, lq, lk, d) = (1, 2, 4, 6, 8);
    let mask = values(lq * lk, 9);
    let c = Case {
        b,
        hq,
        hkv: hq,
        lq,
        lk,
        past: 0,
        d,
        dv: d,
        scale: None,
        causal: false,
        softcap: 0.5,
        mask: Some((vec![1, 1, lq, lk], MaskValues::Float(mask.clone()))),
    };
    let q: Vec<f32> = values(b * hq * lq * d, 10)
        .iter()
        .map(|x| x * 4.0)
        .collect();
    let k = values(b * hq * lk * d, 11);
    let v = values(b * hq * lk * d, 12);
    // Round through f16 so the reference sees what the op sees.
    let r16 = |x: &[f32]| -> Vec<f32> {
        let t = tensor(&[x.len()], x.to_vec());
        as_f32(&t.cast_to_dt(attnrt_runtime::DatumType::F16).unwrap())
    };
    let (q16, k16, v16, m16) = (r16(&q), r16(&k), r16(&v), r16(&mask));
    let c16 = Case {
        mask: Some((vec![1, 1, lq, lk], MaskValues::Float(m16.clone()))),
        ..c
    };
    let (y, _) = reference(&c16, &q16, &k16, &v16);
    let model = attention_model(
        &[
            ("Q", DataType::Float16, vec!["1", "2", "4", "8"]),
            ("K", DataType::Float16, vec!["1", "2", "6", "8"]),
            ("V", DataType::Float16, vec!["1", "2", "6", "8"]),
            ("M", DataType::Float16, vec!["4", "6"]),
        ],
        &[("Y", vec!["1", "2", "4", "8"])],
        vec![attr::make_float("softcap", 0.5)],
        DataType::Float16,
    );
    let f16 = |shape: &[usize], x: &[f32]| {
        tensor(shape, x.to_vec())
            .cast_to_dt(attnrt_runtime::DatumType::F16)
            .unwrap()
            .into_owned()
    };
    let inputs = vec![
        named("Q", f16(&[1, 2, 4, 8], &q)),
        named("K", f16(&[1, 2, 6, 8], &k)),
        named("V", f16(&[1, 2, 6, 8], &v)),
        named("M", f16(&[4, 6], &mask)),
    ];
    let threads = Threads::new(Some(2)).unwrap();
    let out = Session::build(&model, &inputs, &threads, "test")
        .unwrap()
        .run(&inputs)
        .unwrap();
    assert_eq!(out[0].tensor.datum_type(), attnrt_runtime::DatumType::F16);
    // f16 output rounding: half an ulp at |y| < 1 is < 5e-4.
    assert_close(&as_f32(&out[0].tensor), &y, 1e-3, "Y");
}

#[test]
fn unsupported_attention_is_a_clear_error_naming_the_node() {
    let model = attention_model(
        &[
            ("Q", DataType::Float, vec!["1", "2", "3", "4"]),
            ("K", DataType::Float, vec!["1", "2", "3", "4"]),
            ("V", DataType::Float, vec!["1", "2", "3", "4"]),
        ],
        &[("Y", vec!["1", "2", "3", "4"])],
        vec![attr::make_int("left_window_size", 2)],
        DataType::Float,
    );
    let inputs = vec![
        named("Q", tensor(&[1, 2, 3, 4], values(24, 1))),
        named("K", tensor(&[1, 2, 3, 4], values(24, 2))),
        named("V", tensor(&[1, 2, 3, 4], values(24, 3))),
    ];
    let threads = Threads::new(Some(1)).unwrap();
    let err = format!(
        "{:#}",
        Session::build(&model, &inputs, &threads, "m.onnx").unwrap_err()
    );
    assert!(
        err.contains("'attn'") && err.contains("left_window_size"),
        "{err}"
    );

    // 3-D without head counts.
    let model = attention_model(
        &[
            ("Q", DataType::Float, vec!["1", "3", "8"]),
            ("K", DataType::Float, vec!["1", "3", "8"]),
            ("V", DataType::Float, vec!["1", "3", "8"]),
        ],
        &[("Y", vec!["1", "3", "8"])],
        vec![],
        DataType::Float,
    );
    let inputs = vec![
        named("Q", tensor(&[1, 3, 8], values(24, 1))),
        named("K", tensor(&[1, 3, 8], values(24, 2))),
        named("V", tensor(&[1, 3, 8], values(24, 3))),
    ];
    let err = format!(
        "{:#}",
        Session::build(&model, &inputs, &threads, "m.onnx").unwrap_err()
    );
    assert!(err.contains("attn") && err.contains("q_num_heads"), "{err}");
}

/// Opset 24: `nonpad_kv_seqlen` through the whole path (ONNX parsing with the empty past slots,
/// tract's input compaction, the op), against the same attention written with an explicit
/// boolean padding mask at opset 23. 3-D GQA, causal (per-batch offset `n_b − Lq`); batch 0 has
/// no valid key, batch 2 all keys valid.
#[test]
fn nonpad_kv_seqlen_equals_an_explicit_padding_mask_end_to_end() {
    let (b, hq, hkv, lq, lk, d) = (3, 4, 2, 3, 5, 8);
    let lens = [0i64, 2, 5];
    let q = tensor(&[b, lq, hq * d], values(b * lq * hq * d, 21));
    let k = tensor(&[b, lk, hkv * d], values(b * lk * hkv * d, 22));
    let v = tensor(&[b, lk, hkv * d], values(b * lk * hkv * d, 23));
    let heads = || {
        vec![
            attr::make_int("q_num_heads", hq as i64),
            attr::make_int("kv_num_heads", hkv as i64),
        ]
    };
    let qkv = || {
        vec![
            ("Q", DataType::Float, vec!["3", "3", "32"]),
            ("K", DataType::Float, vec!["3", "5", "16"]),
            ("V", DataType::Float, vec!["3", "5", "16"]),
        ]
    };
    let mut padded_inputs = qkv();
    padded_inputs.extend([
        ("", DataType::Float, vec![]),
        ("", DataType::Float, vec![]),
        ("", DataType::Float, vec![]),
        ("lens", DataType::Int64, vec!["3"]),
    ]);
    let mut attrs = heads();
    attrs.push(attr::make_int("is_causal", 1));
    let mut padded = attention_model(
        &padded_inputs,
        &[("Y", vec!["3", "3", "32"])],
        attrs,
        DataType::Float,
    );
    padded.opset_import[0].version = 24;

    let mut masked_inputs = qkv();
    masked_inputs.push(("M", DataType::Bool, vec!["3", "1", "3", "5"]));
    let masked = attention_model(
        &masked_inputs,
        &[("Y", vec!["3", "3", "32"])],
        heads(),
        DataType::Float,
    );
    let mask: Vec<bool> = (0..b * lq * lk)
        .map(|at| {
            let (bi, i, j) = (at / (lq * lk), at / lk % lq, at % lk);
            let n = lens[bi];
            (j as i64) < n && j as i64 <= i as i64 + n - lq as i64
        })
        .collect();

    let threads = Threads::new(Some(2)).unwrap();
    let run = |model: &ModelProto, extra: NamedTensor| {
        let inputs = vec![
            named("Q", q.clone()),
            named("K", k.clone()),
            named("V", v.clone()),
            extra,
        ];
        let s = Session::build(model, &inputs, &threads, "test").unwrap();
        as_f32(&s.run_owned(inputs).unwrap()[0].tensor)
    };
    let got = run(
        &padded,
        named(
            "lens",
            Tensor::from(ArrayD::from_shape_vec(vec![3], lens.to_vec()).unwrap()),
        ),
    );
    let want = run(
        &masked,
        named(
            "M",
            Tensor::from(ArrayD::from_shape_vec(vec![3, 1, 3, 5], mask).unwrap()),
        ),
    );
    let want: Vec<f64> = want.iter().map(|x| *x as f64).collect();
    assert_close(&got, &want, 1e-5, "Y");
    // Batch 0 is all padding: zeros, not NaN.
    assert!(got[..lq * hq * d].iter().all(|x| *x == 0.0));

    // A value beyond the key length is refused, naming the node and the input.
    let bad = vec![
        named("Q", q.clone()),
        named("K", k.clone()),
        named("V", v.clone()),
        named(
            "lens",
            Tensor::from(ArrayD::from_shape_vec(vec![3], vec![1i64, 6, 2]).unwrap()),
        ),
    ];
    let s = Session::build(&padded, &bad, &threads, "test").unwrap();
    let err = format!("{:#}", s.run(&bad).unwrap_err());
    assert!(
        err.contains("'attn'") && err.contains("nonpad_kv_seqlen[1] = 6"),
        "{err}"
    );
}
