//! Which algorithm serves an attention call: the flash kernel or the decode path.

use std::sync::atomic::{AtomicU8, Ordering};

/// The process-wide route kernel sets take when they are resolved, see [`Route::set_current`].
static CURRENT_ROUTE: AtomicU8 = AtomicU8::new(0);

/// Which algorithm serves a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// The decode path when `Lq ≤ 4`, else the flash path (the default).
    Auto,
    /// The flash-style kernel: tasks per (batch, q-head, query blocks), register tiles over
    /// queries; made for long query sequences (prefill, encoders).
    Flash,
    /// Flash-decoding for a few queries against a long cache: the keys split across threads,
    /// each K/V row read once for every q-head of its GQA group, one merge of the splits.
    Decode,
}

impl Route {
    /// Makes every [`crate::KernelSet`] resolved afterwards in this process (and so the
    /// runtime's sessions built afterwards) take `route`; [`Route::Auto`] restores the default.
    /// For benchmarks that time the paths through the whole runtime in one process; a single
    /// set takes another route with [`crate::KernelSet::with_route`].
    pub fn set_current(route: Route) {
        let code = match route {
            Route::Auto => 0,
            Route::Flash => 1,
            Route::Decode => 2,
        };
        CURRENT_ROUTE.store(code, Ordering::Relaxed);
    }

    /// The route set by [`Route::set_current`] ([`Route::Auto`] unless changed).
    pub fn current() -> Route {
        match CURRENT_ROUTE.load(Ordering::Relaxed) {
            1 => Route::Flash,
            2 => Route::Decode,
            _ => Route::Auto,
        }
    }

    /// The name used in reports and benchmark labels.
    pub fn name(self) -> &'static str {
        match self {
            Route::Auto => "auto",
            Route::Flash => "flash",
            Route::Decode => "decode",
        }
    }
}
