//! Heap growth of one run of the fused `Attention` op through `Session::run_owned`: the op must
//! read tract's f32 tensors in place and write `Y` straight into the output tensor, so a run
//! allocates the output and little else (the kernel's scratch is kept per thread across runs).
//!
//! A counting global allocator, so this file holds a single test: the counters are process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use attnrt_onnx::{attr, ModelProto};
use attnrt_runtime::{NamedTensor, Session, Tensor, Threads};
use attnrt_testkit::{float_value, model, node_with_attrs, GraphBuilder};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call is forwarded unchanged to `System`; only counters are updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Both blocks exist during a moving realloc: count the new one first.
            grew(new_size);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak live bytes during `f` above the live bytes before it.
fn heap_growth<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let r = f();
    (r, PEAK.load(Ordering::Relaxed).saturating_sub(before))
}

#[test]
fn attention_op_run_allocates_about_its_output() {
    // 3-D [B, L, H·D] as the fusion emits it; Y is 4 MiB.
    let (len, heads, head) = (1024usize, 8usize, 128usize);
    let hidden = heads * head;
    let dims = [1, len as i64, hidden as i64];
    let mut g = GraphBuilder::new("g");
    g.node(node_with_attrs(
        "attn",
        "Attention",
        &["Q", "K", "V"],
        &["Y"],
        vec![
            attr::make_int("q_num_heads", heads as i64),
            attr::make_int("kv_num_heads", heads as i64),
        ],
    ));
    for name in ["Q", "K", "V"] {
        g.input(float_value(name, &dims));
    }
    g.output(float_value("Y", &dims));
    let model = ModelProto {
        ir_version: 10,
        ..model(g.finish(), 23)
    };
    let n = len * hidden;
    let inputs: Vec<NamedTensor> = ["Q", "K", "V"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let data: Vec<f32> = (0..n)
                .map(|j| ((j * 7 + i * 13) % 101) as f32 / 101.0 - 0.5)
                .collect();
            NamedTensor {
                name: name.to_string(),
                tensor: Tensor::from_shape(&[1, len, hidden], &data).unwrap(),
            }
        })
        .collect();
    let threads = Threads::new(Some(1)).unwrap();
    let session = Session::build(&model, &inputs, &threads, "attention_heap").unwrap();
    // Warm-up: the kernel's per-thread scratch is allocated once and kept.
    drop(session.run_owned(inputs.clone()).unwrap());

    let owned = inputs.clone();
    let (out, grew) = heap_growth(|| session.run_owned(owned).unwrap());
    let y_bytes = n * 4;
    assert_eq!(out[0].tensor.shape(), &[1, len, hidden]);
    drop(out);
    // Before the op borrowed its inputs and wrote into its output, this was ≈ 2 × Y (a Vec,
    // then its copy into a tensor) on top of any input copies.
    let slack = 512 * 1024;
    eprintln!("run_owned: heap growth {grew} bytes, Y {y_bytes} bytes");
    assert!(
        grew >= y_bytes && grew <= y_bytes + slack,
        "a run grew the heap by {grew} bytes; Y is {y_bytes} bytes (allowed slack {slack})"
    );

    // `run(&[..])` copies each input once for tract: 3 × Y more.
    let (out, grew_borrowed) = heap_growth(|| session.run(&inputs).unwrap());
    drop(out);
    eprintln!("run(&inputs): heap growth {grew_borrowed} bytes");
    assert!(
        grew_borrowed >= 4 * y_bytes && grew_borrowed <= 4 * y_bytes + slack,
        "run(&inputs) grew the heap by {grew_borrowed} bytes; expected 4 × {y_bytes}"
    );
}
