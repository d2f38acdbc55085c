//! Integer projections of dynamically quantized models (ONNX Runtime's `quantize_dynamic`):
//! `y = act(a_scale·w_scale[j] · Σ_p (a[i,p] − a_zp)·(w[p,j] − w_zp[j]) + bias[j])` with `a`
//! the activations quantized per tensor to u8 (`DynamicQuantizeLinear`, [`QuantizedRows`]) and
//! `w` an int8 or uint8 weight with a zero point per tensor or per column
//! ([`QuantizedWeight`], packed once).
//!
//! **Exact.** Both operands have their zero points subtracted as they are widened to i16 (a
//! quantized activation minus its zero point lies in [−255, 255], and so does a weight minus its
//! own), and the products are summed in i32 by `vpmaddwd` on AVX2 (two i16·i16 products per i32
//! lane, at most 2·255² = 130 050: nothing saturates, unlike `vpmaddubsw`'s 16-bit sums) or by
//! plain i32 arithmetic on the portable path. So every path gives the same i32 sums as
//! `MatMulInteger` (wrapping on overflow, past about 33 000 terms of extreme values, as the i32
//! arithmetic of the graph does), and the float epilogue is the graph's own sequence of
//! roundings: `f32(sum) · f32(a_scale · w_scale[j])`, then `+ bias[j]` (no fused multiply-add).
//!
//! **Dispatch.** [`QuantKernel`] is the part of the session's [`crate::KernelSet`] that says
//! which build runs: AVX2 (also on AVX-512 CPUs), or the portable one. A slot is left for an
//! AVX-512 VNNI / AVX-VNNI build (`vpdpwssd` accumulates the same i16 pairs in one instruction;
//! `vpdpbusd` needs u8 × s8 operands and a correction of the zero points): not written, as no
//! CPU here has VNNI to test it on.

mod avx2;
mod linear;
mod matmul;
mod portable;
mod rows;
mod weight;

pub use linear::{quantize_linear, requantize_linear, Requantize};
pub use matmul::{quant_matmul, QuantOutput};
pub use rows::QuantizedRows;
pub use weight::QuantizedWeight;

use crate::isa::Isa;

/// Output columns of one packed panel (two AVX2 vectors of i32).
pub(crate) const NR: usize = 16;
/// Rows of activations one micro-kernel call computes.
pub(crate) const MR: usize = 4;

/// The builds of the integer kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Build {
    /// 256-bit integer vectors: `vpmaddwd` over i16 pairs.
    Avx2,
    /// Plain Rust.
    Portable,
}

/// The integer projections' part of a [`crate::KernelSet`]: which build runs the quantization
/// of activations and the integer product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantKernel {
    build: Build,
}

impl QuantKernel {
    /// The build for `isa` (the caller has checked that the CPU runs it). AVX-512 CPUs run the
    /// AVX2 build: a VNNI build (AVX512_VNNI / AVX-VNNI, probed in `isa.rs`) would go here.
    pub(crate) fn new(isa: Isa) -> QuantKernel {
        let build = match isa {
            Isa::Avx512 | Isa::Avx2 => Build::Avx2,
            Isa::Scalar => Build::Portable,
        };
        QuantKernel { build }
    }

    /// Whether this is the SIMD build (AVX2).
    pub fn is_simd(&self) -> bool {
        self.build == Build::Avx2
    }
}

/// Names the build for reports: `avx2 vpmaddwd` or `portable`.
impl std::fmt::Display for QuantKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.build {
            Build::Avx2 => "avx2 vpmaddwd",
            Build::Portable => "portable",
        })
    }
}

#[cfg(test)]
mod tests;

/// The 8-bit type `QuantizeLinear` writes, and its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quantized {
    /// uint8, `[0, 255]`
    U8,
    /// int8, `[−128, 127]` (stored as its bytes)
    I8,
}

impl Quantized {
    /// The type's range, as floats.
    pub(crate) fn bounds(self) -> (f32, f32) {
        match self {
            Quantized::U8 => (0.0, 255.0),
            Quantized::I8 => (-128.0, 127.0),
        }
    }
}
