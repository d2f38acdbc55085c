//! tract calls guarded against panics: a model file is untrusted input and tract asserts on some
//! malformed graphs, so a panic inside a guarded call becomes an error naming the model.

use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{bail, Result};

/// Number of [`guarded`] regions running (on any thread).
static GUARDED: AtomicUsize = AtomicUsize::new(0);

/// Whether a panic now would be caught by a guarded tract call and turned into an error. A
/// process-wide panic hook that exits should let such panics unwind instead.
pub fn panic_is_guarded() -> bool {
    GUARDED.load(Ordering::SeqCst) > 0
}

/// Runs `f`, turning a panic inside tract into an error: a model file is untrusted input and
/// tract asserts on some malformed graphs.
pub(crate) fn guarded<R>(what: &str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            GUARDED.fetch_sub(1, Ordering::SeqCst);
        }
    }
    GUARDED.fetch_add(1, Ordering::SeqCst);
    let _depth = Depth;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => bail!(
            "{what}: tract failed internally ({})",
            crate::plan::panic_message(&*p)
        ),
    }
}
