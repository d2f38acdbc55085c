//! Arithmetic over fixed-size lane arrays (`[f32; N]`), which LLVM turns into vector registers
//! of whatever width the calling function is compiled for. The portable kernels are written once
//! on these and instantiated twice: inside an AVX2+FMA `#[target_feature]` function (`FMA =
//! true`: fused multiply-adds) and for the baseline target (`FMA = false`: a separate multiply
//! and add, since `mul_add` without the instruction is a library call).

/// Coefficients `c1..c6` of `2^f ≈ 1 + c1·f + … + c6·f⁶` on `|f| ≤ 1/2` (least-squares fit of the
/// relative error, ≈ 2e-9 in exact arithmetic; < 1e-7 evaluated in f32 by Horner's rule).
/// (`c1` comes out of the fit as `ln 2` to f32 precision.)
pub(crate) const EXP2_C: [f32; 6] = [
    std::f32::consts::LN_2,
    0.240_226_48,
    0.055_503_29,
    0.009_618_374,
    0.001_339_985_8,
    0.000_153_707_2,
];

/// `2^x` per lane: `x = n + f`, `n = round(x)`, the degree-6 polynomial [`EXP2_C`] for `2^f`, and
/// `2^n` built in the exponent bits. Below −126 (including −inf) exactly 0.
#[inline(always)]
pub(crate) fn exp2_lanes<const FMA: bool, const N: usize>(x: [f32; N]) -> [f32; N] {
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer for |x| ≤ 2^22.
    const ROUND: f32 = 12_582_912.0;
    std::array::from_fn(|e| {
        let xc = x[e].clamp(-126.0, 127.0);
        let n = (xc + ROUND) - ROUND;
        let f = xc - n;
        let mut p = EXP2_C[5];
        for c in EXP2_C[..5].iter().rev() {
            p = madd::<FMA>(p, f, *c);
        }
        p = madd::<FMA>(p, f, 1.0);
        let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
        if x[e] < -126.0 {
            0.0
        } else {
            p * scale
        }
    })
}

/// `a·b + c`, fused when `FMA`.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// [`madd`] per lane.
#[inline(always)]
pub(crate) fn madd_lanes<const FMA: bool, const N: usize>(
    a: [f32; N],
    b: [f32; N],
    c: [f32; N],
) -> [f32; N] {
    std::array::from_fn(|e| madd::<FMA>(a[e], b[e], c[e]))
}

/// `N` floats from `p` (any alignment).
///
/// # Safety
/// `p..p + N` must be readable.
#[inline(always)]
pub(crate) unsafe fn load<const N: usize>(p: *const f32) -> [f32; N] {
    std::ptr::read_unaligned(p as *const [f32; N])
}
