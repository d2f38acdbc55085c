//! Ops that compute along axes: `MatMul`, `Gemm`, `Conv`, `Reduce*`, `GatherElements`,
//! `GatherND`, and the `Attention` op this crate emits (so that blocks fused later see the
//! shapes after an earlier rewrite).

use attnrt_onnx::{attr, NodeProto};

use super::facts::{axis, Facts};
use crate::graph::dim::{broadcast, Dim};
use crate::graph::value::Value;

/// `MatMul`: broadcast batch dims, then `[.., M, K]·[.., K, N] = [.., M, N]`.
pub(super) fn matmul(f: &mut Facts, n: &NodeProto) {
    if let Some(s) = matmul_shape(f, n) {
        f.copy_type(n);
        f.set(n, 0, Some(s), None);
    }
}

/// The output shape of a `MatMul` (or `MatMulInteger`) of inputs 0 and 1 of `n`.
pub(super) fn matmul_shape(f: &Facts, n: &NodeProto) -> Option<Vec<Dim>> {
    let (a, b) = (f.in_shape(n, 0)?, f.in_shape(n, 1)?);
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let mut s = broadcast(&a[..a.len() - 2], &b[..b.len() - 2])?;
    s.push(a[a.len() - 2].clone());
    s.push(b[b.len() - 1].clone());
    Some(s)
}

/// `Gemm(transA, transB)` on 2-D inputs.
pub(super) fn gemm(f: &mut Facts, n: &NodeProto) {
    let (Some(a), Some(b)) = (f.in_shape(n, 0), f.in_shape(n, 1)) else {
        return;
    };
    if a.len() != 2 || b.len() != 2 {
        return;
    }
    let ta = attr::int(n, "transA").ok().flatten().unwrap_or(0) != 0;
    let tb = attr::int(n, "transB").ok().flatten().unwrap_or(0) != 0;
    let m = if ta { a[1].clone() } else { a[0].clone() };
    let nn = if tb { b[0].clone() } else { b[1].clone() };
    f.copy_type(n);
    f.set(n, 0, Some(vec![m, nn]), None);
}

/// `Conv` with explicit pads (no `auto_pad`) and known spatial sizes.
pub(super) fn conv(f: &mut Facts, n: &NodeProto) {
    let (Some(x), Some(w)) = (f.in_shape(n, 0), f.in_shape(n, 1)) else {
        return;
    };
    if x.len() < 3 || w.len() != x.len() {
        return;
    }
    let sp = x.len() - 2;
    let get = |name: &str, dflt: i64, len: usize| -> Vec<i64> {
        attr::ints(n, name)
            .ok()
            .flatten()
            .map(<[i64]>::to_vec)
            .unwrap_or_else(|| vec![dflt; len])
    };
    let (strides, dil, pads) = (
        get("strides", 1, sp),
        get("dilations", 1, sp),
        get("pads", 0, 2 * sp),
    );
    if attr::string(n, "auto_pad")
        .ok()
        .flatten()
        .is_some_and(|a| a != "NOTSET")
        || strides.len() != sp
        || dil.len() != sp
        || pads.len() != 2 * sp
    {
        return;
    }
    let mut out = vec![x[0].clone(), w[0].clone()];
    for i in 0..sp {
        let (Some(xi), Some(ki)) = (x[2 + i].as_known(), w[2 + i].as_known()) else {
            return;
        };
        let eff = dil[i] * (ki - 1) + 1;
        out.push(Dim::known(
            (xi + pads[i] + pads[sp + i] - eff) / strides[i] + 1,
        ));
    }
    f.copy_type(n);
    f.set(n, 0, Some(out), None);
}

/// `Reduce*`: axes as an attribute or (opset 18) an input; none = all axes.
pub(super) fn reduce(f: &mut Facts, n: &NodeProto) {
    let Some(s) = f.in_shape(n, 0) else { return };
    let r = s.len() as i64;
    let keep = attr::int(n, "keepdims").ok().flatten().unwrap_or(1) != 0;
    let axes: Option<Vec<i64>> = match attr::ints(n, "axes").ok().flatten() {
        Some(a) => Some(a.to_vec()),
        None if n.input.len() > 1 && !n.input[1].is_empty() => {
            f.in_value(n, 1).and_then(Value::known_ints)
        }
        None => Some((0..r).collect()),
    };
    let Some(axes) = axes else { return };
    let axes: Vec<i64> = axes.iter().map(|&a| axis(a, r)).collect();
    let out: Vec<Dim> = s
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            if axes.contains(&(i as i64)) {
                keep.then(|| Dim::known(1))
            } else {
                Some(d.clone())
            }
        })
        .collect();
    f.copy_type(n);
    f.set(n, 0, Some(out), None);
}

/// `GatherElements`: the indices' shape.
pub(super) fn gather_elements(f: &mut Facts, n: &NodeProto) {
    let s1 = f.in_shape(n, 1);
    f.copy_type(n);
    f.set(n, 0, s1, None);
}

/// `GatherND(batch_dims)`: `indices[..-1] ++ data[b + k..]`.
pub(super) fn gather_nd(f: &mut Facts, n: &NodeProto) {
    let (Some(data), Some(idx)) = (f.in_shape(n, 0), f.in_shape(n, 1)) else {
        return;
    };
    let b = attr::int(n, "batch_dims").ok().flatten().unwrap_or(0) as usize;
    let Some(k) = idx.last().and_then(Dim::as_known) else {
        return;
    };
    if idx.is_empty() || b + k as usize > data.len() {
        return;
    }
    let mut out: Vec<Dim> = idx[..idx.len() - 1].to_vec();
    out.extend(data[b + k as usize..].iter().cloned());
    f.copy_type(n);
    f.set(n, 0, Some(out), None);
}

/// `Attention` (opset 23): `[B, H, Lq, Dv]` in 4-D, `[B, Lq, Hq·Dv]` in 3-D.
pub(super) fn attention(f: &mut Facts, n: &NodeProto) {
    let (Some(q), Some(v)) = (f.in_shape(n, 0), f.in_shape(n, 2)) else {
        return;
    };
    let out = match (q.len(), v.len()) {
        (4, 4) => Some(vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()]),
        (3, 3) => {
            let qh = attr::int(n, "q_num_heads").ok().flatten();
            let kvh = attr::int(n, "kv_num_heads").ok().flatten();
            match (qh, kvh) {
                (Some(qh), Some(kvh)) if kvh > 0 => v[2]
                    .div_exact(&Dim::known(kvh))
                    .and_then(|dv| dv.mul(&Dim::known(qh)))
                    .map(|h| vec![q[0].clone(), q[1].clone(), h]),
                _ => None,
            }
        }
        _ => None,
    };
    f.copy_type(n);
    f.set(n, 0, out, None);
}
