//! A model's weights are held once: loading, fusing, building sessions and running them grow
//! the heap by about the weights' bytes (the projection weights packed for their kernel, the
//! other large initializers as tract constants), not by several times that; the embedding
//! table is not copied at all (its lookup reads the rows from the model's bytes). The model
//! file and its external data are mapped, so its bytes are not on the heap at all
//! (`attnrt_onnx::mapped`; ARCHITECTURE.md, "Where the weights live").
//!
//! Measured with a counting global allocator (this test binary's own), so this file holds one
//! test: another running at the same time would count too.

use std::path::Path;

use attnrt::harness::{compare, CompareOptions};
use attnrt_onnx::{load_model, save_model, DataType, Limits, ModelProto, SaveOptions};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::{node, seeded_values, tensor_f32, value_info, GraphBuilder};

mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static CURRENT: AtomicUsize = AtomicUsize::new(0);
    static PEAK: AtomicUsize = AtomicUsize::new(0);
    static TOTAL: AtomicUsize = AtomicUsize::new(0);

    /// The system allocator, counting live bytes and their peak.
    pub struct Counting;

    // SAFETY: every call is forwarded unchanged to `System`; only counters change.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = System.alloc(layout);
            if !p.is_null() {
                TOTAL.fetch_add(layout.size(), Ordering::Relaxed);
                let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            System.dealloc(ptr, layout);
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        }
    }

    /// Runs `f`; returns its result and the heap growth at its peak over the bytes live before.
    pub fn peak_growth<R>(f: impl FnOnce() -> R) -> (R, usize) {
        let before = CURRENT.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let r = f();
        (r, PEAK.load(Ordering::Relaxed).saturating_sub(before))
    }

    /// Runs `f`; returns its result and the bytes it allocated in all (freed or not).
    pub fn allocated<R>(f: impl FnOnce() -> R) -> (R, usize) {
        let before = TOTAL.load(Ordering::Relaxed);
        let r = f();
        (r, TOTAL.load(Ordering::Relaxed) - before)
    }
}

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

const WIDTH: usize = 512;
const LAYERS: usize = 6;
const VOCAB: usize = 2048;
const TOKENS: usize = 32;

/// `ids [1, TOKENS]` → an embedding `Gather` (a constant of VOCAB × WIDTH) → LAYERS times
/// `Relu(x · W + b)` (projection weights WIDTH × WIDTH) → `y`. Returns the model and the bytes of
/// its weights other than the embedding table.
fn model() -> (ModelProto, usize) {
    let mut g = GraphBuilder::new("weights");
    g.input(value_info("ids", DataType::Int64, &[1, TOKENS as i64]));
    let table = seeded_values(VOCAB * WIDTH, 1);
    g.initializer(tensor_f32("table", &[VOCAB as i64, WIDTH as i64], &table));
    g.node(node("embed", "Gather", &["table", "ids"], &["x0"]));
    let mut bytes = 0;
    for l in 0..LAYERS {
        let w = seeded_values(WIDTH * WIDTH, 10 + l as u32)
            .into_iter()
            .map(|v| v * 0.05)
            .collect::<Vec<f32>>();
        let b = seeded_values(WIDTH, 100 + l as u32);
        bytes += (w.len() + b.len()) * 4;
        g.initializer(tensor_f32(
            &format!("w{l}"),
            &[WIDTH as i64, WIDTH as i64],
            &w,
        ));
        g.initializer(tensor_f32(&format!("b{l}"), &[WIDTH as i64], &b));
        let (x, y) = (format!("x{l}"), format!("x{}", l + 1));
        g.node(node(
            &format!("mm{l}"),
            "MatMul",
            &[&x, &format!("w{l}")],
            &[&format!("p{l}")],
        ));
        g.node(node(
            &format!("add{l}"),
            "Add",
            &[&format!("p{l}"), &format!("b{l}")],
            &[&format!("a{l}")],
        ));
        g.node(node(
            &format!("relu{l}"),
            "Relu",
            &[&format!("a{l}")],
            &[&y],
        ));
    }
    // BERT's GELU, `x · 0.5 · (1 + erf(x / √2))`: fused, so `attnrt run` has two paths.
    let x = format!("x{LAYERS}");
    g.initializer(tensor_f32("sqrt2", &[], &[std::f32::consts::SQRT_2]));
    g.initializer(tensor_f32("one", &[], &[1.0]));
    g.initializer(tensor_f32("half", &[], &[0.5]));
    g.node(node("gelu_div", "Div", &[&x, "sqrt2"], &["scaled"]));
    g.node(node("gelu_erf", "Erf", &["scaled"], &["t"]));
    g.node(node("gelu_add", "Add", &["t", "one"], &["one_plus"]));
    g.node(node("gelu_mul", "Mul", &[&x, "one_plus"], &["x_one_plus"]));
    g.node(node("gelu_half", "Mul", &["x_one_plus", "half"], &["y"]));
    g.output(value_info(
        "y",
        DataType::Float,
        &[1, TOKENS as i64, WIDTH as i64],
    ));
    (g.into_model(17), bytes)
}

