//! The AVX2+FMA build of the panel kernel, shaped for the few tokens of a (batched) decode step,
//! where the weights stream from memory: per block of [`KC`] panel rows (16 KB), each token in
//! turn runs the block's rows with the panel's 64 outputs in eight ymm accumulators. The first
//! token reads the block from memory in order (the hardware prefetchers follow it; software
//! prefetches of the next block measured 1–18 % slower), the others reuse it from L1, so a batch
//! reads each panel once. Each token's sums run in the same order (per block, input features in
//! order) whatever the other tokens, so a batch row's outputs are those of the row alone.

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::lanes::store_strip;
use super::{Onto, PanelProduct, PANEL, STRIP};

/// Panel rows per block: 16 KB, half of L1.
const KC: usize = 64;

/// ymm registers per panel row.
const VECS: usize = PANEL / 8;

/// 64-byte lines per panel row.
const ROW_LINES: usize = PANEL * 4 / 64;

/// Measurement knobs (temporary): prefetch distance in blocks (0: none), hint (0 T0, 1 T1,
/// 2 T2, 3 NTA), whether a single token prefetches too.
pub(super) static DISTANCE: AtomicUsize = AtomicUsize::new(0);
pub(super) static HINT: AtomicUsize = AtomicUsize::new(1);
pub(super) static SINGLE: AtomicUsize = AtomicUsize::new(0);
pub(super) static SUB: AtomicUsize = AtomicUsize::new(0);
pub(super) static FAST_STORE: AtomicUsize = AtomicUsize::new(1);
pub(super) static GROUPED: AtomicUsize = AtomicUsize::new(0);

/// Most tokens whose accumulators one pass keeps.
const GROUP: usize = 8;

/// [`super::panel_product_raw`] on AVX2+FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA; the asserts of `panel_product_raw` passed.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn product(p: &PanelProduct, y: *mut f32, y_stride: usize) {
    let distance = DISTANCE.load(Ordering::Relaxed);
    let prefetching = distance > 0 && (p.tokens > 1 || SINGLE.load(Ordering::Relaxed) != 0);
    let hint_bits = HINT.load(Ordering::Relaxed);
    let (hint, step) = (hint_bits & 3, 64usize << (hint_bits >> 2));
    let sub = SUB.load(Ordering::Relaxed);
    if sub > 0 {
        let mut g0 = 0;
        while g0 < p.tokens {
            let g1 = (g0 + GROUP).min(p.tokens);
            unsafe {
                interleaved(
                    p,
                    g0..g1,
                    y,
                    y_stride,
                    sub,
                    if prefetching { distance } else { 0 },
                    hint,
                )
            };
            g0 = g1;
        }
        return;
    }
    let mut k0 = 0;
    while k0 < p.k {
        let kc = KC.min(p.k - k0);
        let (after_first, last) = (k0 > 0, k0 + kc == p.k);
        // SAFETY: the asserts of `panel_product_raw` keep the block's panel rows and each
        // token's inputs `k0..k0 + kc` inside their slices; row `t` of `y` is the caller's.
        let w = unsafe { p.panel.as_ptr().add(k0 * PANEL) };
        // The block `distance` ahead (past the panel: the next one, as the tasks run them;
        // a prefetch is a hint and never faults).
        let ahead = w.wrapping_add(distance * KC * PANEL) as *const i8;
        let lines = KC * ROW_LINES * 64 / step;
        let grouped = GROUPED.load(Ordering::Relaxed);
        let mut t = 0;
        while t < p.tokens {
            if t > 0 && grouped >= 2 && p.tokens - t >= grouped {
                let share = |i: usize| ahead_share(prefetching, ahead, (t + i) * lines / p.tokens);
                let (from, to) = (share(0), share(grouped));
                let acc = unsafe {
                    match grouped {
                        2 => group_block::<2>(p, t, k0, kc, w, from, to, hint)
                            .map(|a| {
                                store_token(p, &a.1, y.add(a.0 * y_stride), after_first, last);
                            })
                            .len(),
                        _ => group_block::<3>(p, t, k0, kc, w, from, to, hint)
                            .map(|a| {
                                store_token(p, &a.1, y.add(a.0 * y_stride), after_first, last);
                            })
                            .len(),
                    }
                };
                t += acc;
                continue;
            }
            let x = unsafe { p.x.as_ptr().add(t * p.x_stride + k0) };
            let pf = if prefetching {
                Prefetch {
                    base: ahead,
                    from: t * lines / p.tokens,
                    to: (t + 1) * lines / p.tokens,
                    step,
                }
            } else {
                Prefetch::NONE
            };
            let acc = unsafe {
                match hint {
                    _ if !prefetching => token_block::<false, _MM_HINT_T0>(x, w, kc, pf),
                    0 => token_block::<true, _MM_HINT_T0>(x, w, kc, pf),
                    1 => token_block::<true, _MM_HINT_T1>(x, w, kc, pf),
                    2 => token_block::<true, _MM_HINT_T2>(x, w, kc, pf),
                    _ => token_block::<true, _MM_HINT_NTA>(x, w, kc, pf),
                }
            };
            let yr = unsafe { y.add(t * y_stride) };
            unsafe { store_token(p, &acc, yr, after_first, last) };
            t += 1;
        }
        k0 += kc;
    }
}

