//! AVX2+FMA register tiles of the decode path: the two loops that touch every K and V element,
//! and the softmax of a block (with the flash kernel's `2^x`).
//! The lane-array versions in `block` compile to a mix of xmm and scalar code (LLVM's SLP
//! vectorizer does not always form whole ymm registers across the tile), so the hot tiles are
//! spelled with intrinsics here; everything else stays portable.

use std::arch::x86_64::*;

use super::KB;
use crate::flash::avx2::vexp2;

/// `s[r·KB + kk] = q[r] · k[kk]` for an `NR × NK` tile (`NR·NK` ymm accumulators, NR ≤ 4, NK ≤ 2;
/// columns past the last multiple of 8 in scalar FMAs).
///
/// # Safety
/// AVX2 and FMA available; `q` holds `NR` rows of `d` floats (`d` apart), each `k[kk]` `d`
/// floats, `s` the tile's `NR` rows of `KB`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn dot_tile<const NR: usize, const NK: usize>(
    q: *const f32,
    d: usize,
    k: [*const f32; NK],
    s: *mut f32,
) {
    let mut acc = [[_mm256_setzero_ps(); NK]; NR];
    let chunks = d / 8;
    for c in 0..chunks {
        let kc: [__m256; NK] = std::array::from_fn(|kk| _mm256_loadu_ps(k[kk].add(c * 8)));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let qc = _mm256_loadu_ps(q.add(r * d + c * 8));
            for kk in 0..NK {
                acc_r[kk] = _mm256_fmadd_ps(qc, kc[kk], acc_r[kk]);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for kk in 0..NK {
            let mut total = hsum(acc_r[kk]);
            for e in chunks * 8..d {
                total = (*q.add(r * d + e)).mul_add(*k[kk].add(e), total);
            }
            *s.add(r * KB + kk) = total;
        }
    }
}

/// `o[r] = α[r]·o[r] + Σₜ p[r·KB + t]·v[t]` for `NR ≤ 4` rows: 16 columns at a time in `2·NR`
/// ymm accumulators, each V row loaded once for all rows; the last `dv mod 16` columns in
/// scalar FMAs.
///
/// # Safety
/// AVX2 and FMA available; `p` holds `NR` rows of `KB`, `v[..nb]` rows of `dv`, `alpha` `NR`
/// factors, `o` `NR` rows of `dv`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn pv_rows<const NR: usize>(
    p: *const f32,
    v: &[*const f32; KB],
    nb: usize,
    alpha: *const f32,
    o: *mut f32,
    dv: usize,
) {
    let chunks = dv / 16;
    for c in 0..chunks {
        let mut acc = [[_mm256_setzero_ps(); 2]; NR];
        for (t, vt) in v.iter().enumerate().take(nb) {
            let v0 = _mm256_loadu_ps(vt.add(c * 16));
            let v1 = _mm256_loadu_ps(vt.add(c * 16 + 8));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let pr = _mm256_broadcast_ss(&*p.add(r * KB + t));
                acc_r[0] = _mm256_fmadd_ps(pr, v0, acc_r[0]);
                acc_r[1] = _mm256_fmadd_ps(pr, v1, acc_r[1]);
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            let a = _mm256_broadcast_ss(&*alpha.add(r));
            for (half, acc_h) in acc_r.iter().enumerate() {
                let dst = o.add(r * dv + c * 16 + half * 8);
                _mm256_storeu_ps(dst, _mm256_fmadd_ps(a, _mm256_loadu_ps(dst), *acc_h));
            }
        }
    }
    for e in chunks * 16..dv {
        for r in 0..NR {
            let mut total = 0.0f32;
            for (t, vt) in v.iter().enumerate().take(nb) {
                total = (*p.add(r * KB + t)).mul_add(*vt.add(e), total);
            }
            let dst = o.add(r * dv + e);
            *dst = (*alpha.add(r)).mul_add(*dst, total);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum(x: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// One block of the online softmax of a row (see `block::softmax_row`, whose contract this
/// keeps): running max and sum updated, `s` turned into `p = 2^((s − m)·log2 e)`, `α` returned.
///
/// # Safety
/// AVX2 and FMA available; `srow` holds `KB` scores.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn softmax_row(srow: *mut f32, m: &mut f32, l: &mut f32) -> f32 {
    let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
    for c in 0..KB / 8 {
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(srow.add(c * 8)));
    }
    let m_new = hmax(mx).max(*m);
    let m_use = if m_new == f32::NEG_INFINITY {
        0.0
    } else {
        m_new
    };
    let log2e = _mm256_set1_ps(std::f32::consts::LOG2_E);
    let alpha = _mm256_cvtss_f32(vexp2(_mm256_mul_ps(_mm256_set1_ps(*m - m_use), log2e)));
    let mu = _mm256_set1_ps(m_use);
    let mut sum = _mm256_setzero_ps();
    for c in 0..KB / 8 {
        let p = vexp2(_mm256_mul_ps(
            _mm256_sub_ps(_mm256_loadu_ps(srow.add(c * 8)), mu),
            log2e,
        ));
        _mm256_storeu_ps(srow.add(c * 8), p);
        sum = _mm256_add_ps(sum, p);
    }
    *l = alpha.mul_add(*l, hsum(sum));
    *m = m_new;
    alpha
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn hmax(x: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}
