//! The VNNI builds of the integer product of narrow weights (see the module docs of `quant`):
//! `vpdpbusd` multiplies four u8 activation codes, broadcast, by four rows of [`NR`] columns of
//! i8 weight values packed in quads, and adds the four products to each i32 lane, wrapping; the
//! zero points come out at the end as `Σ u·w' − shift·Σ w'`, also wrapping. Register tiles of
//! [`MR`] rows × [`PANELS`] panels (16 zmm accumulators; the 256-bit form, with half as many
//! registers, runs one panel of two ymm per pass), and one row × [`PANELS`] panels for a decode
//! step, whose two sets of accumulators alternate so that an add need not wait for the one
//! before. Each gives [`portable`]'s sums exactly (the tests compare every build).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{MR, NR, PANELS};

/// The sums of `MR` rows of codes by `PANELS` panels, `[panel][row][column]`.
pub(super) type Sums = [[[i32; NR]; MR]; PANELS];

/// Where one tile's operands are.
#[derive(Clone, Copy)]
pub(super) struct Operands {
    /// `MR` rows of `4·k_quads` u8 codes, `stride` apart (one row for the row kernels).
    pub a: *const u8,
    pub stride: usize,
    /// `PANELS` panels of `k_quads × NR × 4` i8 values, `panel_len` apart.
    pub w: *const i8,
    pub panel_len: usize,
    /// `PANELS × NR` column sums.
    pub sums: *const i32,
    pub k_quads: usize,
    /// The rows' shift: `Σ (u − shift)·w'` is wanted.
    pub shift: i32,
}

/// `Σ_q` of the products of four codes of row `r` at quad `q` by the panel's quad-row `q`, then
/// `− shift · sums`, in plain Rust (the reference of the SIMD kernels; the path of a weight in
/// quads on a build without VNNI).
///
/// # Safety
/// `o` must point at valid operands ([`Operands`]).
pub(super) unsafe fn portable(o: Operands) -> Sums {
    let mut out = [[[0i32; NR]; MR]; PANELS];
    for (c, panel) in out.iter_mut().enumerate() {
        for (r, row) in panel.iter_mut().enumerate() {
            for (j, sum) in row.iter_mut().enumerate() {
                let mut acc = 0i32;
                for q in 0..o.k_quads {
                    for i in 0..4 {
                        // SAFETY: within the operands, as the caller vouches.
                        let (u, w) = unsafe {
                            (
                                *o.a.add(r * o.stride + 4 * q + i),
                                *o.w.add(c * o.panel_len + (q * NR + j) * 4 + i),
                            )
                        };
                        acc = acc.wrapping_add(i32::from(u) * i32::from(w));
                    }
                }
                // SAFETY: as above.
                let s = unsafe { *o.sums.add(c * NR + j) };
                *sum = acc.wrapping_sub(o.shift.wrapping_mul(s));
            }
        }
    }
    out
}

/// The 512-bit tile: `MR` rows × `PANELS` panels.
///
/// # Safety
/// The CPU must have AVX512F, AVX512BW and AVX512_VNNI; `o` must point at valid operands.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile_zmm(o: Operands) -> Sums {
    let mut acc = [[_mm512_setzero_si512(); PANELS]; MR];
    for q in 0..o.k_quads {
        // SAFETY: within the operands, as the caller vouches.
        unsafe {
            let w: [__m512i; PANELS] = std::array::from_fn(|c| {
                _mm512_loadu_si512(o.w.add(c * o.panel_len + q * NR * 4).cast())
            });
            for (r, acc) in acc.iter_mut().enumerate() {
                let u = o.a.add(r * o.stride + 4 * q).cast::<i32>().read_unaligned();
                let u = _mm512_set1_epi32(u);
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = _mm512_dpbusd_epi32(*acc, u, w);
                }
            }
        }
    }
    let shift = _mm512_set1_epi32(o.shift);
    let mut out = [[[0i32; NR]; MR]; PANELS];
    for (c, panel) in out.iter_mut().enumerate() {
        // SAFETY: `PANELS × NR` sums; each row of `out` holds 16 i32.
        unsafe {
            let s = _mm512_loadu_si512(o.sums.add(c * NR).cast());
            let correction = _mm512_mullo_epi32(shift, s);
            for (row, acc) in panel.iter_mut().zip(&acc) {
                let v = _mm512_sub_epi32(acc[c], correction);
                _mm512_storeu_si512(row.as_mut_ptr().cast(), v);
            }
        }
    }
    out
}

