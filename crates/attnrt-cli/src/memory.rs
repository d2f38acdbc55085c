//! How this process takes memory from the kernel: two settings that keep the first token's
//! time for compute (benches/README.md, "Time to first token at long prompts").
//!
//! - Freed memory stays with the allocator ([`keep_freed_memory`]): mimalloc otherwise returns
//!   freed pages to the kernel a second after they are freed, and a long prompt step, whose
//!   layers free and take megabytes of activations, faulted pages in again that it had used.
//! - Memory taken after the model is loaded comes in base pages ([`small_pages_from_now`]):
//!   a first touch of a transparent huge page zeroes 2 MiB at once, and where the kernel must
//!   compact or reclaim to find one (a machine whose memory is full of page cache) that cost
//!   ~4 ms per MiB in the prompt step against ~1 ms in base pages. The packed weights, taken
//!   at load, keep their huge pages (the decode steps stream them).

use std::ffi::{c_int, c_long};

/// mimalloc v3's `mi_option_purge_delay` (the 16th entry of `mi_option_e` in its
/// `include/mimalloc.h`; libmimalloc-sys names v2's numbering only).
const MI_OPTION_PURGE_DELAY: c_int = 15;

extern "C" {
    /// mimalloc's option setter (linked in with the global allocator, see main.rs).
    fn mi_option_set(option: c_int, value: c_long);
    /// mimalloc's option getter.
    #[cfg(test)]
    fn mi_option_get(option: c_int) -> c_long;
}

/// mimalloc keeps freed memory for reuse instead of returning it to the kernel (purge delay
/// −1). Call before any thread but the main one runs (mimalloc's setters are not thread-safe).
pub fn keep_freed_memory() {
    // SAFETY: a plain store into mimalloc's option table; no other thread exists yet.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// The process's later first touches take base pages (`PR_SET_THP_DISABLE`); pages already
/// faulted in keep their size. Best effort: a kernel without the call changes nothing.
pub fn small_pages_from_now() {
    // SAFETY: prctl with an option and integer arguments; it touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// The purge delay mimalloc runs with, in ms (−1: never).
#[cfg(test)]
fn purge_delay() -> c_long {
    // SAFETY: a plain read of mimalloc's option table.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_index_is_mimallocs_purge_delay() {
        // v3's default purge delay is 1000 ms, and no other option's default is 1000 (a wrong
        // index reads another option). Nothing in this test binary sets it.
        assert_eq!(purge_delay(), 1000, "not mimalloc v3's purge delay");
    }
}
