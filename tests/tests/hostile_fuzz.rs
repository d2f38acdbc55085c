//! The stable-toolchain fuzz harness (issue 5, item 2): seeded byte-level and structure-level
//! mutations of the shipped models and of the hostile corpus, for a bounded time, through
//! the same body as the cargo-fuzz target (`tests/src/hostile_fuzz.rs`). Any panic is a
//! finding: the input is saved under `target/tmp/fuzz-findings/` and the test fails.
//!
//! `ATTNRT_FUZZ_SECS` sets the time (default 8 s); `ATTNRT_FUZZ_SEED` the seed (default 1).
//! `scripts/fuzz.py --harness-seconds N` runs it longer (and `--libfuzzer-seconds N` the
//! libFuzzer target, where that can be built).

#[path = "../src/hostile.rs"]
mod hostile;
#[path = "../src/hostile_fuzz.rs"]
mod hostile_fuzz;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use attnrt_onnx::proto::{GraphProto, ModelProto};
use attnrt_onnx::Message;
use hostile_fuzz::{fuzz_one, Reached};

/// xorshift64*: deterministic for a seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in)
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        // The big BART exports make each iteration slow without covering anything new.
        .filter(|p| {
            std::fs::metadata(p)
                .map(|m| m.len() < 400_000)
                .unwrap_or(false)
        })
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    let dir = tempfile::tempdir().unwrap();
    for case in hostile::write_corpus(dir.path()) {
        if case.name.starts_with("subgraphs_5000") || case.name == "nodes_over_limit" {
            continue; // big, and their point is the size, which mutation cannot improve
        }
        out.push((
            format!("corpus:{}", case.name),
            std::fs::read(&case.model).unwrap(),
        ));
    }
    out
}

const OPS: &[&str] = &[
    "Softmax",
    "MatMul",
    "Transpose",
    "Reshape",
    "Mul",
    "Div",
    "Add",
    "Where",
    "Cast",
    "Attention",
    "Sqrt",
    "Shape",
    "Gather",
    "Unsqueeze",
    "Concat",
    "Expand",
    "Split",
    "Slice",
    "Identity",
    "ConstantOfShape",
    "If",
    "Constant",
    "Gemm",
    "Squeeze",
];

/// Names of every tensor the graph mentions.
fn names(g: &GraphProto) -> Vec<String> {
    let mut v: Vec<String> = g.input.iter().map(|i| i.name.clone()).collect();
    v.extend(g.initializer.iter().map(|t| t.name.clone()));
    v.extend(g.node.iter().flat_map(|n| n.output.iter().cloned()));
    v
}

/// One structure-level mutation: the kind of damage that gets past decoding and exercises
/// validation, the shape evaluator and the fusion predicates.
fn mutate_model(m: &mut ModelProto, rng: &mut Rng) {
    let Some(g) = m.graph.as_mut() else { return };
    let n = g.node.len();
    let all = names(g);
    match rng.below(14) {
        0 if n > 0 => {
            g.node.remove(rng.below(n));
        }
        1 if n > 0 && !all.is_empty() => {
            let node = &mut g.node[rng.below(n)];
            if !node.input.is_empty() {
                let i = rng.below(node.input.len());
                node.input[i] = all[rng.below(all.len())].clone();
            }
        }
        2 if n > 0 => g.node[rng.below(n)].op_type = OPS[rng.below(OPS.len())].to_string(),
        3 if n > 0 => {
            // Perturb an integer attribute (perm, axis, axes, num_heads...).
            let node = &mut g.node[rng.below(n)];
            let k = rng.below(node.attribute.len().max(1));
            if let Some(a) = node.attribute.get_mut(k) {
                a.i = [-2i64, -1, 0, 1, 2, 3, 4, 1 << 40, i64::MIN][rng.below(9)];
                if !a.ints.is_empty() {
                    let k = rng.below(a.ints.len());
                    a.ints[k] = [-5i64, -1, 0, 1, 2, 3, 7, i64::MAX][rng.below(8)];
                }
                a.f = [0.0f32, -1.0, f32::NAN, f32::INFINITY, 1e-30, 0.125][rng.below(6)];
            }
        }
        4 if !g.initializer.is_empty() => {
            // Change a constant's value (scales, shapes, perms live in initializers).
            let k = rng.below(g.initializer.len());
            let t = &mut g.initializer[k];
            if !t.raw_data.is_empty() {
                let i = rng.below(t.raw_data.len());
                let mut data = t.raw_data.to_vec();
                data[i] = rng.next() as u8;
                t.raw_data = data.into();
            }
        }
        5 if !g.initializer.is_empty() => {
            let k = rng.below(g.initializer.len());
            let t = &mut g.initializer[k];
            if !t.dims.is_empty() {
                let d = rng.below(t.dims.len());
                t.dims[d] = [0i64, 1, -1, 3, 1 << 20, i64::MAX][rng.below(6)];
            } else {
                t.dims.push(rng.below(5) as i64);
            }
        }
        6 => {
            let v = [1i64, 7, 12, 13, 17, 18, 20, 21, 22, 23, 24, 25, 99][rng.below(13)];
            attnrt_onnx::opset::set_version(m, "", v);
        }
        7 if n > 1 => {
            let (a, b) = (rng.below(n), rng.below(n));
            g.node.swap(a, b);
        }
        8 if n > 0 => {
            let dup = g.node[rng.below(n)].clone();
            g.node.push(dup);
        }
        9 if n > 0 => {
            let node = &mut g.node[rng.below(n)];
            if !node.output.is_empty() && !all.is_empty() {
                node.output[0] = all[rng.below(all.len())].clone();
            }
        }
        10 if !g.input.is_empty() => {
            // Declared input shapes drive symbolic shape evaluation.
            let k = rng.below(g.input.len());
            if let Some(attnrt_onnx::proto::type_proto::Value::TensorType(tt)) =
                g.input[k].r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                if let Some(shape) = tt.shape.as_mut() {
                    if !shape.dim.is_empty() {
                        let d = rng.below(shape.dim.len());
                        shape.dim[d].value = Some(
                            attnrt_onnx::proto::tensor_shape_proto::dimension::Value::DimValue(
                                [0i64, 1, -3, 5, 64, 1 << 40][rng.below(6)],
                            ),
                        );
                    }
                }
                tt.elem_type = [1, 7, 10, 16, 0, 99][rng.below(6)];
            }
        }
        11 if n > 0 => {
            let node = &mut g.node[rng.below(n)];
            node.input.truncate(rng.below(node.input.len() + 1));
        }
        12 if n > 0 => {
            let node = &mut g.node[rng.below(n)];
            node.attribute.clear();
        }
        _ if n > 0 => {
            let node = &mut g.node[rng.below(n)];
            node.input.push(if all.is_empty() {
                String::new()
            } else {
                all[rng.below(all.len())].clone()
            });
        }
        _ => {}
    }
}