fn ids() -> Vec<NamedTensor> {
    let values: Vec<i64> = (0..TOKENS as i64)
        .map(|i| (i * 37) % VOCAB as i64)
        .collect();
    let t = Tensor::from_shape(&[1, TOKENS], &values).unwrap();
    vec![NamedTensor {
        name: "ids".into(),
        tensor: t,
    }]
}

/// Load, fuse, build the session for these inputs and run it, as `attnrt run --fused-only`
/// does; the outputs.
fn load_fuse_run(path: &Path, threads: &Threads, options: &SessionOptions) -> Vec<NamedTensor> {
    let loaded = load_model(path, &Limits::default()).unwrap();
    let fused = attnrt::fuse(&loaded.model).unwrap();
    let session = Session::build_with_options(&fused.model, &ids(), threads, "w", options).unwrap();
    session.run(&ids()).unwrap()
}

fn max_abs_diff(a: &[NamedTensor], b: &[NamedTensor]) -> f32 {
    let (a, b) = (
        a[0].tensor
            .try_as_plain_ram()
            .unwrap()
            .as_slice::<f32>()
            .unwrap(),
        b[0].tensor
            .try_as_plain_ram()
            .unwrap()
            .as_slice::<f32>()
            .unwrap(),
    );
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn weights_are_held_once_through_load_fuse_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let (model, weight_bytes) = model();
    let inline = dir.path().join("inline.onnx");
    save_model(&model, &inline, &SaveOptions::default()).unwrap();
    let external = dir.path().join("external.onnx");
    let save = SaveOptions {
        external_threshold: Some(1024),
        ..SaveOptions::default()
    };
    save_model(&model, &external, &save).unwrap();
    drop(model);
    let threads = Threads::new(Some(2)).unwrap();
    let options = SessionOptions::per_shape();
    // Everything a first session allocates once per process (thread pools, kernel tables).
    load_fuse_run(&inline, &threads, &options);

    for path in [&inline, &external] {
        let (outputs, growth) = counting::peak_growth(|| load_fuse_run(path, &threads, &options));
        let ratio = growth as f64 / weight_bytes as f64;
        eprintln!(
            "{}: heap peak {:.1} MB over {:.1} MB of weights besides the table ({ratio:.2}×)",
            path.display(),
            growth as f64 / 1e6,
            weight_bytes as f64 / 1e6
        );
        // The packed and constant weights (1×), the activations (tens of KB) and the graph; a
        // copy of the table would be 0.67× more, and an aligned copy of an inline weight made
        // before packing it (as there was) 0.14× more.
        assert!(
            ratio < 1.15,
            "{}: the heap grew by {ratio:.2}× the weights' bytes",
            path.display()
        );
        let tract = SessionOptions {
            attnrt_ops: false,
            ..SessionOptions::per_shape()
        };
        let reference = load_fuse_run(path, &threads, &tract);
        assert!(max_abs_diff(&outputs, &reference) < 1e-3);
    }

    // `attnrt run`'s comparison (the fused path, then the unfused one) packs each weight once:
    // the unfused session is built while the fused one still holds the packed weights.
    let loaded = load_model(&external, &Limits::default()).unwrap();
    let (cmp, allocated) = counting::allocated(|| {
        let options = CompareOptions::default();
        compare(&loaded.model, "w", &ids(), None, &threads, &options).unwrap()
    });
    assert!(cmp.fused.is_some() && cmp.unfused.is_some() && cmp.ok());
    let ratio = allocated as f64 / weight_bytes as f64;
    eprintln!(
        "compare: {:.1} MB allocated in all ({ratio:.2}× the weights)",
        allocated as f64 / 1e6
    );
    // One packing (1×) and two sessions' graphs, plans and activations (0.8× here); packing
    // again for the unfused session, as when the fused one was dropped first, made it 2.8×.
    assert!(
        ratio < 2.3,
        "the fused and unfused sessions allocated {ratio:.2}× the weights"
    );

    // A second session of the same loaded model shares the first one's weights.
    let loaded = load_model(&inline, &Limits::default()).unwrap();
    let first =
        Session::build_with_options(&loaded.model, &ids(), &threads, "a", &options).unwrap();
    let (second, growth) = counting::peak_growth(|| {
        Session::build_with_options(&loaded.model, &ids(), &threads, "b", &options).unwrap()
    });
    let ratio = growth as f64 / weight_bytes as f64;
    eprintln!(
        "second session: heap peak {:.1} MB ({ratio:.2}×)",
        growth as f64 / 1e6
    );
    assert!(
        ratio < 0.2,
        "a second session grew the heap by {ratio:.2}× the weights"
    );
    assert_eq!(
        max_abs_diff(&first.run(&ids()).unwrap(), &second.run(&ids()).unwrap()),
        0.0
    );
}