/// The lines `from..to` (64 bytes each) after `base` to prefetch, spread evenly over a block's
/// row iterations.
#[derive(Clone, Copy)]
struct Prefetch {
    base: *const i8,
    from: usize,
    to: usize,
    step: usize,
}

impl Prefetch {
    const NONE: Prefetch = Prefetch {
        base: std::ptr::null(),
        from: 0,
        to: 0,
        step: 64,
    };
}

/// `Σ x[kk] · w[kk·PANEL..][..PANEL]` over `kk < kc`, in order, prefetching `pf`'s lines.
///
/// # Safety
/// AVX2 and FMA available; `x..x + kc` and `w..w + kc·PANEL` readable.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn token_block<const PF: bool, const HINT: i32>(
    x: *const f32,
    w: *const f32,
    kc: usize,
    pf: Prefetch,
) -> [__m256; VECS] {
    let mut acc = [_mm256_setzero_ps(); VECS];
    let n = pf.to - pf.from;
    let (mut line, mut owed) = (pf.base.wrapping_add(pf.from * pf.step), 0);
    for kk in 0..kc {
        if PF {
            owed += n;
            while owed >= kc {
                _mm_prefetch::<HINT>(line);
                line = line.wrapping_add(pf.step);
                owed -= kc;
            }
        }
        // SAFETY: as the caller vouches.
        let (a, row) = unsafe { (_mm256_broadcast_ss(&*x.add(kk)), w.add(kk * PANEL)) };
        for (j, acc_j) in acc.iter_mut().enumerate() {
            let wv = unsafe { _mm256_loadu_ps(row.add(j * 8)) };
            *acc_j = _mm256_fmadd_ps(a, wv, *acc_j);
        }
    }
    acc
}

