//! The memory budget: how many bytes a run may ask for before attnrt refuses it.
//!
//! A model, or a `--dim`, can ask for tensors far larger than the machine: a fixed input axis of
//! 2^20 makes an attention score matrix of 2^40 elements, and without a budget the process runs
//! until the kernel kills it. With one, attnrt estimates the bytes of the inputs from their
//! shapes before building them, and those of the tensors a planned run keeps alive at once
//! before running it, and refuses with one error naming the tensor and the size.
//!
//! The default is [`DEFAULT_SHARE_PERCENT`] % of the memory available when attnrt first asks
//! (`MemAvailable` of `/proc/meminfo`, lowered to what a cgroup memory limit or an address-space
//! limit, `ulimit -v`, leaves): the rest
//! is headroom for what the estimate leaves out (the model's own weights, the kernels' scratch,
//! other processes). Where neither can be read (not Linux), it is [`FALLBACK_BYTES`].

use std::fmt;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

/// The share of the available memory the default budget takes, in percent.
pub const DEFAULT_SHARE_PERCENT: u64 = 75;

/// The default budget where the available memory cannot be read (8 GiB).
pub const FALLBACK_BYTES: u64 = 8 << 30;

/// Where a budget's size comes from (it words the error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetSource {
    /// Given by the user.
    Given,
    /// [`DEFAULT_SHARE_PERCENT`] % of this many bytes available.
    Available(u64),
    /// [`FALLBACK_BYTES`]: the available memory could not be read.
    Fallback,
}

/// A number of bytes that the inputs and the live intermediates of a run may not exceed
/// together (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    bytes: u64,
    source: BudgetSource,
    /// How a user raises it, for the error (`--max-memory`, `max_memory=`).
    knob: &'static str,
}

impl Default for MemoryBudget {
    /// [`MemoryBudget::machine_default`].
    fn default() -> Self {
        MemoryBudget::machine_default()
    }
}

impl MemoryBudget {
    /// A budget of `bytes`, as given by the user.
    pub fn new(bytes: u64) -> MemoryBudget {
        MemoryBudget {
            bytes,
            source: BudgetSource::Given,
            knob: "--max-memory",
        }
    }

    /// [`DEFAULT_SHARE_PERCENT`] % of the memory available when this is first called in the
    /// process (the same value afterwards), or [`FALLBACK_BYTES`] where that cannot be read.
    pub fn machine_default() -> MemoryBudget {
        static DEFAULT: OnceLock<MemoryBudget> = OnceLock::new();
        DEFAULT
            .get_or_init(|| {
                let (bytes, source) = match available_bytes() {
                    Some(a) => (a / 100 * DEFAULT_SHARE_PERCENT, BudgetSource::Available(a)),
                    None => (FALLBACK_BYTES, BudgetSource::Fallback),
                };
                MemoryBudget {
                    bytes,
                    source,
                    knob: "--max-memory",
                }
            })
            .clone()
    }

    /// Parses a size: bytes (`1048576`), or a number with a binary unit `K`, `M`, `G`, `T`
    /// (`512M`, `1.5G`; `KiB`, `MB`... are read alike: every unit is a power of 1024).
    pub fn parse(s: &str) -> Result<MemoryBudget> {
        let t = s.trim();
        let digits = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(digits);
        let shift = match unit.trim().to_ascii_uppercase().as_str() {
            "" | "B" => 0,
            "K" | "KB" | "KIB" => 10,
            "M" | "MB" | "MIB" => 20,
            "G" | "GB" | "GIB" => 30,
            "T" | "TB" | "TIB" => 40,
            _ => bail!("'{s}' is not a size (bytes, or a number with K, M, G or T)"),
        };
        let value: f64 = number
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .with_context(|| {
                format!("'{s}' is not a size (bytes, or a number with K, M, G or T)")
            })?;
        let bytes = value * (1u64 << shift) as f64;
        if bytes < 1.0 || bytes >= u64::MAX as f64 {
            bail!("'{s}': the memory budget must be at least 1 byte and below 16 EiB");
        }
        Ok(MemoryBudget::new(bytes as u64))
    }

    /// The same budget, naming `knob` as the way to raise it (e.g. `max_memory=`).
    pub fn raised_with(mut self, knob: &'static str) -> MemoryBudget {
        self.knob = knob;
        self
    }

    /// The budget in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Where the size comes from.
    pub fn source(&self) -> BudgetSource {
        self.source
    }

    /// Refuses `needs` bytes over the budget: "{what} needs 8.0 TiB, over the memory budget of
    /// 17.2 GiB (--max-memory)". `what` names the tensor; it is built only on refusal.
    pub fn check(&self, needs: u64, what: impl FnOnce() -> String) -> Result<()> {
        if needs > self.bytes {
            bail!(
                "{} needs {}, over the memory budget of {self}",
                what(),
                format_bytes(needs)
            );
        }
        Ok(())
    }
}

impl fmt::Display for MemoryBudget {
    /// `17.2 GiB (75% of the 22.9 GiB available; raise it with --max-memory)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = format_bytes(self.bytes);
        let knob = self.knob;
        match self.source {
            BudgetSource::Given => write!(f, "{size} ({knob})"),
            BudgetSource::Available(a) => write!(
                f,
                "{size} ({DEFAULT_SHARE_PERCENT}% of the {} available; raise it with {knob})",
                format_bytes(a)
            ),
            BudgetSource::Fallback => write!(
                f,
                "{size} (the default where the available memory cannot be read; raise it with \
                 {knob})"
            ),
        }
    }
}

