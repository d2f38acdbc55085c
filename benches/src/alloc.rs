//! A counting global allocator: live heap bytes and their high-water mark.
//!
//! A binary opts in with `#[global_allocator] static A: CountingAlloc = CountingAlloc;`; the
//! counters are process-wide statics, so [`reset_peak`] / [`peak`] work from any thread (the
//! kernel's rayon workers and tract's allocate on their own threads).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes and the peak.
pub struct CountingAlloc;

fn grew(bytes: usize) {
    let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    CURRENT.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are updated.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            // Count the new block before releasing the old one: during a moving realloc both
            // exist, and the peak should say so.
            grew(new_size);
            shrank(layout.size());
        }
        p
    }
}

/// Live heap bytes now (0 unless [`CountingAlloc`] is the global allocator).
pub fn current() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// Highest live heap bytes since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new measurement: the peak becomes the current live bytes, which are returned.
pub fn reset_peak() -> usize {
    let now = current();
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// Runs `f` and returns its result with the heap growth it caused at its peak: the highest live
/// bytes during `f` minus the live bytes before it (what `f` needed on top of what existed).
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = reset_peak();
    let r = f();
    (r, peak().saturating_sub(before))
}
