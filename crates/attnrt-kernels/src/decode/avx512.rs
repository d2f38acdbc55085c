//! AVX-512 register tiles of the decode path, for head sizes that are a multiple of 16: the
//! two loops that touch every K and V element. On a CPU with 512-bit FMAs they halve the
//! instructions per key of the AVX2 tiles (`super::avx2`), which the split runs for everything
//! else (the softmax, the keys past the last group of four, head sizes not a multiple of 16).
//!
//! * Scores, four keys at a time: `NR × 4` zmm accumulators over the head, then the four sums
//!   of a row out of its four accumulators in one shuffle tree (13 instructions where four
//!   horizontal sums took about 30).
//! * `P·V`, keys outer: a V row is loaded once as up to four zmm, and each row's weight is
//!   broadcast once for all of them. Per output element the arithmetic is the AVX2 tile's
//!   (`acc = p·v + acc` over the keys in order, then `o = α·o + acc`), so outputs are the same
//!   bits.

use std::arch::x86_64::*;

use super::KB;

/// `s[r·KB + kk] = q[r] · k[kk]` for `NR` rows × 4 keys.
///
/// # Safety
/// AVX-512F available; `d` a multiple of 16; `q` holds `NR` rows of `d` floats (`d` apart),
/// each `k[kk]` `d` floats, `s` the tile's `NR` rows of `KB` (from this key on, at least 4).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn dot_tile4<const NR: usize>(
    q: *const f32,
    d: usize,
    k: [*const f32; 4],
    s: *mut f32,
) {
    let mut acc = [[_mm512_setzero_ps(); 4]; NR];
    for c in 0..d / 16 {
        let kc: [__m512; 4] = std::array::from_fn(|kk| _mm512_loadu_ps(k[kk].add(c * 16)));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let qc = _mm512_loadu_ps(q.add(r * d + c * 16));
            for kk in 0..4 {
                acc_r[kk] = _mm512_fmadd_ps(qc, kc[kk], acc_r[kk]);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        _mm_storeu_ps(s.add(r * KB), sum4(acc_r));
    }
}

/// The horizontal sums of four vectors, `[Σx₀, Σx₁, Σx₂, Σx₃]`.
#[target_feature(enable = "avx512f")]
#[inline]
fn sum4(x: &[__m512; 4]) -> __m128 {
    // In each 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, d.
    let ab = _mm512_add_ps(
        _mm512_unpacklo_ps(x[0], x[1]),
        _mm512_unpackhi_ps(x[0], x[1]),
    );
    let cd = _mm512_add_ps(
        _mm512_unpacklo_ps(x[2], x[3]),
        _mm512_unpackhi_ps(x[2], x[3]),
    );
    // [a0+a2, b0+b2, c0+c2, d0+d2] + [a1+a3, b1+b3, c1+c3, d1+d3]: each block's four sums.
    let lo = _mm512_shuffle_ps::<0b01_00_01_00>(ab, cd);
    let hi = _mm512_shuffle_ps::<0b11_10_11_10>(ab, cd);
    let s = _mm512_add_ps(lo, hi);
    // The four blocks added: halves swapped, then neighbours swapped.
    let s = _mm512_add_ps(s, _mm512_shuffle_f32x4::<0b01_00_11_10>(s, s));
    let s = _mm512_add_ps(s, _mm512_shuffle_f32x4::<0b10_11_00_01>(s, s));
    _mm512_castps512_ps128(s)
}

/// `o[r] = α[r]·o[r] + Σₜ p[r·KB + t]·v[t]` for `NR ≤ 4` rows, 64 value columns at a time.
///
/// # Safety
/// AVX-512F available; `dv` a multiple of 16; `p` holds `NR` rows of `KB`, `v[..nb]` rows of
/// `dv`, `alpha` `NR` factors, `o` `NR` rows of `dv`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn pv_rows<const NR: usize>(
    p: *const f32,
    v: &[*const f32; KB],
    nb: usize,
    alpha: *const f32,
    o: *mut f32,
    dv: usize,
) {
    let tile = PvTile {
        p,
        v,
        nb,
        alpha,
        o,
        dv,
    };
    let mut c0 = 0;
    while c0 < dv {
        match (dv - c0) / 16 {
            1 => tile.columns::<NR, 1>(c0),
            2 => tile.columns::<NR, 2>(c0),
            3 => tile.columns::<NR, 3>(c0),
            _ => tile.columns::<NR, 4>(c0),
        }
        c0 += 64;
    }
}

/// The operands of [`pv_rows`].
struct PvTile<'a> {
    p: *const f32,
    v: &'a [*const f32; KB],
    nb: usize,
    alpha: *const f32,
    o: *mut f32,
    dv: usize,
}

impl PvTile<'_> {
    /// Columns `c0..c0 + 16·W` of every row.
    ///
    /// # Safety
    /// As [`pv_rows`]; `c0 + 16·W ≤ dv`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn columns<const NR: usize, const W: usize>(&self, c0: usize) {
        let mut acc = [[_mm512_setzero_ps(); W]; NR];
        for (t, vt) in self.v.iter().enumerate().take(self.nb) {
            let vc: [__m512; W] = std::array::from_fn(|c| _mm512_loadu_ps(vt.add(c0 + c * 16)));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let pr = _mm512_set1_ps(*self.p.add(r * KB + t));
                for (a, v) in acc_r.iter_mut().zip(vc) {
                    *a = _mm512_fmadd_ps(pr, v, *a);
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            let a = _mm512_set1_ps(*self.alpha.add(r));
            for (c, acc_c) in acc_r.iter().enumerate() {
                let dst = self.o.add(r * self.dv + c0 + c * 16);
                _mm512_storeu_ps(dst, _mm512_fmadd_ps(a, _mm512_loadu_ps(dst), *acc_c));
            }
        }
    }
}
