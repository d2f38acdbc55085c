//! How the kernels split their work over threads: one policy, each rule named.
//!
//! Every kernel runs on the current rayon pool (the session's, or whichever pool a caller
//! installs); the policy reads that pool's size when a call splits its work, here and nowhere
//! else, and turns it into task counts by the rules below.

/// The split rules of the kernels (part of a [`crate::KernelSet`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ThreadPolicy {
    /// Tasks per thread the flash kernel keeps at least when it gives a task several query
    /// blocks: rayon balances whole tasks, and three per thread keep the last ones short.
    flash_tasks_per_thread: usize,
    /// Tasks per thread the decode path aims for when it splits the keys of its heads.
    decode_tasks_per_thread: usize,
    /// Tasks per thread of a row-wise op (layer normalization).
    row_tasks_per_thread: usize,
    /// Below this many values an element-wise or row-wise op runs on the calling thread alone:
    /// a decode step's few rows cost less than waking a pool thread.
    serial_below_values: usize,
    /// Values per task of an element-wise op.
    elementwise_chunk: usize,
}

impl Default for ThreadPolicy {
    fn default() -> Self {
        ThreadPolicy {
            flash_tasks_per_thread: 3,
            decode_tasks_per_thread: 4,
            row_tasks_per_thread: 4,
            serial_below_values: 1 << 15,
            elementwise_chunk: 1 << 14,
        }
    }
}

impl ThreadPolicy {
    /// Threads of the pool the caller runs on.
    pub fn threads(&self) -> usize {
        rayon::current_num_threads()
    }

    /// The fewest tasks the flash kernel makes of a call (see `flash::choose_qsub`).
    pub fn flash_min_tasks(&self) -> usize {
        self.flash_tasks_per_thread * self.threads().max(1)
    }

    /// The tasks the decode path aims for over all its heads (see `decode::choose_splits`).
    pub fn decode_task_target(&self) -> usize {
        self.decode_tasks_per_thread * self.threads().max(1)
    }

    /// Whether `tasks` independent tasks go to the pool (more than one of each), or run in
    /// order on the calling thread.
    pub fn spreads_tasks(&self, tasks: usize) -> bool {
        tasks > 1 && self.threads() > 1
    }

    /// Whether an element-wise or row-wise op over `values` values goes to the pool.
    pub fn spreads_values(&self, values: usize) -> bool {
        values >= self.serial_below_values && self.threads() > 1
    }

    /// Rows per task of a row-wise op over `rows` rows that goes to the pool.
    pub fn rows_per_task(&self, rows: usize) -> usize {
        rows.div_ceil(self.row_tasks_per_thread * self.threads().max(1))
            .max(1)
    }

    /// Values per task of an element-wise op that goes to the pool.
    pub fn elementwise_chunk(&self) -> usize {
        self.elementwise_chunk
    }

    /// This policy with element-wise ops spread from `values` values on, in chunks of `chunk`
    /// (tests: small inputs split as large ones are).
    #[cfg(test)]
    pub(crate) fn spreading_from(self, values: usize, chunk: usize) -> ThreadPolicy {
        ThreadPolicy {
            serial_below_values: values,
            elementwise_chunk: chunk,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        crate::testing::pool(threads).install(f)
    }

    #[test]
    fn the_rules_follow_the_pool_the_call_runs_on() {
        let p = ThreadPolicy::default();
        on(1, || {
            assert_eq!(p.flash_min_tasks(), 3);
            assert_eq!(p.decode_task_target(), 4);
            assert!(!p.spreads_tasks(100));
            assert!(!p.spreads_values(1 << 20));
            assert_eq!(p.rows_per_task(10), 3);
        });
        on(2, || {
            assert_eq!(p.flash_min_tasks(), 6);
            assert_eq!(p.decode_task_target(), 8);
            assert!(p.spreads_tasks(2) && !p.spreads_tasks(1));
            assert!(p.spreads_values(1 << 15) && !p.spreads_values((1 << 15) - 1));
            assert_eq!(p.rows_per_task(512), 64);
            assert_eq!(p.rows_per_task(3), 1);
        });
    }
}
