//! GELU fused into one ONNX `Gelu` against the exported chain it replaces, in the same run:
//! `x: [1, L, 3072]` (GPT-2 small / BERT-base's feed-forward width), L = 128 and 512, on the
//! tanh form (GPT-2: `Pow(x, 3)` → … → `Tanh` → …, 8 nodes) and the erf form (BERT: `Div` →
//! `Erf` → …, 5 nodes), 2 threads. Prints per form and length the median times and the ratio
//! unfused / fused (the fused graph is checked against the unfused one first).
//!
//! ```sh
//! cargo bench -p attnrt-benches --bench activations
//! ```

use std::time::Duration;

use attnrt::harness::{diff_outputs, Tolerance};
use attnrt_benches::{machine_note, median, random_input, Table};
use attnrt_fusion::{fuse, FusionOptions};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Threads};
use attnrt_testkit::gelu::{gelu_model, GeluForm, Product};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const WIDTH: i64 = 3072;

fn time(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: BenchmarkId,
    session: &Session,
    inputs: &[NamedTensor],
) -> f64 {
    let mut samples = Vec::new();
    group.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let t = std::time::Instant::now();
            for _ in 0..iters {
                session.run(inputs).expect("run");
            }
            let d = t.elapsed();
            samples.push(d.as_secs_f64() * 1e3 / iters as f64);
            d
        })
    });
    median(&samples)
}

fn bench(c: &mut Criterion) {
    let threads = Threads::new(Some(2)).unwrap();
    let forms = [
        (
            "tanh",
            GeluForm::Tanh { cubic: 0.044715 },
            Product::HalfFirst,
        ),
        ("erf", GeluForm::ErfDiv, Product::HalfLast),
    ];
    let mut table = Table::new(&["form", "L", "unfused ms", "fused ms", "unfused / fused"]);
    let mut group = c.benchmark_group("gelu");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300));
    for (name, form, product) in forms {
        let model = gelu_model(form, product, false, WIDTH);
        let fused = fuse(&model, &FusionOptions::default()).expect("fuse");
        assert_eq!(fused.report.activations.len(), 1, "{name}: not fused");
        let options = SessionOptions::default();
        let unfused = Session::new(&model, &threads, name, &options).expect("session");
        let fused = Session::new(&fused.model, &threads, name, &options).expect("session");
        for l in [128usize, 512] {
            let inputs = vec![random_input("x", &[1, l, WIDTH as usize], 7).unwrap()];
            let tol = Tolerance {
                atol: 2e-5,
                rtol: 1e-4,
            };
            let (a, b) = (fused.run(&inputs).unwrap(), unfused.run(&inputs).unwrap());
            assert!(
                diff_outputs(&a, &b, tol).iter().all(|d| d.ok),
                "{name} L={l}"
            );
            let u = time(
                &mut group,
                BenchmarkId::new(format!("{name}/unfused"), l),
                &unfused,
                &inputs,
            );
            let f = time(
                &mut group,
                BenchmarkId::new(format!("{name}/fused"), l),
                &fused,
                &inputs,
            );
            table.row(vec![
                name.into(),
                l.to_string(),
                format!("{u:.3}"),
                format!("{f:.3}"),
                format!("{:.2}", u / f),
            ]);
        }
    }
    group.finish();
    println!("\n{}", table.render());
    println!("{}", machine_note());
}

criterion_group!(benches, bench);
criterion_main!(benches);
