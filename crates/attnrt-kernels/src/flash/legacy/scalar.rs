//! Portable path: "vectors" are 8-float arrays the compiler may auto-vectorize with the baseline
//! ISA; tiles of 4 keys (or value columns) × 16 queries.

// The shared kernel passes raw tile pointers and strides; bundling them would obscure it.
#![allow(clippy::too_many_arguments)]

type V = [f32; LANES];
const LANES: usize = 8;
const NR: usize = 2;
const MR: usize = 4;
pub(crate) const BQ: usize = LANES * NR;
/// At most this many query blocks per task (they share each packed K/V block; see
/// `flash::choose_qsub`).
pub(crate) const QSUB_MAX: usize = 4;
pub(crate) const BK: usize = 64;

#[inline]
fn vzero() -> V {
    [0.0; LANES]
}
#[inline]
fn vsplat(x: f32) -> V {
    [x; LANES]
}
#[inline]
unsafe fn vload(p: *const f32) -> V {
    std::ptr::read_unaligned(p as *const V)
}
#[inline]
unsafe fn vstore(p: *mut f32, v: V) {
    std::ptr::write_unaligned(p as *mut V, v)
}
#[inline]
fn lanewise(a: V, b: V, f: impl Fn(f32, f32) -> f32) -> V {
    let mut r = a;
    for i in 0..LANES {
        r[i] = f(a[i], b[i]);
    }
    r
}
#[inline]
fn vfma(a: V, b: V, c: V) -> V {
    let mut r = c;
    for i in 0..LANES {
        // Plain multiply-add (not `mul_add`, which is a slow libm call without hardware FMA).
        r[i] = a[i] * b[i] + c[i];
    }
    r
}
#[inline]
fn vmul(a: V, b: V) -> V {
    lanewise(a, b, |x, y| x * y)
}
#[inline]
fn vadd(a: V, b: V) -> V {
    lanewise(a, b, |x, y| x + y)
}
#[inline]
fn vsub(a: V, b: V) -> V {
    lanewise(a, b, |x, y| x - y)
}
#[inline]
fn vmax(a: V, b: V) -> V {
    lanewise(a, b, f32::max)
}
/// `2^x` (the softmax takes `(s − max)·log2 e`).
#[inline]
fn vexp2(x: V) -> V {
    x.map(f32::exp2)
}

/// Whether every lane of `v` is exactly 1 (a softmax rescale factor that changes nothing).
#[inline]
fn vall_one(v: V) -> bool {
    v.iter().all(|&x| x == 1.0)
}

/// `v` with `−inf` lanes replaced by 0 (the safe softmax reference of a still-empty row).
#[inline]
fn vzero_if_neg_inf(v: V) -> V {
    v.map(|x| if x == f32::NEG_INFINITY { 0.0 } else { x })
}

/// No prefetch hint on the portable path.
#[inline]
fn vprefetch(_p: *const f32) {}

/// The first `live` lanes gather `base[idx[lane]]`, the others are 0.
#[inline]
unsafe fn vgather(base: *const f32, idx: *const i32, live: usize) -> V {
    let mut r = [0.0; LANES];
    for (lane, x) in r.iter_mut().enumerate().take(live) {
        *x = *base.offset(*idx.add(lane) as isize);
    }
    r
}

/// Transposes a `LANES`×`LANES` tile: afterwards `t[c][r]` is the old `t[r][c]`.
#[inline]
#[allow(clippy::needless_range_loop)] // a swap across the diagonal reads clearest with indices
fn vtranspose(t: &mut [V; LANES]) {
    for r in 0..LANES {
        for c in r + 1..LANES {
            let x = t[r][c];
            t[r][c] = t[c][r];
            t[c][r] = x;
        }
    }
}

flash_core!();