/// Tokens `group` of `p` (at most [`GROUP`]), sub-block by sub-block of `sub` rows: every token
/// runs a sub-block before the next one is read, each token's sums kept in `acc` between
/// sub-blocks (the same fused multiply-adds in the same order as [`product`]).
#[target_feature(enable = "avx2,fma")]
unsafe fn interleaved(
    p: &PanelProduct,
    group: std::ops::Range<usize>,
    y: *mut f32,
    y_stride: usize,
    sub: usize,
    distance: usize,
    hint: usize,
) {
    let tokens = group.len();
    let mut k0 = 0;
    while k0 < p.k {
        let kc = KC.min(p.k - k0);
        let (after_first, last) = (k0 > 0, k0 + kc == p.k);
        let w = unsafe { p.panel.as_ptr().add(k0 * PANEL) };
        let ahead = w.wrapping_add(distance * KC * PANEL) as *const i8;
        let mut acc = [[_mm256_setzero_ps(); VECS]; GROUP];
        let mut r0 = 0;
        while r0 < kc {
            let rows = sub.min(kc - r0);
            let wr = unsafe { w.add(r0 * PANEL) };
            for (i, t) in group.clone().enumerate() {
                let x = unsafe { p.x.as_ptr().add(t * p.x_stride + k0 + r0) };
                let pf = if distance > 0 {
                    let lines = rows * ROW_LINES;
                    Prefetch {
                        base: ahead.wrapping_add(r0 * PANEL * 4),
                        from: i * lines / tokens,
                        to: (i + 1) * lines / tokens,
                        step: 64,
                    }
                } else {
                    Prefetch::NONE
                };
                acc[i] = unsafe {
                    match hint {
                        _ if distance == 0 => {
                            token_rows::<false, _MM_HINT_T0>(x, wr, rows, pf, acc[i])
                        }
                        0 => token_rows::<true, _MM_HINT_T0>(x, wr, rows, pf, acc[i]),
                        1 => token_rows::<true, _MM_HINT_T1>(x, wr, rows, pf, acc[i]),
                        2 => token_rows::<true, _MM_HINT_T2>(x, wr, rows, pf, acc[i]),
                        _ => token_rows::<true, _MM_HINT_NTA>(x, wr, rows, pf, acc[i]),
                    }
                };
            }
            r0 += rows;
        }
        for (i, t) in group.clone().enumerate() {
            let yr = unsafe { y.add(t * y_stride) };
            unsafe { store_token(p, &acc[i], yr, after_first, last) };
        }
        k0 += kc;
    }
}

/// `acc + Σ x[kk] · w[kk·PANEL..][..PANEL]` over `kk < rows`, in order, prefetching `pf`'s lines.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn token_rows<const PF: bool, const HINT: i32>(
    x: *const f32,
    w: *const f32,
    rows: usize,
    pf: Prefetch,
    mut acc: [__m256; VECS],
) -> [__m256; VECS] {
    let n = pf.to - pf.from;
    let (mut line, mut owed) = (pf.base.wrapping_add(pf.from * 64), 0);
    for kk in 0..rows {
        if PF {
            owed += n;
            while owed >= rows {
                _mm_prefetch::<HINT>(line);
                line = line.wrapping_add(64);
                owed -= rows;
            }
        }
        let (a, row) = unsafe { (_mm256_broadcast_ss(&*x.add(kk)), w.add(kk * PANEL)) };
        for (j, acc_j) in acc.iter_mut().enumerate() {
            let wv = unsafe { _mm256_loadu_ps(row.add(j * 8)) };
            *acc_j = _mm256_fmadd_ps(a, wv, *acc_j);
        }
    }
    acc
}

/// Stores one token's block: `y = act(alpha·acc + addend)`, the addend `p.onto` for the first
/// block and `y` itself after it, the activation at the last block only. A full panel with no
/// activation to apply stores straight from the registers (the same fused multiply-add as
/// `store_strip`'s); the rest goes strip by strip through `store_strip`.
///
/// # Safety
/// AVX2 and FMA available; `yr..yr + p.width` is the caller's.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn store_token(
    p: &PanelProduct,
    acc: &[__m256; VECS],
    yr: *mut f32,
    after_first: bool,
    last: bool,
) {
    if FAST_STORE.load(Ordering::Relaxed) != 0
        && p.width == PANEL
        && !(last && p.activation.is_some())
    {
        let alpha = _mm256_set1_ps(p.alpha);
        for (j, acc_j) in acc.iter().enumerate() {
            // SAFETY: as the caller vouches; a bias row holds `p.width` values.
            unsafe {
                let addend = match p.onto {
                    _ if after_first => _mm256_loadu_ps(yr.add(j * 8)),
                    Onto::Zero => _mm256_setzero_ps(),
                    Onto::Output => _mm256_loadu_ps(yr.add(j * 8)),
                    Onto::Row(row) => _mm256_loadu_ps(row.as_ptr().add(j * 8)),
                };
                _mm256_storeu_ps(yr.add(j * 8), _mm256_fmadd_ps(alpha, *acc_j, addend));
            }
        }
        return;
    }
    for s in 0..PANEL / STRIP {
        if s * STRIP >= p.width {
            break;
        }
        let mut sums = [0.0f32; STRIP];
        // SAFETY: `sums` holds two vectors; the output row is the caller's.
        unsafe {
            _mm256_storeu_ps(sums.as_mut_ptr(), acc[2 * s]);
            _mm256_storeu_ps(sums.as_mut_ptr().add(8), acc[2 * s + 1]);
            store_strip::<true>(p, s, &sums, yr, after_first, last);
        }
    }
}

