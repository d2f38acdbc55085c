//! `ATTNRT_KERNEL_ISA` reaches every op of a session — projections, layer norm, GELU (folded
//! into a projection and alone), attention on both routes — and every ISA this CPU runs gives
//! the results of the session's default kernels, within rounding.
//!
//! The variable is read once per process, so each ISA runs in a child process: this test binary
//! again, on this test alone, with the variable set; it writes its outputs and what its session
//! chose to a file that the parent compares with its own run.

use std::process::Command;

use attnrt_kernels::{Isa, StandaloneAct, ISA_ENV};
use attnrt_onnx::attr::{make_int, make_string};
use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{NamedTensor, Session, Tensor, Threads};
use attnrt_testkit::GraphBuilder;
use attnrt_testkit::{model, node, node_with_attrs, seeded_values, tensor_f32, value_info};

/// Set in a child: the file it writes its run to.
const CHILD_OUT: &str = "ATTNRT_TEST_KERNEL_ISA_OUT";

const TEST: &str = "every_isa_reaches_every_op_and_gives_the_default_results";

/// x `[1, 40, 64]` → projection + bias → LayerNorm → (Gelu alone → `g`), (projection → Gelu →
/// `f`); attention over the projection causal (`a`, 40 queries: the flash kernel) and from the
/// 3 queries `z` (`d`: the decode path).
fn layered_model() -> ModelProto {
    let mut g = GraphBuilder::new("layers");
    g.input(value_info("x", DataType::Float, &[1i64, 40, 64]));
    g.input(value_info("z", DataType::Float, &[1i64, 3, 64]));
    let w = |name: &str, dims: &[i64], seed| {
        let n = dims.iter().product::<i64>() as usize;
        tensor_f32(name, dims, &seeded_values(n, seed))
    };
    for t in [
        w("w1", &[64, 64], 1),
        w("b1", &[64], 2),
        w("scale", &[64], 3),
        w("shift", &[64], 4),
        w("w2", &[64, 128], 5),
    ] {
        g.initializer(t);
    }
    g.node(node("mm1", "MatMul", &["x", "w1"], &["p"]));
    g.node(node("bias1", "Add", &["p", "b1"], &["h"]));
    let ln = vec![make_int("axis", -1)];
    g.node(node_with_attrs(
        "ln",
        "LayerNormalization",
        &["h", "scale", "shift"],
        &["n"],
        ln,
    ));
    let erf = || vec![make_string("approximate", "none")];
    g.node(node_with_attrs("gelu_alone", "Gelu", &["n"], &["g"], erf()));
    g.node(node("mm2", "MatMul", &["n", "w2"], &["q2"]));
    let tanh = vec![make_string("approximate", "tanh")];
    g.node(node_with_attrs(
        "gelu_folded",
        "Gelu",
        &["q2"],
        &["f"],
        tanh,
    ));
    let heads = || vec![make_int("q_num_heads", 4), make_int("kv_num_heads", 4)];
    let mut causal = heads();
    causal.push(make_int("is_causal", 1));
    g.node(node_with_attrs(
        "attn",
        "Attention",
        &["h", "h", "h"],
        &["a"],
        causal,
    ));
    g.node(node_with_attrs(
        "decode",
        "Attention",
        &["z", "h", "h"],
        &["d"],
        heads(),
    ));
    for (name, dims) in [
        ("g", [1i64, 40, 64]),
        ("f", [1, 40, 128]),
        ("a", [1, 40, 64]),
        ("d", [1, 3, 64]),
    ] {
        g.output(value_info(name, DataType::Float, &dims));
    }
    model(g.finish(), 23)
}

fn inputs() -> Vec<NamedTensor> {
    [("x", [1usize, 40, 64]), ("z", [1, 3, 64])]
        .into_iter()
        .enumerate()
        .map(|(i, (name, dims))| NamedTensor {
            name: name.into(),
            tensor: Tensor::from_shape(&dims, &seeded_values(dims.iter().product(), 10 + i as u32))
                .unwrap(),
        })
        .collect()
}

/// One run on this process's kernels: what the session chose (one line), then the outputs.
fn run() -> (String, Vec<Vec<f32>>) {
    let threads = Threads::new(Some(2)).unwrap();
    let s = Session::build(&layered_model(), &inputs(), &threads, "layers.onnx").unwrap();
    let outputs = s.run(&inputs()).unwrap();
    let outputs = outputs
        .iter()
        .map(|t| {
            t.tensor
                .try_as_plain_ram()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .to_vec()
        })
        .collect();
    let k = s.kernels();
    let names = s.op_names();
    let count = |op: &str| names.iter().filter(|n| *n == op).count();
    let gelus = count("AttnrtGelu");
    assert_eq!(count("AttnrtProjection"), 2, "{names:?}");
    assert_eq!(count("AttnrtLayerNorm"), 1, "{names:?}");
    assert_eq!(count("AttnrtAttention"), 2, "{names:?}");
    assert_eq!(
        gelus,
        if k.projection().epilogue() { 1 } else { 2 },
        "{names:?}"
    );
    let standalone = match k.standalone_act() {
        StandaloneAct::Caller => "caller".to_string(),
        StandaloneAct::Kernel(act) => act.isa().to_string(),
    };
    let chose = format!(
        "{} | {} | norm {} | gelu {standalone} | {gelus} gelu op(s)",
        k.isa(),
        k.projection(),
        k.norm().isa()
    );
    (chose, outputs)
}

fn write_run(path: &str) {
    let (chose, outputs) = run();
    let mut text = chose;
    for y in outputs {
        text.push('\n');
        text.push_str(
            &y.iter()
                .map(|v| v.to_bits().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    std::fs::write(path, text).unwrap();
}

fn read_run(path: &std::path::Path) -> (String, Vec<Vec<f32>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let chose = lines.next().unwrap().to_string();
    let outputs = lines
        .map(|l| {
            l.split(' ')
                .map(|b| f32::from_bits(b.parse().unwrap()))
                .collect()
        })
        .collect();
    (chose, outputs)
}

#[test]
fn every_isa_reaches_every_op_and_gives_the_default_results() {
    if let Ok(path) = std::env::var(CHILD_OUT) {
        return write_run(&path);
    }
    let (default_chose, want) = run();
    let best = Isa::best_available();
    let dir = tempfile::tempdir().unwrap();
    for isa in Isa::available() {
        let path = dir.path().join(isa.name());
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--test-threads", "1"])
            .env(ISA_ENV, isa.name())
            .env(CHILD_OUT, &path)
            .output()
            .unwrap();
        assert!(
            child.status.success(),
            "{isa}: {}{}",
            String::from_utf8_lossy(&child.stdout),
            String::from_utf8_lossy(&child.stderr)
        );
        let (chose, got) = read_run(&path);
        println!("{isa}: {chose}");
        assert!(chose.starts_with(&format!("{isa} |")), "{chose}");
        if isa == best {
            // (unless this process runs with an ISA forced already)
            let forced = std::env::var(ISA_ENV).is_ok_and(|v| !v.trim().is_empty());
            assert!(
                forced || chose == default_chose,
                "{chose} vs default {default_chose}"
            );
        } else {
            // Lowered: attnrt's own kernels of that ISA everywhere, no activation epilogue.
            let own = format!("| attnrt's panel kernel ({isa}) | norm {isa} | gelu {isa} | 2 gelu");
            assert!(chose.contains(&own), "{isa}: {chose}");
        }
        for (o, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len());
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{isa}: output {o}[{i}] = {g}, default kernels {w}"
                );
            }
        }
    }
}
