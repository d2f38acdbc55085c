//! The vector operations the flash kernel is written over, and its tile shapes, per ISA.
//!
//! The kernel ([`super::task`], [`super::tiles`], [`super::bias`], [`super::pack`]) is generic
//! over a [`FlashSimd`]; each ISA module (`avx512.rs`, `avx2.rs`, `portable.rs`) implements it
//! and compiles one task of the kernel inside a function carrying its `#[target_feature]`. Every
//! function of the kernel and every method of an implementation is `#[inline(always)]`, so the
//! whole task is one function compiled for the ISA, its vector operations inlined into it (a
//! generic function left out of line would be compiled for the baseline target, and the
//! intrinsics inside it would become calls).

/// Most lanes of a vector (AVX-512's 16), for the kernel's fixed-size local arrays.
pub(crate) const MAX_LANES: usize = 16;
/// Most queries of a block (`LANES·NR`, AVX-512's 64).
pub(crate) const MAX_BQ: usize = 64;
/// Most query blocks of a task (AVX-512's 16).
pub(crate) const MAX_QSUB: usize = 16;

/// One ISA's `f32` vector, its operations, and the tiles of the flash kernel on it.
///
/// # Safety
/// An implementation may use the instructions of its ISA in every method: callers must call
/// them only on a CPU that has the ISA, from a function compiled with its target features (where
/// they inline). `LANES`, `NR`, `MR`, `BK` and `QSUB_MAX` must satisfy the bounds of
/// [`check_tiles`].
pub(crate) unsafe trait FlashSimd {
    /// A vector of `LANES` floats.
    type V: Copy;
    /// `LANES` vectors: a `LANES`×`LANES` tile transposed in registers.
    type Tile: Copy + AsRef<[Self::V]> + AsMut<[Self::V]>;
    /// Floats per vector.
    const LANES: usize;
    /// Vectors of queries per block.
    const NR: usize;
    /// Keys (or value columns) per register tile.
    const MR: usize;
    /// Queries per block.
    const BQ: usize = Self::LANES * Self::NR;
    /// Keys per packed K/V block.
    const BK: usize;
    /// At most this many query blocks per task (they share each packed K/V block; see
    /// `flash::choose_qsub`).
    const QSUB_MAX: usize;

    /// All lanes 0.
    unsafe fn zero() -> Self::V;
    /// A tile of zero vectors.
    unsafe fn zero_tile() -> Self::Tile;
    /// All lanes `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// `LANES` floats from `p` (any alignment).
    unsafe fn load(p: *const f32) -> Self::V;
    /// `LANES` floats to `p` (any alignment).
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a·b + c` (fused where the ISA has FMA).
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a·b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum (the ISA's rule for NaN).
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `2^x` (the softmax takes `(s − max)·log2 e`); below −126 exactly 0, NaN stays NaN.
    unsafe fn exp2(x: Self::V) -> Self::V;
    /// Whether every lane is exactly 1 (a softmax rescale factor that changes nothing).
    unsafe fn all_one(v: Self::V) -> bool;
    /// `v` with `−inf` lanes replaced by 0 (the safe softmax reference of a still-empty row).
    unsafe fn zero_if_neg_inf(v: Self::V) -> Self::V;
    /// A hint to fetch the line of `p` into all cache levels (nothing where there is none).
    unsafe fn prefetch(p: *const f32);
    /// The first `live` lanes gather `base[idx[lane]]`, the others are 0 (and read nothing).
    unsafe fn gather(base: *const f32, idx: *const i32, live: usize) -> Self::V;
    /// Transposes the tile: afterwards `t[c][r]` is the old `t[r][c]`.
    unsafe fn transpose(t: &mut Self::Tile);
}

/// Compile-time bounds on an implementation's tiles (evaluated when a task is instantiated).
pub(crate) const fn check_tiles(lanes: usize, nr: usize, mr: usize, bk: usize, qsub: usize) {
    // The remainder dispatch of the tile loops covers tiles of 1..=7 rows.
    assert!(mr >= 1 && mr <= 8 && nr >= 1 && qsub >= 1 && bk >= 1);
    assert!(lanes <= MAX_LANES && lanes * nr <= MAX_BQ && qsub <= MAX_QSUB);
}