fn ahead_share(prefetching: bool, ahead: *const i8, line: usize) -> Prefetch {
    Prefetch {
        base: ahead,
        from: if prefetching { line } else { 0 },
        to: if prefetching { line } else { 0 },
        step: 64,
    }
}

/// Tokens `t0..t0 + N` against the block, the panel in two halves of 32 outputs: per row four
/// weight vectors loaded once for the N tokens.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn group_block<const N: usize>(
    p: &PanelProduct,
    t0: usize,
    k0: usize,
    kc: usize,
    w: *const f32,
    from: Prefetch,
    to: Prefetch,
    hint: usize,
) -> [(usize, [__m256; VECS]); N] {
    let xs: [*const f32; N] =
        std::array::from_fn(|i| unsafe { p.x.as_ptr().add((t0 + i) * p.x_stride + k0) });
    let mid = (from.from + to.from) / 2;
    let halves: [[[__m256; 4]; N]; 2] = std::array::from_fn(|h| {
        let pf = Prefetch {
            step: 64,
            base: from.base,
            from: if h == 0 { from.from } else { mid },
            to: if h == 0 { mid } else { to.from },
        };
        let wh = unsafe { w.add(h * 32) };
        unsafe {
            match hint {
                _ if pf.base.is_null() || from.from == to.from => {
                    group_half::<N, false, _MM_HINT_T0>(xs, wh, kc, pf)
                }
                0 => group_half::<N, true, _MM_HINT_T0>(xs, wh, kc, pf),
                1 => group_half::<N, true, _MM_HINT_T1>(xs, wh, kc, pf),
                2 => group_half::<N, true, _MM_HINT_T2>(xs, wh, kc, pf),
                _ => group_half::<N, true, _MM_HINT_NTA>(xs, wh, kc, pf),
            }
        }
    });
    std::array::from_fn(|i| {
        let mut acc = [_mm256_setzero_ps(); VECS];
        acc[..4].copy_from_slice(&halves[0][i]);
        acc[4..].copy_from_slice(&halves[1][i]);
        (t0 + i, acc)
    })
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn group_half<const N: usize, const PF: bool, const HINT: i32>(
    xs: [*const f32; N],
    w: *const f32,
    kc: usize,
    pf: Prefetch,
) -> [[__m256; 4]; N] {
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    let n = pf.to - pf.from;
    let (mut line, mut owed) = (pf.base.wrapping_add(pf.from * 64), 0);
    for kk in 0..kc {
        if PF {
            owed += n;
            while owed >= kc {
                _mm_prefetch::<HINT>(line);
                line = line.wrapping_add(64);
                owed -= kc;
            }
        }
        let row = unsafe { w.add(kk * PANEL) };
        let wv: [__m256; 4] = std::array::from_fn(|j| unsafe { _mm256_loadu_ps(row.add(j * 8)) });
        for (i, acc_i) in acc.iter_mut().enumerate() {
            let a = unsafe { _mm256_broadcast_ss(&*xs[i].add(kk)) };
            for (j, acc_ij) in acc_i.iter_mut().enumerate() {
                *acc_ij = _mm256_fmadd_ps(a, wv[j], *acc_ij);
            }
        }
    }
    acc
}
