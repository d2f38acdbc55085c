//! Errors returned by the kernel API.

/// Everything that can go wrong when calling the kernel: the inputs are checked at the API boundary,
/// so no index computed inside the kernel can leave the caller's buffers.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A view's dims/strides do not fit its buffer, overflow, or (for outputs) overlap themselves.
    #[error("invalid view of tensor `{tensor}`: {reason}")]
    InvalidView {
        /// Which tensor (`Q`, `K`, `V`, `mask`, `out`, or `view` when the constructor has no name).
        tensor: &'static str,
        /// What is wrong, with the offending numbers.
        reason: String,
    },
    /// The tensors' shapes are inconsistent with each other.
    #[error("attention shape mismatch: {0}")]
    Shape(String),
    /// A SIMD path was requested that this CPU cannot execute.
    #[error("kernel ISA `{isa}` is not available on this CPU (it needs {needs})")]
    IsaUnavailable {
        /// The requested path (`avx512`, `avx2`, `scalar`).
        isa: &'static str,
        /// The CPU features it needs.
        needs: &'static str,
    },
    /// `ATTNRT_KERNEL_ISA` holds an unknown value.
    #[error("ATTNRT_KERNEL_ISA={value:?} is not one of `avx512`, `avx2`, `scalar`")]
    BadIsaEnv {
        /// The value found in the environment.
        value: String,
    },
}
