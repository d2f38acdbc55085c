//! The kernels one session runs, decided once: the ISA (the CPU's best, or what
//! `ATTNRT_KERNEL_ISA` forces), each op's kernel on it, and the thread policy. Every kernel entry
//! point takes the set (or its part for that op); nothing else probes the CPU.

use crate::act::ActKernel;
use crate::decode::{DecodeKernel, DecodeLanes, Route};
use crate::error::KernelError;
use crate::flash::FlashKernel;
use crate::isa::{Cpu, Isa};
use crate::norm::NormKernel;
use crate::panel::PanelKernel;
use crate::projection::ProjectionKernel;
use crate::quant::QuantKernel;
use crate::threads::ThreadPolicy;

/// Up to this many tokens a projection task runs on the AVX-512 panel kernel, past it on the
/// `gemm` crate's — unless the panel kernel is the faster one for many tokens too on this CPU
/// ([`panel_wins_many_tokens`]). On the Intel VM measured: one token (a decode step, where the
/// weights stream from memory) 1.1–1.6× faster on one thread, equal at 4, 2–23 % slower from 16
/// tokens on (`cargo bench -p attnrt-benches --bench projection`).
const PANEL_KERNEL_TOKENS: usize = 4;

/// Up to this many tokens a projection task runs on the AVX2 panel kernel where AVX2 is the
/// CPU's best, past it on the `gemm` crate's. On the AVX2 VM (AMD EPYC, 2 threads, the 125M
/// decoder's weights cold, paired rounds): 1.13–1.20× gemm's speed at 1 token, 1.65× at 2,
/// 1.27–1.49× at 4, 1.08–1.22× at 8; at 4 tokens the lm_head costs what it costs at 1
/// (`cargo bench -p attnrt-benches --bench projection`, decode table).
const AVX2_PANEL_KERNEL_TOKENS: usize = 8;

/// The kernels of one session. Made only by [`KernelSet::resolve`] or [`KernelSet::for_isa`],
/// which check that the CPU runs the ISA: holding a set is what lets the kernels run its SIMD
/// builds without checking again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelSet {
    isa: Isa,
    flash: FlashKernel,
    decode: DecodeKernel,
    projection: ProjectionKernel,
    quant: QuantKernel,
    norm: NormKernel,
    act: ActKernel,
    standalone_act: StandaloneAct,
    threads: ThreadPolicy,
}

/// Who runs an activation that stands alone in the graph (not folded into a projection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StandaloneAct {
    /// The caller's own element-wise kernels (the runtime's are tract-linalg's, bit for bit
    /// tract's op), which pick their SIMD path by themselves: the CPU's best, which is the set's
    /// ISA unless `ATTNRT_KERNEL_ISA` lowered it.
    Caller,
    /// attnrt's activation kernel ([`crate::act::apply_rows`]) on this build: the ISA was
    /// lowered below the CPU's best, and the caller's kernels would not follow.
    Kernel(ActKernel),
}

impl KernelSet {
    /// The set for this CPU and process: the ISA of [`Isa::selected`] (`ATTNRT_KERNEL_ISA`, else
    /// the best the CPU has) and the route of [`Route::current`]. Fails on an unknown
    /// `ATTNRT_KERNEL_ISA` or an ISA this CPU lacks.
    pub fn resolve() -> Result<KernelSet, KernelError> {
        let isa = Isa::selected()?;
        Ok(KernelSet::choose(isa, &Cpu::probe(), Route::current()))
    }

    /// The set on an explicit ISA (what `ATTNRT_KERNEL_ISA` set to it gives: tests and
    /// benchmarks cover every path with it); fails with [`KernelError::IsaUnavailable`] if the
    /// CPU lacks it.
    pub fn for_isa(isa: Isa) -> Result<KernelSet, KernelError> {
        isa.ensure_available()?;
        Ok(KernelSet::choose(isa, &Cpu::probe(), Route::current()))
    }