/// One byte-level mutation.
fn mutate_bytes(data: &mut Vec<u8>, rng: &mut Rng) {
    if data.is_empty() {
        data.push(rng.next() as u8);
        return;
    }
    match rng.below(6) {
        0 => {
            for _ in 0..=rng.below(8) {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
        }
        1 => {
            let i = rng.below(data.len());
            data[i] = [0u8, 0xff, 0x7f, 0x80, 0x01, rng.next() as u8][rng.below(6)];
        }
        2 => data.truncate(rng.below(data.len())),
        3 => {
            let i = rng.below(data.len());
            let extra: Vec<u8> = (0..rng.below(16) + 1).map(|_| rng.next() as u8).collect();
            data.splice(i..i, extra);
        }
        4 => {
            let i = rng.below(data.len());
            let len = rng.below((data.len() - i).min(256)) + 1;
            let chunk = data[i..i + len].to_vec();
            let j = rng.below(data.len());
            data.splice(j..j, chunk);
        }
        _ => {
            let i = rng.below(data.len());
            let len = rng.below((data.len() - i).min(256)) + 1;
            data.drain(i..i + len);
        }
    }
}

fn findings_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-findings")
}

#[test]
fn mutated_models_never_panic() {
    let secs: u64 = std::env::var("ATTNRT_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let seed: u64 = std::env::var("ATTNRT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let seeds = seeds();
    let decoded: Vec<Option<ModelProto>> = seeds
        .iter()
        .map(|(_, b)| ModelProto::decode(b.as_slice()).ok())
        .collect();
    let empty = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut reached: BTreeMap<Reached, usize> = BTreeMap::new();
    let mut findings = Vec::new();
    // Panics are caught per input; keep the default hook from printing each one twice.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut runs = 0usize;
    // Every seed once unmutated, then mutations until the deadline.
    while runs < seeds.len() || Instant::now() < deadline {
        let k = if runs < seeds.len() {
            runs
        } else {
            rng.below(seeds.len())
        };
        let (seed_name, seed_bytes) = &seeds[k];
        let input: Vec<u8> = if runs < seeds.len() {
            seed_bytes.clone()
        } else if let (Some(m), false) = (&decoded[k], rng.chance(3)) {
            let mut m = m.clone();
            for _ in 0..=rng.below(3) {
                mutate_model(&mut m, &mut rng);
            }
            m.encode_to_vec()
        } else {
            let mut b = seed_bytes.clone();
            for _ in 0..=rng.below(4) {
                mutate_bytes(&mut b, &mut rng);
            }
            b
        };
        runs += 1;
        match catch_unwind(AssertUnwindSafe(|| fuzz_one(&input, empty.path()))) {
            Ok(r) => *reached.entry(r).or_default() += 1,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                std::fs::create_dir_all(findings_dir()).unwrap();
                let file = findings_dir().join(format!("seed{seed}-run{runs}.onnx"));
                std::fs::write(&file, &input).unwrap();
                let msg: String = msg.chars().take(300).collect();
                findings.push(format!("{} (from {seed_name}): {msg}", file.display()));
                if findings.len() >= 20 {
                    break;
                }
            }
        }
    }
    std::panic::set_hook(hook);
    println!(
        "fuzz: seed {seed}, {secs} s, {runs} inputs, {} seeds; outcomes {reached:?}",
        seeds.len()
    );
    assert!(
        findings.is_empty(),
        "{} panicking input(s):\n{}",
        findings.len(),
        findings.join("\n")
    );
    // The harness must reach fusion, or it tests only the decoder.
    assert!(
        reached.get(&Reached::FusedBlocks).copied().unwrap_or(0) > 0,
        "no input reached a fused block: {reached:?}"
    );
}

/// Inputs the fuzzers found (and the cargo-fuzz corpus seeds kept in the repo) stay fixed:
/// every file under `fuzz/regressions/` goes through the fuzz body without a panic.
#[test]
fn fuzz_regressions_stay_fixed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let empty = tempfile::tempdir().unwrap();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| fuzz_one(&data, empty.path())));
        assert!(r.is_ok(), "{} panics again", path.display());
    }
}
