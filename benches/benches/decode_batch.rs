//! The projections of a batched decode step, weights streaming from memory: a stack of
//! `ATTNRT_BENCH_LAYERS` (default 12) distinct layers of the 125M LLaMA decoder's projections
//! (q, k, v, o, gate, up, down: 25.2 MB a layer, 302 MB for 12, far past the last-level cache)
//! run through the projection op (`attnrt_kernels::projection::project`, the process's kernel
//! set, `ATTNRT_BENCH_THREADS` threads, default 2) at `ATTNRT_BENCH_DECODE_TOKENS` tokens
//! (default 1,4), rounds alternating the token counts. Reported: each count's time per pass over
//! the stack and its weight bandwidth, and the time against one token's (median of the rounds'
//! ratios): the cost of a batch's extra rows on top of the weight stream. Times are wall
//! time and the process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`, both threads): on a machine
//! other processes load, the CPU time moves far less than the wall time (it still counts the
//! pool's threads spinning between calls).
//!
//! ```sh
//! cargo bench -p attnrt-benches --bench decode_batch
//! ATTNRT_BENCH_ROUNDS=20 ATTNRT_BENCH_DECODE_TOKENS=1,2,4,8 cargo bench -p attnrt-benches --bench decode_batch
//! ```

use std::time::Instant;

use anyhow::Result;
use attnrt_benches::{env_list, machine_note, median, Table, LLAMA_125M_LAYER as LAYER};
use attnrt_kernels::projection::{project, PackedWeight, Product};
use attnrt_kernels::KernelSet;
use attnrt_testkit::seeded_values;

fn main() -> Result<()> {
    let layers = env_list("ATTNRT_BENCH_LAYERS", &[12])?[0];
    let rounds = env_list("ATTNRT_BENCH_ROUNDS", &[10])?[0];
    let threads = env_list("ATTNRT_BENCH_THREADS", &[2])?[0];
    let tokens = env_list("ATTNRT_BENCH_DECODE_TOKENS", &[1, 4])?;
    println!("{}", machine_note());
    let kernels = KernelSet::resolve()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let weights: Vec<PackedWeight> = (0..layers)
        .flat_map(|l| LAYER.iter().enumerate().map(move |(i, &s)| (l * 8 + i, s)))
        .map(|(seed, (k, n))| PackedWeight::new(&seeded_values(k * n, 10 + seed as u32), k, n))
        .collect();
    let bytes: usize = weights.iter().map(|w| w.k() * w.n() * 4).sum();
    let xs: Vec<Vec<Vec<f32>>> = tokens
        .iter()
        .map(|&m| {
            weights
                .iter()
                .map(|w| seeded_values(m * w.k(), 1))
                .collect()
        })
        .collect();
    let mut ys: Vec<Vec<Vec<f32>>> = tokens
        .iter()
        .map(|&m| weights.iter().map(|w| vec![0.0; m * w.n()]).collect())
        .collect();
    let mut wall = vec![Vec::new(); tokens.len()];
    let mut cpu = vec![Vec::new(); tokens.len()];
    pool.install(|| {
        for r in 0..rounds + 1 {
            for i in 0..tokens.len() {
                let c = (i + r) % tokens.len();
                let m = tokens[c];
                let (t, c0) = (Instant::now(), cpu_ns());
                for ((w, x), y) in weights.iter().zip(&xs[c]).zip(ys[c].iter_mut()) {
                    let product = Product {
                        w,
                        alpha: 1.0,
                        bias: None,
                        activation: None,
                    };
                    project(kernels.projection(), kernels.threads(), x, &product, y, m);
                }
                if r > 0 {
                    wall[c].push(t.elapsed().as_secs_f64() * 1e3);
                    cpu[c].push((cpu_ns() - c0) as f64 / 1e6);
                }
            }
        }
    });
    let mut table = Table::new(&[
        "tokens",
        "ms (min)",
        "ms (median)",
        "GB/s (min)",
        "ms / first count's (median of rounds)",
        "CPU ms (median)",
        "CPU ms / first count's (median)",
    ]);
    let ratio =
        |a: &[f64], b: &[f64]| median(&a.iter().zip(b).map(|(a, b)| a / b).collect::<Vec<_>>());
    for (c, &m) in tokens.iter().enumerate() {
        let min = wall[c].iter().cloned().fold(f64::INFINITY, f64::min);
        table.row(vec![
            format!("{m}"),
            format!("{min:.2}"),
            format!("{:.2}", median(&wall[c])),
            format!("{:.1}", bytes as f64 / (min * 1e-3) / 1e9),
            format!("{:.3}", ratio(&wall[c], &wall[0])),
            format!("{:.2}", median(&cpu[c])),
            format!("{:.3}", ratio(&cpu[c], &cpu[0])),
        ]);
    }
    println!(
        "{layers} layers ({:.0} MB), {threads} threads, {rounds} rounds; {:?} tokens",
        bytes as f64 / 1e6,
        kernels.projection().panel().map(|(k, _)| k.isa()),
    );
    println!("{}", table.render());
    println!("{}", machine_note());
    Ok(())
}

/// Time on a CPU of this process's threads so far, in nanoseconds
/// (`CLOCK_PROCESS_CPUTIME_ID`): a measure that the other processes of a loaded machine do not
/// inflate as they do wall time.
fn cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, t: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let ok = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0;
    if ok {
        t.sec as u64 * 1_000_000_000 + t.nsec as u64
    } else {
        0
    }
}