    /// Each op's kernel on `isa` for `cpu`. The caller has checked that `cpu` runs `isa`.
    pub(crate) fn choose(isa: Isa, cpu: &Cpu, route: Route) -> KernelSet {
        // Below the CPU's best the kernels of other libraries (gemm, tract-linalg), which pick
        // their SIMD path by themselves, would not follow the ISA: attnrt's own run instead.
        let lowered = isa != cpu.best;
        let act = ActKernel::new(isa);
        let lanes = match isa {
            // `Avx512` implies AVX2 and FMA on every CPU that has it.
            Isa::Avx512 => DecodeLanes::Avx512,
            Isa::Avx2 => DecodeLanes::Fma,
            Isa::Scalar => DecodeLanes::Portable,
        };
        let projection = match isa {
            Isa::Avx512 => {
                let most = if panel_wins_many_tokens(cpu) {
                    usize::MAX
                } else {
                    PANEL_KERNEL_TOKENS
                };
                ProjectionKernel::new(Some((PanelKernel::new(isa), most)), Some(act))
            }
            // gemm picks the CPU's best path itself, which is this one; the few tokens of a
            // decode step run on attnrt's AVX2 build, which reads each panel once for all of them.
            // No epilogue: activations stay tract's ops, as with gemm alone.
            Isa::Avx2 if !lowered => ProjectionKernel::new(
                Some((PanelKernel::new(isa), AVX2_PANEL_KERNEL_TOKENS)),
                None,
            ),
            _ if !lowered => ProjectionKernel::new(None, None),
            _ => ProjectionKernel::new(Some((PanelKernel::new(isa), usize::MAX)), None),
        };
        KernelSet {
            isa,
            flash: FlashKernel::new(isa, true),
            decode: DecodeKernel::new(route, lanes),
            projection,
            // The integer projections' build, with the CPU's VNNI form where the ISA allows it.
            quant: QuantKernel::new(isa, cpu),
            norm: NormKernel::new(isa),
            act,
            standalone_act: if lowered {
                StandaloneAct::Kernel(act)
            } else {
                StandaloneAct::Caller
            },
            threads: ThreadPolicy::default(),
        }
    }

    /// This set with attention on `route` (benchmarks and tests compare the paths; every route
    /// serves every valid problem).
    pub fn with_route(self, route: Route) -> KernelSet {
        KernelSet {
            decode: self.decode.with_route(route),
            ..self
        }
    }

    /// This set with the flash kernel's use of a mask's key ends on or off (tests: skipping
    /// key blocks must not change a result).
    pub fn with_key_ends(self, on: bool) -> KernelSet {
        KernelSet {
            flash: FlashKernel::new(self.isa, on),
            ..self
        }
    }

    /// The ISA every kernel of the set runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The flash kernel (attention over many queries).
    pub fn flash(&self) -> &FlashKernel {
        &self.flash
    }

    /// The decode path (a few queries) and the route between it and the flash kernel.
    pub fn decode(&self) -> &DecodeKernel {
        &self.decode
    }

    /// The projections' kernels.
    pub fn projection(&self) -> &ProjectionKernel {
        &self.projection
    }

    /// The integer projections of quantized models ([`crate::quant`]).
    pub fn quant(&self) -> &QuantKernel {
        &self.quant
    }

    /// Layer normalization.
    pub fn norm(&self) -> NormKernel {
        self.norm
    }

    /// Activations over rows ([`crate::act::apply_rows`]).
    pub fn act(&self) -> ActKernel {
        self.act
    }

    /// Who runs an activation that stands alone in the graph.
    pub fn standalone_act(&self) -> StandaloneAct {
        self.standalone_act
    }

    /// How the kernels split their work over threads.
    pub fn threads(&self) -> &ThreadPolicy {
        &self.threads
    }
}

