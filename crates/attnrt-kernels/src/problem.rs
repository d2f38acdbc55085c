//! What one attention call asks for: the mask, the scalar parameters, and the sizes of a
//! validated call ([`Problem`], checked once at the API boundary so that no index computed
//! inside a kernel can leave the caller's buffers).

use crate::error::KernelError;
use crate::view::{View4, ViewMut4};

/// The attention mask, broadcast to `[B, Hq, Lq, Lk]`.
///
/// Axes 0–2 (batch, q-head, query) broadcast when their extent is 1 (the stride is then ignored).
/// The key axis follows the ONNX reference: a mask whose last extent `Lm` is *shorter* than `Lk`
/// is padded, i.e. keys `j ≥ Lm` are masked out (`−inf` / `false`); it is never broadcast from
/// extent 1. To broadcast one value over all keys, give the key axis extent `Lk` and stride 0.
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// No mask.
    None,
    /// Added to the scaled (and soft-capped) scores; `−inf` removes a key.
    Additive(View4<'a, f32>),
    /// `true` = may attend (ONNX `Attention` bool `attn_mask` semantics); `false` adds `−inf`.
    Boolean(View4<'a, bool>),
}

/// Scalar parameters of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Multiplies `Q·Kᵀ` (ONNX default `1/√head_dim`, see [`AttentionParams::default_scale`]).
    pub scale: f32,
    /// `Some(offset)`: query `i` may attend key `j` only if `j <= i + offset`. ONNX opset 23 uses
    /// `offset = past_sequence_length` (0 without a cache; bottom-right alignment).
    pub causal: Option<isize>,
    /// `Some(c)` with `c > 0`: `scores = c · tanh(scores / c)` before the mask is added (as in the
    /// ONNX graph). `None`, `c <= 0` or NaN: no soft-capping (ONNX applies it only for `c > 0`).
    pub softcap: Option<f32>,
}

impl AttentionParams {
    /// Plain attention with the given scale: no causal mask, no softcap.
    pub fn new(scale: f32) -> Self {
        AttentionParams {
            scale,
            causal: None,
            softcap: None,
        }
    }

    /// The ONNX default scale `1/√head_dim` (1 for `head_dim == 0`).
    pub fn default_scale(head_dim: usize) -> f32 {
        if head_dim == 0 {
            1.0
        } else {
            1.0 / (head_dim as f32).sqrt()
        }
    }

    /// The soft-cap value that is actually applied (`c > 0`), if any.
    pub(crate) fn effective_softcap(&self) -> Option<f32> {
        self.softcap.filter(|c| *c > 0.0)
    }
}

/// The sizes of one validated attention call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Problem {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    /// Keys that can be attended at all: `kv_len`, cut to the mask's key extent (ONNX pads a
    /// shorter mask with `−inf`/`false`).
    pub live_keys: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
}

impl Problem {
    /// Validates every view and the shape relations between them.
    pub(crate) fn check(
        q: &View4,
        k: &View4,
        v: Option<&View4>,
        mask: &Mask,
        out: Option<&ViewMut4>,
    ) -> Result<Problem, KernelError> {
        q.validate("Q")?;
        k.validate("K")?;
        let [batch, q_heads, q_len, head_dim] = q.dims;
        let [kb, kv_heads, kv_len, kd] = k.dims;
        if kb != batch {
            return Err(KernelError::Shape(format!(
                "Q has batch {batch} but K has batch {kb} (Q {:?}, K {:?})",
                q.dims, k.dims
            )));
        }
        if kd != head_dim {
            return Err(KernelError::Shape(format!(
                "Q head size {head_dim} differs from K head size {kd} (Q {:?}, K {:?})",
                q.dims, k.dims
            )));
        }
        if kv_heads == 0 {
            if q_heads != 0 {
                return Err(KernelError::Shape(format!(
                    "K has 0 heads but Q has {q_heads}"
                )));
            }
        } else if q_heads % kv_heads != 0 {
            return Err(KernelError::Shape(format!(
                "Q heads ({q_heads}) must be a multiple of K/V heads ({kv_heads}) for grouped-query attention"
            )));
        }
        let mut v_head_dim = 0;
        if let Some(v) = v {
            v.validate("V")?;
            let [vb, vh, vl, vd] = v.dims;
            if vb != batch || vh != kv_heads || vl != kv_len {
                return Err(KernelError::Shape(format!(
                    "V dims {:?} must be [{batch}, {kv_heads}, {kv_len}, Dv] to match K {:?}",
                    v.dims, k.dims
                )));
            }
            v_head_dim = vd;
        }
        if let Some(out) = out {
            out.validate("out")?;
            let want = [batch, q_heads, q_len, v_head_dim];
            if out.dims != want {
                return Err(KernelError::Shape(format!(
                    "out dims {:?} must be {want:?} (from Q {:?} and V)",
                    out.dims, q.dims
                )));
            }
        }
        let mask_dims = match mask {
            Mask::None => None,
            Mask::Additive(m) => {
                m.validate("mask")?;
                Some(m.dims)
            }
            Mask::Boolean(m) => {
                m.validate("mask")?;
                Some(m.dims)
            }
        };
        let mut live_keys = kv_len;
        if let Some(md) = mask_dims {
            let target = [batch, q_heads, q_len];
            for (axis, name) in ["batch", "q heads", "query length"].iter().enumerate() {
                if md[axis] != 1 && md[axis] != target[axis] {
                    return Err(KernelError::Shape(format!(
                        "mask dims {md:?} do not broadcast to [B={batch}, Hq={q_heads}, Lq={q_len}, Lk={kv_len}]: {name} is {} (must be 1 or {})",
                        md[axis], target[axis]
                    )));
                }
            }
            if md[3] > kv_len {
                return Err(KernelError::Shape(format!(
                    "mask dims {md:?} have {} keys but K/V have only {kv_len}",
                    md[3]
                )));
            }
            live_keys = md[3];
        }
        Ok(Problem {
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len,
            live_keys,
            head_dim,
            v_head_dim,
        })
    }

    /// Number of q-heads sharing one kv-head.
    pub(crate) fn group(&self) -> usize {
        self.q_heads.checked_div(self.kv_heads).unwrap_or(1)
    }
}
