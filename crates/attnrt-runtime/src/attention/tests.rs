//! Evaluation tests of the op against an explicit reference.

use super::eval::eval_attention;
use super::layout::*;
use super::semantics::{parse_node, AttentionOp};
use attnrt_kernels::reference;
use attnrt_kernels::reference::ScoreStage;
use attnrt_kernels::ViewMut4;
use attnrt_kernels::{AttentionParams, KernelSet, Mask, ThreadPolicy, View4};
use tract_onnx::pb::NodeProto;
use tract_onnx::prelude::*;

#[test]
fn mask_geometry_broadcasts_leading_axes_and_checks_keys() {
    let (d, s) = mask_geometry(&[2, 1, 1, 5], [2, 4, 3, 5]).unwrap();
    assert_eq!(d, [2, 1, 1, 5]);
    assert_eq!(s, [5, 0, 0, 1]);
    let (d, s) = mask_geometry(&[3, 5], [2, 4, 3, 5]).unwrap();
    assert_eq!(d, [1, 1, 3, 5]);
    assert_eq!(s, [0, 0, 5, 1]);
    // A shorter key axis is allowed (padded with -inf by the kernel), a longer one is not.
    assert!(mask_geometry(&[3, 4], [2, 4, 3, 5]).is_ok());
    assert!(mask_geometry(&[3, 6], [2, 4, 3, 5]).is_err());
    assert!(mask_geometry(&[2, 2, 3, 5], [2, 4, 3, 5]).is_err());
    assert!(mask_geometry(&[1, 1, 1, 1, 5], [2, 4, 3, 5]).is_err());
}

