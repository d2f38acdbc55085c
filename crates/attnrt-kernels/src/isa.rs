//! What this CPU can run: the SIMD paths ([`Isa`]), the environment override that forces one,
//! and the CPU facts the kernel choices depend on ([`Cpu`]). The only module that probes the
//! CPU; [`crate::KernelSet`] turns what it finds into each op's kernel.

use std::sync::OnceLock;

use crate::error::KernelError;

/// The instruction-set paths of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// 512-bit vectors (needs AVX-512F); 64 queries × 6 keys register tiles.
    Avx512,
    /// 256-bit vectors with fused multiply-add (needs AVX2 and FMA).
    Avx2,
    /// Portable Rust, no intrinsics; correct everywhere.
    Scalar,
}

/// Name of the environment variable that forces a path.
pub const ISA_ENV: &str = "ATTNRT_KERNEL_ISA";

impl Isa {
    /// All paths, fastest first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Scalar];

    /// The name used by `ATTNRT_KERNEL_ISA` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    fn needs(self) -> &'static str {
        match self {
            Isa::Avx512 => "x86-64 with AVX-512F",
            Isa::Avx2 => "x86-64 with AVX2 and FMA",
            Isa::Scalar => "nothing",
        }
    }

    /// Parses `avx512`, `avx2` or `scalar` (case-insensitive).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "avx512" | "avx-512" | "avx512f" => Some(Isa::Avx512),
            "avx2" | "avx2+fma" | "fma" => Some(Isa::Avx2),
            "scalar" | "portable" | "none" => Some(Isa::Scalar),
            _ => None,
        }
    }

    /// Whether this CPU can run the path (the CPU's feature flags, probed by `std` once).
    pub fn is_available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => false,
            Isa::Scalar => true,
        }
    }

    pub(crate) fn ensure_available(self) -> Result<(), KernelError> {
        if self.is_available() {
            Ok(())
        } else {
            Err(KernelError::IsaUnavailable {
                isa: self.name(),
                needs: self.needs(),
            })
        }
    }

    /// The paths this CPU can run, fastest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The fastest path this CPU can run.
    pub fn best_available() -> Isa {
        Isa::ALL
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// The path a [`crate::KernelSet`] is resolved for: `ATTNRT_KERNEL_ISA` if set (an unknown value or a path
    /// the CPU lacks is an error, not a silent fallback), else [`Isa::best_available`]. Read once
    /// per process.
    pub fn selected() -> Result<Isa, KernelError> {
        static SELECTED: OnceLock<Result<Isa, String>> = OnceLock::new();
        let choice = SELECTED.get_or_init(|| match std::env::var(ISA_ENV) {
            Ok(value) if !value.trim().is_empty() => Isa::parse(&value).ok_or(value),
            _ => Ok(Isa::best_available()),
        });
        match choice {
            Ok(isa) => {
                isa.ensure_available()?;
                Ok(*isa)
            }
            Err(value) => Err(KernelError::BadIsaEnv {
                value: value.clone(),
            }),
        }
    }
}

/// The facts about this CPU that the kernel choices depend on, probed once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Cpu {
    /// The fastest path it runs ([`Isa::best_available`]).
    pub best: Isa,
    /// The family of an AMD CPU (base plus extended), `None` elsewhere.
    pub amd_family: Option<u32>,
    /// Which forms of the VNNI dot products of u8 × s8 (`vpdpbusd`) it runs.
    pub vnni: Vnni,
}

/// Which forms of the VNNI instructions (`vpdpbusd`: four u8 × s8 products summed into each
/// i32 lane) a CPU runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Vnni {
    /// AVX512_VNNI with AVX512BW: the 512-bit EVEX form.
    pub zmm: bool,
    /// AVX-VNNI: the 256-bit VEX form (Intel client CPUs since Alder Lake, AMD since Zen 5).
    pub ymm: bool,
}

impl Vnni {
    /// This CPU's.
    fn probe() -> Vnni {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            Vnni {
                zmm: has!("avx512f") && has!("avx512bw") && has!("avx512vnni"),
                ymm: has!("avx2") && has!("avxvnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Vnni::default()
    }
}

impl Cpu {
    /// This CPU.
    pub(crate) fn probe() -> Cpu {
        static CPU: OnceLock<Cpu> = OnceLock::new();
        *CPU.get_or_init(|| Cpu {
            best: Isa::best_available(),
            amd_family: amd_family(),
            vnni: Vnni::probe(),
        })
    }
}

/// The CPU family of an AMD CPU (the base family plus the extended one), `None` elsewhere.
fn amd_family() -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // SAFETY: CPUID exists on every x86_64 CPU; leaves 0 and 1 always do.
        #[allow(unused_unsafe)]
        let (vendor, signature) = unsafe { (__cpuid(0), __cpuid(1).eax) };
        let is_amd = vendor.ebx.to_le_bytes() == *b"Auth"
            && vendor.edx.to_le_bytes() == *b"enti"
            && vendor.ecx.to_le_bytes() == *b"cAMD";
        is_amd.then_some(family(signature))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The family in a CPUID leaf-1 signature: the base family, plus the extended one when the
/// base is 0Fh.
fn family(signature: u32) -> u32 {
    let base = (signature >> 8) & 0xF;
    let extended = if base == 0xF {
        (signature >> 20) & 0xFF
    } else {
        0
    };
    base + extended
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_adds_the_extended_family_only_past_base_0f() {
        assert_eq!(family(0x00B4_0F40), 0x1A, "a Zen 5 signature");
        assert_eq!(family(0x00A1_0F11), 0x19, "a Zen 4 signature");
        assert_eq!(family(0x0008_06F8), 0x6, "a Sapphire Rapids signature");
        assert_eq!(family(0x0FF0_0600), 0x6, "extended bits ignored below 0Fh");
    }
}
