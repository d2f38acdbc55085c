//! Portable path: "vectors" are 8-float arrays the compiler may auto-vectorize with the baseline
//! ISA; tiles of 4 keys (or value columns) × 16 queries.

use super::simd::FlashSimd;
use super::{task, Job, Scratch};

const LANES: usize = 8;
type V = [f32; LANES];

/// The portable build of the kernel (no target features: runs on any CPU).
pub(crate) struct Portable;

#[inline(always)]
fn lanewise(a: V, b: V, f: impl Fn(f32, f32) -> f32) -> V {
    let mut r = a;
    for i in 0..LANES {
        r[i] = f(a[i], b[i]);
    }
    r
}

// SAFETY: plain Rust on arrays, valid on every CPU; the tiles are within `check_tiles`' bounds.
unsafe impl FlashSimd for Portable {
    type V = V;
    type Tile = [V; LANES];
    const LANES: usize = LANES;
    const NR: usize = 2;
    const MR: usize = 4;
    const BK: usize = 64;
    const QSUB_MAX: usize = 4;

    #[inline(always)]
    unsafe fn zero() -> V {
        [0.0; LANES]
    }
    #[inline(always)]
    unsafe fn zero_tile() -> [V; LANES] {
        [[0.0; LANES]; LANES]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        [x; LANES]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        std::ptr::read_unaligned(p as *const V)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: V) {
        std::ptr::write_unaligned(p as *mut V, v)
    }
    #[inline(always)]
    unsafe fn fma(a: V, b: V, c: V) -> V {
        let mut r = c;
        for i in 0..LANES {
            // Plain multiply-add (not `mul_add`, which is a slow libm call without hardware FMA).
            r[i] = a[i] * b[i] + c[i];
        }
        r
    }
    #[inline(always)]
    unsafe fn mul(a: V, b: V) -> V {
        lanewise(a, b, |x, y| x * y)
    }
    #[inline(always)]
    unsafe fn add(a: V, b: V) -> V {
        lanewise(a, b, |x, y| x + y)
    }
    #[inline(always)]
    unsafe fn sub(a: V, b: V) -> V {
        lanewise(a, b, |x, y| x - y)
    }
    #[inline(always)]
    unsafe fn max(a: V, b: V) -> V {
        lanewise(a, b, f32::max)
    }
    #[inline(always)]
    unsafe fn exp2(x: V) -> V {
        x.map(f32::exp2)
    }
    #[inline(always)]
    unsafe fn all_one(v: V) -> bool {
        v.iter().all(|&x| x == 1.0)
    }
    #[inline(always)]
    unsafe fn zero_if_neg_inf(v: V) -> V {
        v.map(|x| if x == f32::NEG_INFINITY { 0.0 } else { x })
    }
    /// No prefetch hint on the portable path.
    #[inline(always)]
    unsafe fn prefetch(_p: *const f32) {}
    #[inline(always)]
    unsafe fn gather(base: *const f32, idx: *const i32, live: usize) -> V {
        let mut r = [0.0; LANES];
        for (lane, x) in r.iter_mut().enumerate().take(live) {
            *x = *base.offset(*idx.add(lane) as isize);
        }
        r
    }
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // a swap across the diagonal reads clearest with indices
    unsafe fn transpose(t: &mut [V; LANES]) {
        for r in 0..LANES {
            for c in r + 1..LANES {
                let x = t[r][c];
                t[r][c] = t[c][r];
                t[c][r] = x;
            }
        }
    }
}

/// One task of the kernel on the portable build.
///
/// # Safety
/// See [`task::run_task`].
unsafe fn run_task(job: &Job, t: usize, sc: &mut Scratch) {
    task::run_task::<Portable, { Portable::NR }>(job, t, sc)
}

/// Runs every task of `job` on the current rayon pool.
///
/// # Safety
/// `job` must come from views validated by `Problem::check`.
pub(crate) unsafe fn run(job: &Job) {
    task::run::<Portable>(job, run_task)
}
