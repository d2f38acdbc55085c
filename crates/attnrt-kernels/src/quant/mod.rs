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
//! which build runs: AVX2 (`vpmaddwd`), or the portable one, and on a CPU with VNNI (probed in
//! `isa.rs`) the VNNI build of the product for narrow weights (below).
//!
//! **VNNI.** `vpdpbusd` sums four u8 × s8 products into each i32 lane, wrapping, without
//! saturating: exact. It multiplies the activations' u8 codes `u` (not minus their zero point)
//! by the narrow weight values `w' = w − zw` (i8), packed for it in quads (four rows of a
//! column side by side, 16 columns per 64 bytes), and the zero point is taken out in i32
//! afterwards: `Σ_p (a − za)·w' = Σ_p u·w' − s·Σ_p w'` with `u = a − za + s` and `s` the rows'
//! shift ([`QuantizedRows`]: `za` for uint8 activations, `za + 128` for int8 ones, moved into
//! u8), the column sums `Σ_p w'` computed once when the weight is packed. In wrapping i32
//! arithmetic the two sides are equal, so the sums are the AVX2 and portable builds', bit for
//! bit. A weight whose values do not all fit i8 (uint8 weights, nonzero int8 zero points) keeps
//! the i16 pairs and the AVX2 kernel. The 512-bit form (AVX512_VNNI) runs where the ISA is
//! AVX-512; the 256-bit VEX form (AVX-VNNI) where the CPU's best ISA is AVX2 (Intel client
//! CPUs). A lowered ISA (`ATTNRT_KERNEL_ISA=avx2` or `scalar`) runs that ISA's own build.

mod avx2;
mod avx512;
mod linear;
mod matmul;
mod portable;
mod rows;
mod vnni;
mod weight;

pub use linear::{quantize_linear, requantize_linear, Requantize};
pub use matmul::{quant_matmul, QuantOutput};
pub use rows::QuantizedRows;
pub use weight::QuantizedWeight;

use crate::isa::{Cpu, Isa};

/// Output columns of one packed panel (two AVX2 vectors of i32).
pub(crate) const NR: usize = 16;
/// Rows of activations one micro-kernel call computes.
pub(crate) const MR: usize = 4;
/// Panels (of `NR` columns) per task of the product, and per register tile of the VNNI builds.
pub(crate) const PANELS: usize = 4;

/// The builds of the integer kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Build {
    /// 256-bit integer vectors: `vpmaddwd` over i16 pairs.
    Avx2,
    /// Plain Rust.
    Portable,
}

/// The VNNI forms of the product of narrow weights (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Vnni {
    /// 512-bit `vpdpbusd` (AVX512_VNNI).
    Zmm,
    /// 256-bit `vpdpbusd` (AVX-VNNI, VEX).
    Ymm,
}

/// The integer projections' part of a [`crate::KernelSet`]: which build runs the quantization
/// of activations and the integer product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantKernel {
    build: Build,
    /// On the AVX2 build, the VNNI product of narrow weights, if any.
    vnni: Option<Vnni>,
}

impl QuantKernel {
    /// The build for `isa` on `cpu` (the caller has checked that the CPU runs `isa`): AVX-512
    /// and AVX2 run the AVX2 build, with the 512-bit VNNI product where the ISA is AVX-512 and
    /// the CPU has it, or the 256-bit one where the ISA is the CPU's best and the CPU has that
    /// form only (or not the 512-bit one).
    pub(crate) fn new(isa: Isa, cpu: &Cpu) -> QuantKernel {
        match isa {
            Isa::Avx512 | Isa::Avx2 => {
                let vnni = if isa == Isa::Avx512 && cpu.vnni.zmm {
                    Some(Vnni::Zmm)
                } else if isa == cpu.best && cpu.vnni.ymm {
                    Some(Vnni::Ymm)
                } else {
                    None
                };
                QuantKernel {
                    build: Build::Avx2,
                    vnni,
                }
            }
            Isa::Scalar => QuantKernel {
                build: Build::Portable,
                vnni: None,
            },
        }
    }

    /// Every build this CPU runs, the portable one first (tests and benches compare them).
    pub fn every_build() -> Vec<QuantKernel> {
        let cpu = Cpu::probe();
        let mut builds = vec![QuantKernel {
            build: Build::Portable,
            vnni: None,
        }];
        if Isa::Avx2.is_available() {
            let vnni = [None, Some(Vnni::Ymm), Some(Vnni::Zmm)];
            let runs = |v: &Option<Vnni>| match v {
                None => true,
                Some(Vnni::Ymm) => cpu.vnni.ymm,
                Some(Vnni::Zmm) => cpu.vnni.zmm,
            };
            builds.extend(vnni.into_iter().filter(runs).map(|vnni| QuantKernel {
                build: Build::Avx2,
                vnni,
            }));
        }
        builds
    }

    /// Whether this is a SIMD build (AVX2, with or without VNNI).
    pub fn is_simd(&self) -> bool {
        self.build == Build::Avx2
    }

    /// Whether narrow weights are packed for and multiplied by `vpdpbusd`.
    pub fn is_vnni(&self) -> bool {
        self.vnni.is_some()
    }
}

/// Names the build for reports: `avx2 vpmaddwd`, `avx512 vnni vpdpbusd (avx2 vpmaddwd for
/// wide weights)`, `avx-vnni vpdpbusd (…)` or `portable`.
impl std::fmt::Display for QuantKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match (self.build, self.vnni) {
            (Build::Avx2, None) => "avx2 vpmaddwd",
            (Build::Avx2, Some(Vnni::Zmm)) => {
                "avx512 vnni vpdpbusd (avx2 vpmaddwd for wide weights)"
            }
            (Build::Avx2, Some(Vnni::Ymm)) => "avx-vnni vpdpbusd (avx2 vpmaddwd for wide weights)",
            (Build::Portable, _) => "portable",
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
