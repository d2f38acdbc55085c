//! How the session's [`KernelSet`] reaches the ops it builds.
//!
//! A session resolves its set once ([`crate::Session::new`]) and builds each plan inside
//! [`planning`]; attnrt's ops take the set when tract wires them (`Expansion::wire`, while the
//! plan is typed) and keep it. The set travels through this scope rather than through the
//! parsers because tract-onnx's op registry holds plain `fn` pointers, which carry no state.

use std::cell::Cell;

use attnrt_kernels::KernelSet;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

thread_local! {
    /// The set of the plan being built on this thread.
    static PLANNING: Cell<Option<KernelSet>> = const { Cell::new(None) };
}

/// Runs `f` (the building of a plan) with `kernels` as the set of every op wired in it.
pub(crate) fn planning<R>(kernels: &KernelSet, f: impl FnOnce() -> R) -> R {
    /// Restores the outer scope, also when `f` panics (a guarded tract call).
    struct Restore(Option<KernelSet>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PLANNING.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PLANNING.with(|p| p.replace(Some(*kernels))));
    f()
}

/// The set an op wired now takes: the planning session's, or outside a session (a graph parsed
/// with [`crate::onnx_frontend`] and typed by its caller) the process's ([`KernelSet::resolve`]).
pub(crate) fn for_op() -> TractResult<KernelSet> {
    match PLANNING.with(Cell::get) {
        Some(kernels) => Ok(kernels),
        None => KernelSet::resolve().context("choosing the CPU kernels"),
    }
}

/// The kernel set of this process ([`KernelSet::resolve`]: the CPU, `ATTNRT_KERNEL_ISA`), as
/// every session built now takes it; `None` when that choice is unusable (a session then fails
/// to build, with the reason).
pub(crate) fn of_process() -> Option<KernelSet> {
    KernelSet::resolve().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_kernels::{Isa, Route};

    #[test]
    fn the_planning_scope_nests_and_ends() {
        let outer = KernelSet::for_isa(Isa::Scalar).unwrap();
        let inner = outer.with_route(Route::Decode);
        planning(&outer, || {
            assert_eq!(for_op().unwrap(), outer);
            planning(&inner, || assert_eq!(for_op().unwrap(), inner));
            assert_eq!(for_op().unwrap(), outer);
        });
        assert_eq!(PLANNING.with(Cell::get), None);
    }
}
