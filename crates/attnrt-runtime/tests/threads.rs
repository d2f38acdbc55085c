//! `Threads`: the creating thread joins the pool; calls from it, from other threads, and pools
//! built again on the same thread all run their parallel work to the end.

use attnrt_runtime::Threads;
use rayon::prelude::*;

/// A parallel sum on `threads`' pool, with the pool's thread count seen from inside.
fn parallel_sum(threads: &Threads) -> (u64, usize) {
    threads.install(|| {
        let sum = (0..100_000u64).into_par_iter().map(|x| x % 7).sum();
        (sum, rayon::current_num_threads())
    })
}

const SUM: u64 = {
    let mut s = 0;
    let mut x = 0;
    while x < 100_000 {
        s += x % 7;
        x += 1;
    }
    s
};

#[test]
fn the_creating_thread_and_other_threads_both_run_the_pool() {
    std::thread::spawn(|| {
        let threads = Threads::new(Some(2)).unwrap();
        assert_eq!(parallel_sum(&threads), (SUM, 2));
        let other = threads.clone();
        let from_elsewhere = std::thread::spawn(move || parallel_sum(&other))
            .join()
            .unwrap();
        assert_eq!(from_elsewhere, (SUM, 2));
    })
    .join()
    .unwrap();
}

#[test]
fn pools_built_again_on_one_thread_still_run() {
    std::thread::spawn(|| {
        for n in [2, 3, 1, 2] {
            let threads = Threads::new(Some(n)).unwrap();
            assert_eq!(threads.count(), n);
            assert_eq!(parallel_sum(&threads), (SUM, n));
            drop(threads);
        }
        // Two at once on one thread: the second is an ordinary pool.
        let (a, b) = (
            Threads::new(Some(2)).unwrap(),
            Threads::new(Some(2)).unwrap(),
        );
        assert_eq!(parallel_sum(&a), (SUM, 2));
        assert_eq!(parallel_sum(&b), (SUM, 2));
        let one = Threads::new(Some(1)).unwrap();
        let from_elsewhere = std::thread::spawn(move || parallel_sum(&one))
            .join()
            .unwrap();
        assert_eq!(from_elsewhere, (SUM, 1));
    })
    .join()
    .unwrap();
}
