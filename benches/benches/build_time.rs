//! Session build time against graph size (issue 18): how long `attnrt run --no-diff` spends
//! before and in its one run, for two chains of N nodes on one `float[4]` input (ir_version 8,
//! opset 17):
//!
//! - `identity`: N `Identity` nodes. attnrt removes identities before tract sees the graph
//!   (crates/attnrt-runtime/src/lower.rs), so this should grow linearly;
//! - `mixed`: N/2 `Identity` nodes then N/2 `Add` nodes with one initializer each. The Adds reach
//!   tract, whose `TypedModel::wire_node` (tract-core 0.23) checks every new node's name against
//!   the nodes already wired: this half stays quadratic until tract changes.
//!
//! ```sh
//! cargo bench -p attnrt-benches --bench build_time
//! ATTNRT_BENCH_NODES=20000,200000 ATTNRT_BENCH_MIXED_NODES=20000 cargo bench -p attnrt-benches --bench build_time
//! ```
//!
//! Each sample builds a session from the in-memory model and runs it once (what `attnrt run
//! --no-diff` does after loading); a table of medians and the growth ratio between the smallest
//! and largest N (1.0 per 10x = linear) is printed at the end.

use std::time::{Duration, Instant};

use attnrt_benches::{env_list, fmt_opt, machine_note, median, Table};
use attnrt_onnx::ModelProto;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::node_chain;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn chain(n: usize, mixed: bool) -> ModelProto {
    node_chain(n, if mixed { n / 2 } else { n })
}

fn build_and_run(model: &ModelProto, threads: &Threads) -> Duration {
    let x = NamedTensor {
        name: "x".into(),
        tensor: Tensor::from(ndarray::arr1(&[1.0f32, 2.0, 3.0, 4.0]).into_dyn()),
    };
    let t = Instant::now();
    let s = Session::new(model, threads, "chain", &SessionOptions::default()).expect("session");
    let out = s.run(&[x]).expect("run");
    assert_eq!(out[0].name, "y");
    t.elapsed()
}

fn bench(c: &mut Criterion) {
    let threads = Threads::new(Some(1)).unwrap();
    let identity = env_list(
        "ATTNRT_BENCH_NODES",
        &[10_000, 20_000, 50_000, 100_000, 200_000],
    )
    .unwrap();
    let mixed = env_list("ATTNRT_BENCH_MIXED_NODES", &[10_000, 20_000, 50_000]).unwrap();
    let mut rows: Vec<(String, usize, f64)> = Vec::new();
    let mut group = c.benchmark_group("build_time");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100));
    for (kind, sizes) in [("identity", &identity), ("mixed", &mixed)] {
        for &n in sizes {
            let model = chain(n, kind == "mixed");
            let mut samples = Vec::new();
            group.bench_with_input(BenchmarkId::new(kind, n), &model, |b, m| {
                b.iter_custom(|iters| {
                    let total: Duration = (0..iters).map(|_| build_and_run(m, &threads)).sum();
                    samples.push(total.as_secs_f64() * 1e3 / iters as f64);
                    total
                })
            });
            rows.push((kind.to_string(), n, median(&samples)));
        }
    }
    group.finish();
    let mut table = Table::new(&[
        "chain",
        "nodes",
        "build + run ms (median)",
        "ms per 1k nodes",
    ]);
    for (kind, n, ms) in &rows {
        table.row(vec![
            kind.clone(),
            n.to_string(),
            format!("{ms:.1}"),
            fmt_opt(Some(ms / (*n as f64 / 1e3)), 2),
        ]);
    }
    println!("\n{}", table.render());
    for kind in ["identity", "mixed"] {
        let r: Vec<_> = rows.iter().filter(|r| r.0 == kind).collect();
        if let (Some(a), Some(b)) = (r.first(), r.last()) {
            let size = b.1 as f64 / a.1 as f64;
            let time = b.2 / a.2;
            println!(
                "{kind}: {}→{} nodes ({size:.0}x) took {time:.1}x the time: growth {:.2}x linear",
                a.1,
                b.1,
                time / size
            );
        }
    }
    println!("{}", machine_note());
}

criterion_group!(benches, bench);
criterion_main!(benches);
