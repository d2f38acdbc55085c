//! The decode attention of a batched generation step, its cache streaming from memory: a stack of
//! `ATTNRT_BENCH_LAYERS` (default 12) layers, each with its own key/value cache, at the 125M
//! LLaMA decoder's shape (12 query heads, 4 KV heads, head 64, one new token per row), batch
//! `ATTNRT_BENCH_BATCHES` (default 1,4), `ATTNRT_BENCH_LENS` keys (default 1024: at batch 4,
//! 8.4 MB a layer, 100 MB for 12, as `attnrt generate` reads at 1024 × 4), through
//! `attnrt_kernels::attention` on the process's kernel set and `ATTNRT_BENCH_THREADS` threads
//! (default 2).
//!
//! Each round times one pass over the stack for every batch, and a read-sum of a buffer of the
//! same size with the same threads (the bandwidth the cache could be read at in that round).
//! Reported per batch: time per pass, GB/s of cache, and that rate over the read-sum's (median of
//! the rounds' ratios; the host's bandwidth moves from run to run, the ratio much less).
//!
//! ```sh
//! cargo bench -p attnrt-benches --bench decode_cache
//! ATTNRT_BENCH_ROUNDS=20 ATTNRT_BENCH_BATCHES=1,4,8 ATTNRT_BENCH_LENS=4096 cargo bench -p attnrt-benches --bench decode_cache
//! ```

use std::time::Instant;

use anyhow::{Context, Result};
use attnrt_benches::{env_list, machine_note, median, read_sum, Table};
use attnrt_kernels::{attention, AttentionParams, KernelSet, Mask, View4, ViewMut4};
use attnrt_testkit::seeded_values;

const Q_HEADS: usize = 12;
const KV_HEADS: usize = 4;
const HEAD: usize = 64;

/// One layer's cache and the step's query and output, `batch` rows.
struct Layer {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    out: Vec<f32>,
}

impl Layer {
    fn new(batch: usize, keys: usize, seed: u32) -> Layer {
        let cache = batch * KV_HEADS * keys * HEAD;
        Layer {
            q: seeded_values(batch * Q_HEADS * HEAD, seed),
            k: seeded_values(cache, seed + 1),
            v: seeded_values(cache, seed + 2),
            out: vec![0.0; batch * Q_HEADS * HEAD],
        }
    }

    fn step(&mut self, kernels: &KernelSet, batch: usize, keys: usize) -> Result<()> {
        let q = View4::contiguous(&self.q, [batch, Q_HEADS, 1, HEAD])?;
        let k = View4::contiguous(&self.k, [batch, KV_HEADS, keys, HEAD])?;
        let v = View4::contiguous(&self.v, [batch, KV_HEADS, keys, HEAD])?;
        let mut out = ViewMut4::contiguous(&mut self.out, [batch, Q_HEADS, 1, HEAD])?;
        let params = AttentionParams::new(AttentionParams::default_scale(HEAD));
        attention(kernels, &q, &k, &v, &Mask::None, &params, &mut out)?;
        Ok(())
    }
}

fn main() -> Result<()> {
    let layers = env_list("ATTNRT_BENCH_LAYERS", &[12])?[0];
    let rounds = env_list("ATTNRT_BENCH_ROUNDS", &[10])?[0];
    let threads = env_list("ATTNRT_BENCH_THREADS", &[2])?[0];
    let batches = env_list("ATTNRT_BENCH_BATCHES", &[1, 4])?;
    let keys = env_list("ATTNRT_BENCH_LENS", &[1024])?[0];
    println!("{}", machine_note());
    let kernels = KernelSet::resolve()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut stacks: Vec<Vec<Layer>> = batches
        .iter()
        .map(|&b| {
            (0..layers)
                .map(|l| Layer::new(b, keys, 3 * l as u32))
                .collect()
        })
        .collect();
    let bytes: Vec<usize> = batches
        .iter()
        .map(|&b| layers * 2 * b * KV_HEADS * keys * HEAD * 4)
        .collect();
    let probe = vec![1.0f32; bytes.iter().max().copied().unwrap_or(0) / 4];
    let mut ms = vec![Vec::new(); batches.len()];
    let mut share = vec![Vec::new(); batches.len()];
    pool.install(|| -> Result<()> {
        for r in 0..rounds + 1 {
            for i in 0..batches.len() {
                let c = (i + r) % batches.len();
                let t = Instant::now();
                for layer in stacks[c].iter_mut() {
                    layer
                        .step(&kernels, batches[c], keys)
                        .context("attention")?;
                }
                let pass = t.elapsed().as_secs_f64();
                let t = Instant::now();
                std::hint::black_box(read_sum(&probe[..bytes[c] / 4], threads));
                let read = t.elapsed().as_secs_f64();
                if r > 0 {
                    ms[c].push(pass * 1e3);
                    share[c].push(read / pass);
                }
            }
        }
        Ok(())
    })?;
    let mut table = Table::new(&[
        "batch",
        "MB of cache",
        "ms (median)",
        "GB/s (median)",
        "share of a read-sum's rate (median of rounds)",
    ]);
    for (c, &b) in batches.iter().enumerate() {
        let mid = median(&ms[c]);
        table.row(vec![
            format!("{b}"),
            format!("{:.1}", bytes[c] as f64 / 1e6),
            format!("{mid:.3}"),
            format!("{:.1}", bytes[c] as f64 / (mid * 1e-3) / 1e9),
            format!("{:.2}", median(&share[c])),
        ]);
    }
    println!(
        "{layers} layers, {keys} keys, {Q_HEADS} q / {KV_HEADS} KV heads of {HEAD}, {threads} threads, {rounds} rounds; decode lanes {:?}",
        kernels.decode().lanes(),
    );
    println!("{}", table.render());
    println!("{}", machine_note());
    Ok(())
}
