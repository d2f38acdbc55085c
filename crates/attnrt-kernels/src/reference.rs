//! Naive, obviously-correct attention in `f64` (materializes each score row), written straight
//! from the ONNX `Attention` (opset 23, with errata) definition. Used by the tests as ground truth
//! and by the runtime for `qk_matmul_output`.

use crate::error::KernelError;
use crate::problem::{AttentionParams, Mask, Problem};
use crate::view::{View4, ViewMut4};

/// Where in the ONNX pipeline [`scores`] materializes `[B, Hq, Lq, Lk]`; the variants follow the
/// spec text of `qk_matmul_output_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScoreStage {
    /// Mode 0: the output of the Q·Kᵀ MatMul, i.e. `scale · Q·Kᵀ` (the spec scales Q and K by
    /// `√scale` before the MatMul). Note: the onnx Python reference (1.18–1.23) overwrites this
    /// with the soft-capped value when `softcap` is set; the spec text says "output of qk matmul".
    QkMatmul,
    /// Mode 1: after the soft-cap (before the mask is added); equals mode 0 without soft-cap.
    Softcapped,
    /// Mode 2: soft-capped scores plus the attention bias (mask and causal `−inf`).
    Biased,
    /// Mode 3: after the softmax; a fully-masked row is a zero row (errata).
    Softmax,
}

impl ScoreStage {
    /// The stage of ONNX `qk_matmul_output_mode` 0–3.
    pub fn from_onnx_mode(mode: i64) -> Option<ScoreStage> {
        match mode {
            0 => Some(ScoreStage::QkMatmul),
            1 => Some(ScoreStage::Softcapped),
            2 => Some(ScoreStage::Biased),
            3 => Some(ScoreStage::Softmax),
            _ => None,
        }
    }
}

/// One query row at every stage.
struct Row {
    raw: Vec<f64>,
    capped: Vec<f64>,
    biased: Vec<f64>,
    probs: Vec<f64>,
}

/// The additive bias of key `j` for query `i`: mask value (`−inf` for keys beyond a shorter
/// mask, ONNX padding) plus `−inf` where the causal rule forbids the key.
fn bias(mask: &Mask, params: &AttentionParams, b: usize, h: usize, i: usize, j: usize) -> f64 {
    let mut bias = match mask {
        Mask::None => 0.0,
        Mask::Additive(m) => {
            if j >= m.dims[3] {
                f64::NEG_INFINITY
            } else {
                *m.at(broadcast_idx(&m.dims, [b, h, i, j])) as f64
            }
        }
        Mask::Boolean(m) => {
            if j < m.dims[3] && *m.at(broadcast_idx(&m.dims, [b, h, i, j])) {
                0.0
            } else {
                f64::NEG_INFINITY
            }
        }
    };
    if let Some(off) = params.causal {
        if (j as i128) > i as i128 + off as i128 {
            bias += f64::NEG_INFINITY;
        }
    }
    bias
}

fn broadcast_idx(dims: &[usize; 4], idx: [usize; 4]) -> [usize; 4] {
    let mut r = idx;
    for a in 0..4 {
        if dims[a] == 1 {
            r[a] = 0;
        }
    }
    r
}

#[allow(clippy::too_many_arguments)] // one query row's full coordinates
fn row(
    p: &Problem,
    q: &View4,
    k: &View4,
    mask: &Mask,
    params: &AttentionParams,
    b: usize,
    h: usize,
    i: usize,
) -> Row {
    let hk = h / p.group();
    let lk = p.kv_len;
    let mut raw = vec![0.0f64; lk];
    for (j, r) in raw.iter_mut().enumerate() {
        let mut dot = 0.0f64;
        for d in 0..p.head_dim {
            dot += *q.at([b, h, i, d]) as f64 * *k.at([b, hk, j, d]) as f64;
        }
        *r = dot * params.scale as f64;
    }
    let capped: Vec<f64> = match params.effective_softcap() {
        Some(c) => {
            let c = c as f64;
            raw.iter().map(|x| c * (x / c).tanh()).collect()
        }
        None => raw.clone(),
    };
    let biases: Vec<f64> = (0..lk).map(|j| bias(mask, params, b, h, i, j)).collect();
    // The score and the bias are added in float32, as a float32 graph (and the op in float32)
    // adds them: a bias of `finfo(float32).min` absorbs the score, so a row that every key masks
    // with it gets equal weights; an f64 sum would keep the scores' differences there.
    let biased: Vec<f64> = capped
        .iter()
        .zip(&biases)
        .map(|(s, bb)| (*s as f32 + *bb as f32) as f64)
        .collect();
    // Errata rule: the row is fully masked when every key's bias is −inf (decided on the bias,
    // not on the scores); such a row (and an empty one) softmaxes to zeros.
    let fully_masked = biases.iter().all(|x| *x == f64::NEG_INFINITY);
    let probs = if fully_masked {
        vec![0.0; lk]
    } else {
        let max = biased.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let safe = if max == f64::NEG_INFINITY { 0.0 } else { max };
        let e: Vec<f64> = biased.iter().map(|x| (x - safe).exp()).collect();
        let sum: f64 = e.iter().sum();
        let sum = if sum == 0.0 { 1.0 } else { sum };
        e.iter().map(|x| x / sum).collect()
    };
    Row {
        raw,
        capped,
        biased,
        probs,
    }
}

/// Reference attention: same contract as [`crate::attention`], computed row by row in `f64`.
pub fn attention(
    q: &View4,
    k: &View4,
    v: &View4,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
) -> Result<(), KernelError> {
    let p = Problem::check(q, k, Some(v), mask, Some(out))?;
    let group = p.group();
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            for i in 0..p.q_len {
                let r = row(&p, q, k, mask, params, b, h, i);
                for c in 0..p.v_head_dim {
                    let mut acc = 0.0f64;
                    for (j, pr) in r.probs.iter().enumerate() {
                        acc += pr * *v.at([b, h / group, j, c]) as f64;
                    }
                    *out.at_mut([b, h, i, c]) = acc as f32;
                }
            }
        }
    }
    Ok(())
}

/// The materialized scores `[B, Hq, Lq, Lk]` (row-major) at `stage`, for ONNX's
/// `qk_matmul_output`. `O(Lq·Lk)` memory by nature: only for the optional debug output.
pub fn scores(
    q: &View4,
    k: &View4,
    mask: &Mask,
    params: &AttentionParams,
    stage: ScoreStage,
) -> Result<Vec<f32>, KernelError> {
    let p = Problem::check(q, k, None, mask, None)?;
    let total = [p.batch, p.q_heads, p.q_len, p.kv_len]
        .iter()
        .try_fold(1usize, |a, x| a.checked_mul(*x))
        .ok_or_else(|| {
            KernelError::Shape(format!(
                "scores [{}, {}, {}, {}] overflow",
                p.batch, p.q_heads, p.q_len, p.kv_len
            ))
        })?;
    let mut res = Vec::with_capacity(total);
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            for i in 0..p.q_len {
                let r = row(&p, q, k, mask, params, b, h, i);
                let src = match stage {
                    ScoreStage::QkMatmul => &r.raw,
                    ScoreStage::Softcapped => &r.capped,
                    ScoreStage::Biased => &r.biased,
                    ScoreStage::Softmax => &r.probs,
                };
                res.extend(src.iter().map(|x| *x as f32));
            }
        }
    }
    Ok(res)
}