/// Whether the AVX-512 panel kernel is faster than the `gemm` crate's kernel on the same packed
/// panels for blocks of many tokens (a prefill), not only for the few tokens of a decode step,
/// where it is faster on every AVX-512 CPU measured. Measured per CPU family with
/// `cargo bench -p attnrt-benches --bench projection` (one thread): on AMD Zen 5 (family 1Ah)
/// the panel kernel is as fast or faster at 128 and 512 tokens (gemm time / panel time
/// 1.00–1.09, 85–95 % of the FMA peak); on an Intel Xeon VM (Sapphire Rapids class) `gemm` was
/// 3–24 % faster from 16 tokens on. Unmeasured CPUs keep `gemm`.
fn panel_wins_many_tokens(cpu: &Cpu) -> bool {
    cpu.amd_family.is_some_and(|f| f >= 0x1A)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Vnni;

    fn cpu(best: Isa, amd_family: Option<u32>) -> Cpu {
        Cpu {
            best,
            amd_family,
            vnni: Vnni::default(),
        }
    }

    #[test]
    fn vnni_runs_the_integer_product_only_on_the_isa_that_allows_it() {
        let both = Vnni {
            zmm: true,
            ymm: true,
        };
        let zen5 = Cpu {
            vnni: both,
            ..cpu(Isa::Avx512, Some(0x1A))
        };
        let quant = |isa, cpu: &Cpu| KernelSet::choose(isa, cpu, Route::Auto).quant().to_string();
        assert_eq!(
            quant(Isa::Avx512, &zen5),
            "avx512 vnni vpdpbusd (avx2 vpmaddwd for wide weights)"
        );
        // `ATTNRT_KERNEL_ISA=avx2` / `scalar` on it: those ISAs' own builds.
        assert_eq!(quant(Isa::Avx2, &zen5), "avx2 vpmaddwd");
        assert_eq!(quant(Isa::Scalar, &zen5), "portable");
        // A CPU whose best is AVX2 with AVX-VNNI (Intel client), and one without VNNI.
        let client = Cpu {
            vnni: Vnni {
                zmm: false,
                ymm: true,
            },
            ..cpu(Isa::Avx2, None)
        };
        assert_eq!(
            quant(Isa::Avx2, &client),
            "avx-vnni vpdpbusd (avx2 vpmaddwd for wide weights)"
        );
        assert_eq!(quant(Isa::Avx512, &cpu(Isa::Avx512, None)), "avx2 vpmaddwd");
        assert!(KernelSet::choose(Isa::Avx512, &zen5, Route::Auto)
            .quant()
            .is_vnni());
    }

    #[test]
    fn avx512_runs_the_panel_kernel_for_every_task_on_zen5_only() {
        let zen5 = KernelSet::choose(Isa::Avx512, &cpu(Isa::Avx512, Some(0x1A)), Route::Auto);
        let zen4 = KernelSet::choose(Isa::Avx512, &cpu(Isa::Avx512, Some(0x19)), Route::Auto);
        let intel = KernelSet::choose(Isa::Avx512, &cpu(Isa::Avx512, None), Route::Auto);
        assert_eq!(zen5.projection().to_string(), "attnrt's panel kernel");
        for set in [zen4, intel] {
            assert_eq!(
                set.projection().to_string(),
                "gemm (attnrt's panel kernel up to 4 tokens)"
            );
        }
        for set in [zen5, zen4, intel] {
            assert!(set.projection().epilogue());
            assert_eq!(set.standalone_act(), StandaloneAct::Caller);
            assert_eq!(set.decode().lanes(), DecodeLanes::Avx512);
            assert_eq!(set.flash().isa(), Isa::Avx512);
        }
    }

    #[test]
    fn a_cpu_s_best_path_below_avx512_keeps_the_libraries_kernels_past_a_few_tokens() {
        for (best, kernel) in [
            (
                Isa::Avx2,
                "gemm (attnrt's panel kernel (avx2) up to 8 tokens)",
            ),
            (Isa::Scalar, "gemm"),
        ] {
            let set = KernelSet::choose(best, &cpu(best, None), Route::Auto);
            assert_eq!(set.projection().to_string(), kernel);
            assert!(!set.projection().epilogue());
            assert_eq!(set.standalone_act(), StandaloneAct::Caller);
        }
    }

    #[test]
    fn a_lowered_isa_reaches_every_op() {
        let zen5 = cpu(Isa::Avx512, Some(0x1A));
        for isa in [Isa::Avx2, Isa::Scalar] {
            let set = KernelSet::choose(isa, &zen5, Route::Auto);
            assert_eq!(set.isa(), isa);
            assert_eq!(set.flash().isa(), isa);
            assert_eq!(set.norm().isa(), isa);
            assert_eq!(set.act().isa(), isa);
            assert_eq!(set.standalone_act(), StandaloneAct::Kernel(set.act()));
            let (panel, most) = set.projection().panel().expect("no gemm below the best");
            assert_eq!((panel.isa(), most), (isa, usize::MAX));
            assert!(!set.projection().epilogue());
        }
        let scalar = KernelSet::choose(Isa::Scalar, &zen5, Route::Auto);
        assert_eq!(scalar.decode().lanes(), DecodeLanes::Portable);
        assert_eq!(
            scalar.projection().to_string(),
            "attnrt's panel kernel (scalar)"
        );
    }

    #[test]
    fn routes_and_key_ends_change_only_their_own_choice() {
        let set = KernelSet::for_isa(Isa::Scalar).unwrap();
        let decode = set.with_route(Route::Decode);
        assert_eq!(decode.decode().route(), Route::Decode);
        assert_eq!(decode.with_route(set.decode().route()), set);
        let plain = set.with_key_ends(false);
        assert!(!plain.flash().key_ends() && set.flash().key_ends());
        assert_eq!(plain.with_key_ends(true), set);
    }
}