/// `n` bytes for people: `512 B`, `4.0 KiB`, `17.2 GiB`, `8.0 TiB`.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The bytes of a tensor of `dims` with elements of `item_size` bytes, saturating (a size past
/// `u64` is over any budget).
pub fn tensor_bytes(dims: impl IntoIterator<Item = u64>, item_size: u64) -> u64 {
    dims.into_iter()
        .fold(item_size, |acc, d| acc.saturating_mul(d))
}

/// The memory available to this process: `MemAvailable`, lowered to the room a cgroup memory
/// limit leaves (inside a container the cgroup mount is the container's own group) and to the
/// room an address-space limit (`ulimit -v`) leaves.
fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let available = mem_available(&meminfo)?;
    Some(
        [cgroup_room(), address_space_room()]
            .into_iter()
            .flatten()
            .fold(available, u64::min),
    )
}

/// `RLIMIT_AS` (`Max address space` of `/proc/self/limits`) less the address space this process
/// maps already (`VmSize` of `/proc/self/status`); `None` when unlimited or unreadable.
fn address_space_room() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some(address_space_limit(&limits)?.saturating_sub(vm_size(&status)?))
}

/// The soft limit of `Max address space` in a `/proc/self/limits` text, in bytes.
fn address_space_limit(limits: &str) -> Option<u64> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max address space"))?;
    rest.split_whitespace().next()?.parse().ok()
}

/// `VmSize` of a `/proc/self/status` text, in bytes.
fn vm_size(status: &str) -> Option<u64> {
    kib_field(status, "VmSize:")
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    kib_field(meminfo, "MemAvailable:")
}

/// The value of the line `{key} N kB` of a `/proc` text, in bytes.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

/// The limit of the cgroup (v2, then v1) less its usage; `None` without a numeric limit.
fn cgroup_room() -> Option<u64> {
    let read = |p: &str| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ]
    .into_iter()
    .find_map(|(limit, usage)| Some(read(limit)?.saturating_sub(read(usage)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_space_limit_is_read_from_proc_self_limits() {
        let header =
            "Limit                     Soft Limit           Hard Limit           Units     \n";
        let limited = format!(
            "{header}Max data size             unlimited            unlimited            bytes     \n\
             Max address space         4294967296           unlimited            bytes     \n"
        );
        assert_eq!(address_space_limit(&limited), Some(4 << 30));
        let unlimited = format!(
            "{header}Max address space         unlimited            unlimited            bytes     \n"
        );
        assert_eq!(address_space_limit(&unlimited), None);
        assert_eq!(
            vm_size("Name:\tx\nVmPeak:\t  9 kB\nVmSize:\t  2048 kB\n"),
            Some(2 << 20)
        );
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        let b = |s: &str| MemoryBudget::parse(s).unwrap().bytes();
        assert_eq!(b("1024"), 1024);
        assert_eq!(b("1K"), 1024);
        assert_eq!(b("512M"), 512 << 20);
        assert_eq!(b("8G"), 8 << 30);
        assert_eq!(b("8gib"), 8 << 30);
        assert_eq!(b("1.5G"), 3 << 29);
        assert_eq!(b("2T"), 2 << 40);
        for bad in ["", "G", "8X", "-1G", "0", "0.1", "1e3", "99999999T"] {
            assert!(MemoryBudget::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_error_names_the_tensor_the_size_and_the_budget() {
        let budget = MemoryBudget::parse("1K").unwrap();
        budget.check(1024, || unreachable!()).unwrap();
        let err = budget
            .check(tensor_bytes([1 << 20, 1 << 20], 8), || "input 'x'".into())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "input 'x' needs 8.0 TiB, over the memory budget of 1.0 KiB (--max-memory)"
        );
        let python = budget.raised_with("max_memory=");
        assert!(python.to_string().ends_with("(max_memory=)"));
        assert_eq!(tensor_bytes([u64::MAX, 2], 4), u64::MAX);
    }

    #[test]
    fn limits_follow_the_budget_below_their_ceilings() {
        let l = crate::Limits::within(&MemoryBudget::new(16 << 30));
        assert_eq!(l.max_tensor_elements, 1 << 31);
        assert_eq!(l.max_model_bytes, 2 << 30);
        assert_eq!(l.max_external_bytes, 16 << 30);
        let l = crate::Limits::within(&MemoryBudget::new(1 << 40));
        assert_eq!(l.max_tensor_elements, crate::Limits::TENSOR_ELEMENTS);
        assert_eq!(l.max_external_bytes, crate::Limits::EXTERNAL_BYTES);
        let l = crate::Limits::within(&MemoryBudget::new(1 << 30));
        assert_eq!(l.max_model_bytes, 1 << 30);
        assert_eq!(l.max_tensor_elements, 1 << 27);
    }

    #[test]
    fn bytes_read_for_people() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(4096), "4.0 KiB");
        assert_eq!(format_bytes(17_179_869_184 + (1 << 29)), "16.5 GiB");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn the_default_is_a_share_of_mem_available() {
        let text = "MemTotal:       24684096 kB\nMemFree:  1 kB\nMemAvailable:   22437984 kB\n";
        assert_eq!(mem_available(text), Some(22_437_984 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        let d = MemoryBudget::machine_default();
        match d.source() {
            BudgetSource::Available(a) => {
                assert_eq!(d.bytes(), a / 100 * DEFAULT_SHARE_PERCENT)
            }
            BudgetSource::Fallback => assert_eq!(d.bytes(), FALLBACK_BYTES),
            BudgetSource::Given => panic!("the default is not given"),
        }
        assert!(d.to_string().contains("raise it with --max-memory"), "{d}");
    }
}
