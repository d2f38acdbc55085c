//! Test data shared by the unit tests.

/// `n` values `sin(0.37·i + c)`: smooth, in [-1, 1], a different sequence per `c`.
pub(crate) fn ramp(n: usize, c: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32) * 0.37 + c).sin()).collect()
}

/// A pool of `threads` threads, for tests of the thread policy's splits.
pub(crate) fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}