/// The 512-bit kernel of one row (a decode step) × `PANELS` panels: row 0 of each panel's
/// sums (the others 0).
///
/// # Safety
/// As [`tile_zmm`], for one row of codes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn row_zmm(o: Operands) -> Sums {
    let mut acc = [[_mm512_setzero_si512(); PANELS]; 2];
    // Two quads per step, one into each set (an index by `q % 2` would keep the sets in memory).
    for q in (0..o.k_quads).step_by(2) {
        let next = q + 1 < o.k_quads;
        // SAFETY: within the operands, as the caller vouches (quad `q + 1` only if it exists).
        unsafe {
            let u0 = _mm512_set1_epi32(o.a.add(4 * q).cast::<i32>().read_unaligned());
            for (c, acc) in acc[0].iter_mut().enumerate() {
                let w = _mm512_loadu_si512(o.w.add(c * o.panel_len + q * NR * 4).cast());
                *acc = _mm512_dpbusd_epi32(*acc, u0, w);
            }
            if next {
                let u1 = _mm512_set1_epi32(o.a.add(4 * q + 4).cast::<i32>().read_unaligned());
                for (c, acc) in acc[1].iter_mut().enumerate() {
                    let w = _mm512_loadu_si512(o.w.add(c * o.panel_len + (q + 1) * NR * 4).cast());
                    *acc = _mm512_dpbusd_epi32(*acc, u1, w);
                }
            }
        }
    }
    let shift = _mm512_set1_epi32(o.shift);
    let mut out = [[[0i32; NR]; MR]; PANELS];
    for (c, panel) in out.iter_mut().enumerate() {
        // SAFETY: as in `tile_zmm`.
        unsafe {
            let s = _mm512_loadu_si512(o.sums.add(c * NR).cast());
            let v = _mm512_add_epi32(acc[0][c], acc[1][c]);
            let v = _mm512_sub_epi32(v, _mm512_mullo_epi32(shift, s));
            _mm512_storeu_si512(panel[0].as_mut_ptr().cast(), v);
        }
    }
    out
}

/// The 256-bit tile (AVX-VNNI): `MR` rows × one panel (two ymm) per pass over `k`.
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI; `o` must point at valid operands.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
pub(super) unsafe fn tile_ymm(o: Operands) -> Sums {
    let mut out = [[[0i32; NR]; MR]; PANELS];
    for (c, panel) in out.iter_mut().enumerate() {
        let mut acc = [[_mm256_setzero_si256(); 2]; MR];
        // SAFETY: within the operands, as the caller vouches.
        let w = unsafe { o.w.add(c * o.panel_len) };
        for q in 0..o.k_quads {
            // SAFETY: as above.
            unsafe {
                let w0 = _mm256_loadu_si256(w.add(q * NR * 4).cast());
                let w1 = _mm256_loadu_si256(w.add(q * NR * 4 + 32).cast());
                for (r, acc) in acc.iter_mut().enumerate() {
                    let u = o.a.add(r * o.stride + 4 * q).cast::<i32>().read_unaligned();
                    let u = _mm256_set1_epi32(u);
                    acc[0] = _mm256_dpbusd_avx_epi32(acc[0], u, w0);
                    acc[1] = _mm256_dpbusd_avx_epi32(acc[1], u, w1);
                }
            }
        }
        for (row, acc) in panel.iter_mut().zip(&acc) {
            // SAFETY: `PANELS × NR` sums; `row` holds 16 i32.
            unsafe { store_ymm(row, o, c, acc[0], acc[1]) };
        }
    }
    out
}

/// The 256-bit kernel of one row × `PANELS` panels, as [`row_zmm`].
///
/// # Safety
/// As [`tile_ymm`], for one row of codes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
pub(super) unsafe fn row_ymm(o: Operands) -> Sums {
    let mut acc = [[_mm256_setzero_si256(); 2]; PANELS];
    for q in 0..o.k_quads {
        // SAFETY: within the operands, as the caller vouches.
        unsafe {
            let u = _mm256_set1_epi32(o.a.add(4 * q).cast::<i32>().read_unaligned());
            for (c, acc) in acc.iter_mut().enumerate() {
                let w = o.w.add(c * o.panel_len + q * NR * 4);
                let (w0, w1) = (
                    _mm256_loadu_si256(w.cast()),
                    _mm256_loadu_si256(w.add(32).cast()),
                );
                acc[0] = _mm256_dpbusd_avx_epi32(acc[0], u, w0);
                acc[1] = _mm256_dpbusd_avx_epi32(acc[1], u, w1);
            }
        }
    }
    let mut out = [[[0i32; NR]; MR]; PANELS];
    for (c, (panel, acc)) in out.iter_mut().zip(&acc).enumerate() {
        // SAFETY: as in `tile_ymm`.
        unsafe { store_ymm(&mut panel[0], o, c, acc[0], acc[1]) };
    }
    out
}

/// `row = [lo, hi] − shift · sums[panel c]`, wrapping.
///
/// # Safety
/// The CPU must have AVX2; `o.sums` must hold `PANELS × NR` sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn store_ymm(row: &mut [i32; NR], o: Operands, c: usize, lo: __m256i, hi: __m256i) {
    let shift = _mm256_set1_epi32(o.shift);
    // SAFETY: as the caller vouches; `row` holds 16 i32.
    unsafe {
        let s = o.sums.add(c * NR);
        let s0 = _mm256_mullo_epi32(shift, _mm256_loadu_si256(s.cast()));
        let s1 = _mm256_mullo_epi32(shift, _mm256_loadu_si256(s.add(8).cast()));
        _mm256_storeu_si256(row.as_mut_ptr().cast(), _mm256_sub_epi32(lo, s0));
        _mm256_storeu_si256(row.as_mut_ptr().add(8).cast(), _mm256_sub_epi32(hi, s1));
    }
}

/// Never called: the VNNI builds are chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn tile_zmm(_: Operands) -> Sums {
    unreachable!("the VNNI builds run on x86_64 only")
}

/// Never called: the VNNI builds are chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn row_zmm(_: Operands) -> Sums {
    unreachable!("the VNNI builds run on x86_64 only")
}

/// Never called: the VNNI builds are chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn tile_ymm(_: Operands) -> Sums {
    unreachable!("the VNNI builds run on x86_64 only")
}

/// Never called: the VNNI builds are chosen only on x86_64.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn row_ymm(_: Operands) -> Sums {
    unreachable!("the VNNI builds run on x86_64 only")
}
