//! The threads a session runs on.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rayon::ThreadPool;
use tract_linalg::multithread::Executor;

/// The threads a session runs on: one rayon pool, used by tract's matmuls (through tract-linalg's
/// executor) and by attnrt's attention kernel (through `pool.install`).
///
/// With more than one thread, the thread that calls [`Threads::new`] is one of the pool's (when
/// it is not already in a rayon pool): runs called from it start on it directly, and runs called
/// from another thread get the pool's other `n − 1` threads. rayon keeps that thread registered
/// with the pool after the pool is dropped, so a later `Threads::new` on it builds an ordinary
/// pool of `n` threads.
#[derive(Clone)]
pub struct Threads {
    pool: Arc<ThreadPool>,
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Threads({})", self.count())
    }
}

impl Threads {
    /// A pool of `threads` threads; `None` means one per available core.
    pub fn new(threads: Option<usize>) -> Result<Threads> {
        let n = match threads {
            Some(0) => bail!("--threads must be at least 1"),
            Some(n) => n,
            None => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        };
        if n > 1024 {
            bail!("{n} threads is more than attnrt allows (1024)");
        }
        let builder = || {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("attnrt-{i}"))
        };
        // The calling thread as one of the n: a run called from it starts on it at once, where
        // handing each run to a pool thread and waiting for it cost about half of a small
        // decoder's step (benches/README.md). Not for one thread (a call from another thread
        // would find no pool thread to run it) nor on a thread already in a pool (rayon refuses).
        let joined = (n > 1 && rayon::current_thread_index().is_none())
            .then(|| builder().use_current_thread().build().ok())
            .flatten();
        let pool = match joined {
            Some(pool) => pool,
            None => builder()
                .build()
                .with_context(|| format!("cannot start a pool of {n} threads"))?,
        };
        Ok(Threads {
            pool: Arc::new(pool),
        })
    }

    /// Number of threads in the pool.
    pub fn count(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The pool itself.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Runs `f` inside the pool, with tract's executor set to the same pool.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let exec = Executor::MultiThread(self.pool.clone());
        self.pool
            .install(|| tract_linalg::multithread::multithread_tract_scope(exec, f))
    }
}