#[test]
fn present_appends_current_after_past() {
    let past = Tensor::from_shape(&[1, 1, 1, 2], &[1.0f32, 2.0]).unwrap();
    let past = to_f32(&past, "past_key").unwrap();
    let cur_data = [3.0, 4.0, 5.0, 6.0];
    let cur = View4::contiguous(&cur_data, [1, 1, 2, 2]).unwrap();
    let past = past_view(&past, cur.dims, "past_key").unwrap();
    let t = present_tensor(&ThreadPolicy::default(), Some(&past), &cur, true).unwrap();
    assert_eq!(t.shape(), &[1, 1, 3, 2]);
    assert_eq!(f32s(&t), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // Without a past, present is the current keys in the 4-D layout: a 3-D [B, L, H·D]
    // view (B=1, L=2, H=2, D=1) comes out as [B, H, L, D].
    let cur = View4::from_bshd(&cur_data, 1, 2, 2, 1).unwrap();
    let t = present_tensor(&ThreadPolicy::default(), None, &cur, true).unwrap();
    assert_eq!(t.shape(), &[1, 2, 2, 1]);
    assert_eq!(f32s(&t), &[3.0, 5.0, 4.0, 6.0]);
}

fn f32s(t: &Tensor) -> &[f32] {
    t.try_as_plain_ram().unwrap().as_slice::<f32>().unwrap()
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_shape(shape, &values(n, seed)).unwrap()
}

fn nonpad(lens: &[i64]) -> Tensor {
    Tensor::from_shape(&[lens.len()], lens).unwrap()
}

fn op(has_mask: bool, is_causal: bool, qk_mode: i64, with_scores: bool) -> AttentionOp {
    AttentionOp {
        node: "attn".into(),
        q_num_heads: None,
        kv_num_heads: None,
        scale: None,
        is_causal,
        softcap: 0.0,
        qk_mode,
        has_mask,
        has_past: false,
        has_nonpad: true,
        outputs: [true, false, false, with_scores],
        kv_store: false,
    }
}

fn run(op: &AttentionOp, inputs: Vec<Tensor>) -> TractResult<Vec<Vec<f32>>> {
    let inputs: Vec<TValue> = inputs.into_iter().map(|t| t.into_tvalue()).collect();
    let kernels = KernelSet::resolve()?;
    Ok(eval_attention(op, &kernels, &inputs, None)?
        .iter()
        .map(|t| f32s(t).to_vec())
        .collect())
}

// Geometry of the nonpad tests: GQA (4 q-heads on 2 kv-heads), Lq < Lk, Dv != D; batch 0
// has no valid key, batch 1 fewer valid keys than queries (negative causal offset), batch 2
// every key valid.
const B: usize = 3;
const HQ: usize = 4;
const HKV: usize = 2;
const LQ: usize = 3;
const LK: usize = 5;
const D: usize = 8;
const DV: usize = 6;
const LENS: [i64; B] = [0, 2, 5];

/// The ONNX Attention-24 bias written out in full, `[B, 1, LQ, LK]`: the user's additive
/// mask (`[B, 1, LQ, LK]`), plus `−inf` for padding keys `j ≥ n_b`, plus (causal) `−inf`
/// where `j > i + n_b − LQ`.
fn explicit_bias(user: Option<&[f32]>, causal: bool) -> Vec<f32> {
    let mut bias = vec![0f32; B * LQ * LK];
    for (b, &n) in LENS.iter().enumerate() {
        for i in 0..LQ {
            for j in 0..LK {
                let at = (b * LQ + i) * LK + j;
                let mut x = user.map_or(0.0, |u| u[at]);
                if j as i64 >= n || (causal && j as i64 > i as i64 + n - LQ as i64) {
                    x = f32::NEG_INFINITY;
                }
                bias[at] = x;
            }
        }
    }
    bias
}

fn expected_y(q: &Tensor, k: &Tensor, v: &Tensor, bias: &[f32]) -> Vec<f32> {
    let q = View4::contiguous(f32s(q), [B, HQ, LQ, D]).unwrap();
    let k = View4::contiguous(f32s(k), [B, HKV, LK, D]).unwrap();
    let v = View4::contiguous(f32s(v), [B, HKV, LK, DV]).unwrap();
    let mask = View4::new(
        bias,
        [B, 1, LQ, LK],
        [(LQ * LK) as isize, 0, LK as isize, 1],
    )
    .unwrap();
    let mut y = vec![f32::NAN; B * HQ * LQ * DV];
    let mut out = ViewMut4::contiguous(&mut y, [B, HQ, LQ, DV]).unwrap();
    let params = AttentionParams::new(AttentionParams::default_scale(D));
    reference::attention(&q, &k, &v, &Mask::Additive(mask), &params, &mut out).unwrap();
    y
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same_inf = g.is_infinite() && g == w;
        assert!(
            same_inf || (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

#[test]
fn nonpad_kv_seqlen_matches_an_explicit_padding_mask() {
    let (q, k, v) = (
        tensor(&[B, HQ, LQ, D], 1),
        tensor(&[B, HKV, LK, D], 2),
        tensor(&[B, HKV, LK, DV], 3),
    );
    let user = values(B * LQ * LK, 4);
    for causal in [false, true] {
        for with_mask in [false, true] {
            let what = format!("causal={causal} mask={with_mask}");
            let mut inputs = vec![q.clone(), k.clone(), v.clone()];
            if with_mask {
                inputs.push(Tensor::from_shape(&[B, 1, LQ, LK], &user).unwrap());
            }
            inputs.push(nonpad(&LENS));
            let got = run(&op(with_mask, causal, 0, false), inputs).unwrap();
            let bias = explicit_bias(with_mask.then_some(&user[..]), causal);
            let want = expected_y(&q, &k, &v, &bias);
            assert_close(&got[0], &want, &what);
            // Batch 0 has no valid key: every row is fully masked, so Y is 0 (errata).
            let per_batch = HQ * LQ * DV;
            assert!(got[0][..per_batch].iter().all(|x| *x == 0.0), "{what}");
            // Batch 1, causal: offset 2 − 3 = −1 leaves query 0 without a key.
            if causal {
                for h in 0..HQ {
                    let row = per_batch + h * LQ * DV;
                    assert!(got[0][row..row + DV].iter().all(|x| *x == 0.0), "{what}");
                }
            }
            // Batch 2 is all valid: the same as without nonpad_kv_seqlen (and, for causal,
            // offset LK − LQ, i.e. the bottom-right alignment of a past of LK − LQ keys).
            assert!(got[0][2 * per_batch..].iter().any(|x| *x != 0.0), "{what}");
        }
    }
}

#[test]
fn nonpad_kv_seqlen_with_all_keys_valid_is_a_no_op() {
    let (q, k, v) = (
        tensor(&[B, HQ, LQ, D], 5),
        tensor(&[B, HKV, LK, D], 6),
        tensor(&[B, HKV, LK, DV], 7),
    );
    let mask: Vec<bool> = values(B * LQ * LK, 8).iter().map(|x| *x > -0.5).collect();
    let mask = Tensor::from_shape(&[B, 1, LQ, LK], &mask).unwrap();
    let with = run(
        &op(true, false, 0, false),
        vec![
            q.clone(),
            k.clone(),
            v.clone(),
            mask.clone(),
            nonpad(&[5, 5, 5]),
        ],
    )
    .unwrap();
    let mut plain = op(true, false, 0, false);
    plain.has_nonpad = false;
    let without = run(&plain, vec![q, k, v, mask]).unwrap();
    assert_eq!(with[0], without[0]);
}

#[test]
fn nonpad_kv_seqlen_qk_matmul_output_modes() {
    let (q, k, v) = (
        tensor(&[B, HQ, LQ, D], 9),
        tensor(&[B, HKV, LK, D], 10),
        tensor(&[B, HKV, LK, DV], 11),
    );
    let bias = explicit_bias(None, true);
    let qv = View4::contiguous(f32s(&q), [B, HQ, LQ, D]).unwrap();
    let kv = View4::contiguous(f32s(&k), [B, HKV, LK, D]).unwrap();
    let mask = View4::new(
        &bias,
        [B, 1, LQ, LK],
        [(LQ * LK) as isize, 0, LK as isize, 1],
    )
    .unwrap();
    let params = AttentionParams::new(AttentionParams::default_scale(D));
    for mode in 0..4 {
        let got = run(
            &op(false, true, mode, true),
            vec![q.clone(), k.clone(), v.clone(), nonpad(&LENS)],
        )
        .unwrap();
        let stage = ScoreStage::from_onnx_mode(mode).unwrap();
        let want = reference::scores(&qv, &kv, &Mask::Additive(mask), &params, stage).unwrap();
        assert_close(&got[1], &want, &format!("qk_matmul_output mode {mode}"));
    }
}

#[test]
fn nonpad_kv_seqlen_on_3d_inputs() {
    // [B, L, H·D] inputs: the per-batch views must follow the 3-D strides.
    let (q, k, v) = (
        tensor(&[B, LQ, HQ * D], 12),
        tensor(&[B, LK, HKV * D], 13),
        tensor(&[B, LK, HKV * DV], 14),
    );
    let mut op3 = op(false, true, 0, false);
    op3.q_num_heads = Some(HQ);
    op3.kv_num_heads = Some(HKV);
    let got = run(&op3, vec![q.clone(), k.clone(), v.clone(), nonpad(&LENS)]).unwrap();
    let bias = explicit_bias(None, true);
    let qv = View4::from_bshd(f32s(&q), B, LQ, HQ, D).unwrap();
    let kv = View4::from_bshd(f32s(&k), B, LK, HKV, D).unwrap();
    let vv = View4::from_bshd(f32s(&v), B, LK, HKV, DV).unwrap();
    let mask = View4::new(
        &bias,
        [B, 1, LQ, LK],
        [(LQ * LK) as isize, 0, LK as isize, 1],
    )
    .unwrap();
    let mut want = vec![f32::NAN; B * LQ * HQ * DV];
    let mut out = ViewMut4::from_bshd(&mut want, B, LQ, HQ, DV).unwrap();
    let params = AttentionParams::new(AttentionParams::default_scale(D));
    reference::attention(&qv, &kv, &vv, &Mask::Additive(mask), &params, &mut out).unwrap();
    assert_close(&got[0], &want, "3-D");
}

#[test]
fn nonpad_kv_seqlen_is_validated() {
    let qkv = || {
        vec![
            tensor(&[B, HQ, LQ, D], 1),
            tensor(&[B, HKV, LK, D], 2),
            tensor(&[B, HKV, LK, DV], 3),
        ]
    };
    let fails = |n: Tensor, expect: &str| {
        let mut inputs = qkv();
        inputs.push(n);
        let err = format!(
            "{:#}",
            run(&op(false, false, 0, false), inputs).unwrap_err()
        );
        assert!(
            err.contains("nonpad_kv_seqlen") && err.contains(expect),
            "{err}"
        );
    };
    fails(
        Tensor::from_shape(&[B], &[1i32, 2, 3]).unwrap(),
        "requires int64",
    );
    fails(nonpad(&[1, 2]), "must be [batch] = [3]");
    fails(
        nonpad(&[1, -1, 2]),
        "nonpad_kv_seqlen[1] = -1 is outside 0..=5",
    );
    fails(
        nonpad(&[1, 2, 6]),
        "nonpad_kv_seqlen[2] = 6 is outside 0..=5",
    );
}

#[test]
fn nonpad_kv_seqlen_refuses_a_kv_cache() {
    let node = |inputs: &[&str], outputs: &[&str]| NodeProto {
        op_type: "Attention".into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let ok = parse_node(&node(&["q", "k", "v", "", "", "", "n"], &["y"]), "attn").unwrap();
    assert!(ok.has_nonpad && !ok.has_mask && !ok.has_past);
    assert_eq!(ok.input_count(), 4);
    assert_eq!(ok.nonpad_index(), Some(3));
    for (inputs, outputs) in [
        (&["q", "k", "v", "m", "pk", "pv", "n"][..], &["y"][..]),
        (
            &["q", "k", "v", "", "", "", "n"][..],
            &["y", "present_k", "present_v"][..],
        ),
    ] {
        let err = parse_node(&node(inputs, outputs), "attn")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nonpad_kv_seqlen cannot be combined"), "{err}");
    }
    let err = parse_node(
        &node(&["q", "k", "v", "", "", "", "n", "x"], &["y"]),
        "attn",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("at most 7"), "{err}");
}

/// Store mode (`crate::kv_store`): a prompt of 5 then two decode steps (GQA, causal, a store
/// made too small so that it grows) give the copy path's Y bit for bit, with stand-in presents
/// `[B, Hkv, total, 0]`; a step whose past is not the slot's length is an error naming the node.
#[test]
fn store_mode_gives_the_copy_paths_y_and_refuses_a_stale_store() {
    use crate::kv_store::KvStore;
    let copy = AttentionOp {
        node: "attn".into(),
        q_num_heads: None,
        kv_num_heads: None,
        scale: None,
        is_causal: true,
        softcap: 0.0,
        qk_mode: 0,
        has_mask: false,
        has_past: true,
        has_nonpad: false,
        outputs: [true, true, true, false],
        kv_store: false,
    };
    let in_store = AttentionOp {
        kv_store: true,
        ..copy.clone()
    };
    let kernels = KernelSet::resolve().unwrap();
    let store = KvStore::new(4);
    let (b, hq, hkv, d) = (2, 4, 2, 8);
    let value = |t: Tensor| t.into_tvalue();
    let mut past = vec![
        value(Tensor::zero::<f32>(&[b, hkv, 0, d]).unwrap()),
        value(Tensor::zero::<f32>(&[b, hkv, 0, d]).unwrap()),
    ];
    let mut stand_ins = vec![
        value(Tensor::zero::<f32>(&[b, hkv, 0, 0]).unwrap()),
        value(Tensor::zero::<f32>(&[b, hkv, 0, 0]).unwrap()),
    ];
    let mut total = 0;
    for (step, len) in [5, 1, 1].into_iter().enumerate() {
        let seed = 10 * step as u64;
        let qkv = vec![
            value(tensor(&[b, hq, len, d], seed)),
            value(tensor(&[b, hkv, len, d], seed + 1)),
            value(tensor(&[b, hkv, len, d], seed + 2)),
        ];
        let inputs = [qkv.clone(), past.clone()].concat();
        let copied = eval_attention(&copy, &kernels, &inputs, None).unwrap();
        let inputs = [qkv.clone(), stand_ins.clone()].concat();
        let held = eval_attention(&in_store, &kernels, &inputs, Some(&store)).unwrap();
        total += len;
        assert_eq!(f32s(&held[0]), f32s(&copied[0]), "step {step}");
        assert_eq!(held[1].shape(), &[b, hkv, total, 0]);
        assert_eq!(copied[1].shape(), &[b, hkv, total, d]);
        past = copied[1..].to_vec();
        let stale = std::mem::replace(&mut stand_ins, held[1..].to_vec());
        if step == 2 {
            let inputs = [qkv, stale].concat();
            let err = eval_attention(&in_store, &kernels, &inputs, Some(&store)).unwrap_err();
            let msg = format!("{err:#}");
            assert!(
                msg.contains("node 'attn' holds 7 position(s) but the step's past has 6"),
                "{msg}"
            );
        }
    }
}
