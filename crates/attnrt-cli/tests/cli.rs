//! End-to-end tests of the `attnrt` binary: the bad-input cases of the foundation issue (one
//! clear `error:` line, non-zero exit, no panic, no partial output file), `fuse` refusing to
//! overwrite its input, exit codes, and runs of shipped models against their PyTorch outputs.

mod common;

use common::attnrt;

use std::path::{Path, PathBuf};
use std::process::Output;

use ::attnrt::onnx::DataType;
use ::attnrt::ModelProto;
use attnrt_testkit::{
    model, node, node_with_attrs, npy_bytes, tensor_f32, value_info, GraphBuilder,
};
use prost::Message;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts a clean failure: the given exit code, exactly one stderr line starting with `error:`
/// and containing every `needle`, and no panic text.
fn assert_clean_error(o: &Output, code: i32, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one stderr line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr should mention {n:?}: {err}");
    }
}

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// `y = x · W` with x `[batch, sequence, 4]`, W a 4×3 initializer: a tiny valid model.
fn tiny_model() -> ModelProto {
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let mut g = GraphBuilder::new("tiny");
    g.node(node("mm", "MatMul", &["x", "w"], &["y"]));
    g.initializer(tensor_f32("w", &[4, 3], &w));
    g.input(value_info(
        "x",
        DataType::Float,
        &["batch", "sequence", "4"],
    ));
    g.output(value_info(
        "y",
        DataType::Float,
        &["batch", "sequence", "3"],
    ));
    model(g.finish(), 17)
}

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (i as f32 * 0.1).to_le_bytes())
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let f = Fixture {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(f.path("tiny.onnx"), tiny_model().encode_to_vec()).unwrap();
        f
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn s(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

#[test]
fn missing_model_file() {
    let f = Fixture::new();
    let out = f.s("out.npz");
    let o = attnrt(&["run", &f.s("nope.onnx"), "--output", &out]);
    assert_clean_error(&o, 1, &["nope.onnx"]);
    assert!(!f.path("out.npz").exists());
}

#[test]
fn truncated_model_file() {
    let f = Fixture::new();
    let bytes = tiny_model().encode_to_vec();
    std::fs::write(f.path("cut.onnx"), &bytes[..bytes.len() * 2 / 3]).unwrap();
    let o = attnrt(&["run", &f.s("cut.onnx"), "--output", &f.s("out.npz")]);
    assert_clean_error(&o, 1, &["cut.onnx"]);
    assert!(!f.path("out.npz").exists());
    let o = attnrt(&["fuse", &f.s("cut.onnx"), "-o", &f.s("fused.onnx")]);
    assert_clean_error(&o, 1, &["cut.onnx"]);
    assert!(!f.path("fused.onnx").exists());
}

#[test]
fn non_onnx_file() {
    let f = Fixture::new();
    std::fs::write(
        f.path("notes.onnx"),
        "these are not the weights you are looking for\n",
    )
    .unwrap();
    let o = attnrt(&["run", &f.s("notes.onnx")]);
    assert_clean_error(&o, 1, &["notes.onnx"]);
    let o = attnrt(&["fuse", &f.s("notes.onnx"), "-o", &f.s("fused.onnx")]);
    assert_clean_error(&o, 1, &["notes.onnx"]);
    assert!(!f.path("fused.onnx").exists());
}

/// A Transpose whose `perm` repeats an axis (issue 28: a fuzzer's finding; `run` hung or
/// ate 24 GB on it and `fuse` wrote it out beside a fused block) is refused by every command
/// at load, with one line naming the file, node and attribute, and no output file.
#[test]
fn a_repeated_transpose_axis_is_refused_by_every_command() {
    let f = Fixture::new();
    let mut g = GraphBuilder::new("perm");
    g.node(node_with_attrs(
        "t",
        "Transpose",
        &["x"],
        &["y"],
        vec![::attnrt::onnx::attr::make_ints("perm", &[0, 1, 1, 3])],
    ));
    g.input(value_info("x", DataType::Float, &["1", "2", "3", "4"]));
    g.output(value_info("y", DataType::Float, &["1", "2", "2", "4"]));
    std::fs::write(f.path("perm.onnx"), model(g.finish(), 17).encode_to_vec()).unwrap();
    let needles = [
        "perm.onnx",
        "node 't' (Transpose): attribute perm [0, 1, 1, 3] repeats axis 1",
    ];
    let (m, out, fused) = (f.s("perm.onnx"), f.s("out.npz"), f.s("fused.onnx"));
    let commands: [&[&str]; 5] = [
        &["run", &m, "--output", &out],
        &["run", &m, "--no-fuse", "--output", &out],
        &["fuse", &m, "-o", &fused],
        &["bench", &m, "--reps", "1"],
        &["generate", &m, "--prompt-len", "2", "--max-new-tokens", "1"],
    ];
    for args in commands {
        assert_clean_error(&attnrt(args), 1, &needles);
    }
    assert!(!f.path("out.npz").exists());
    assert!(!f.path("fused.onnx").exists());
}

/// Writes `npy` to `x.npy` and runs `attnrt run tiny.onnx --input <name>=x.npy`, with
/// `--output out.npz` when `output` is set.
fn run_tiny_with_npy(f: &Fixture, name: &str, npy: &[u8], output: bool) -> Output {
    std::fs::write(f.path("x.npy"), npy).unwrap();
    let (model, input, out) = (
        f.s("tiny.onnx"),
        format!("{name}={}", f.s("x.npy")),
        f.s("out.npz"),
    );
    let mut args = vec!["run", model.as_str(), "--input", input.as_str()];
    if output {
        args.extend(["--output", out.as_str()]);
    }
    attnrt(&args)
}

#[test]
fn unknown_input_name() {
    let f = Fixture::new();
    let npy = npy_bytes("<f4", &[1, 2, 4], &f32_bytes(8));
    let o = run_tiny_with_npy(&f, "bogus", &npy, true);
    assert_clean_error(&o, 1, &["bogus", "x.npy"]);
    assert!(!f.path("out.npz").exists());
}

#[test]
fn wrong_shape_npy() {
    let f = Fixture::new();
    let npy = npy_bytes("<f4", &[1, 2, 5], &f32_bytes(10));
    let o = run_tiny_with_npy(&f, "x", &npy, true);
    assert_clean_error(&o, 1, &["x.npy", "'x'", "[1, 2, 5]"]);
    assert!(!f.path("out.npz").exists());
}

#[test]
fn wrong_dtype_npy() {
    let f = Fixture::new();
    let data: Vec<u8> = (0..8i64).flat_map(|v| v.to_le_bytes()).collect();
    let o = run_tiny_with_npy(&f, "x", &npy_bytes("<i8", &[1, 2, 4], &data), false);
    assert_clean_error(&o, 1, &["x.npy", "int64", "float32"]);
}

#[test]
fn truncated_npy() {
    let f = Fixture::new();
    let full = npy_bytes("<f4", &[1, 2, 4], &f32_bytes(8));
    let o = run_tiny_with_npy(&f, "x", &full[..full.len() - 5], false);
    assert_clean_error(&o, 1, &["x.npy"]);
}

#[test]
fn npz_missing_an_input() {
    let f = Fixture::new();
    // An npz with only an unrelated array: written by `run --output` of the tiny model.
    let o = attnrt(&["run", &f.s("tiny.onnx"), "--output", &f.s("y.npz")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = attnrt(&["run", &f.s("tiny.onnx"), "--input-npz", &f.s("y.npz")]);
    assert_clean_error(&o, 1, &["y.npz", "'x'"]);
}

#[test]
fn unknown_dim_and_usage_errors() {
    let f = Fixture::new();
    let o = attnrt(&["run", &f.s("tiny.onnx"), "--dim", "heads=4"]);
    assert_clean_error(&o, 1, &["heads", "batch", "sequence"]);
    let o = attnrt(&["run", &f.s("tiny.onnx"), "--dim", "batch"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = attnrt(&["run"]);
    assert_eq!(o.status.code(), Some(2));
    let o = attnrt(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("Exit codes"));
}

#[test]
fn run_random_inputs_json_and_output_file() {
    let f = Fixture::new();
    let o = attnrt(&[
        "run",
        &f.s("tiny.onnx"),
        "--dim",
        "batch=2",
        "--dim",
        "sequence=3",
        "--json",
        "--output",
        &f.s("y.npz"),
        "--threads",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["outputs"][0]["name"], "y");
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!([2, 3, 3]));
    assert_eq!(v["ok"], true);
    assert!(v["fusion_note"]
        .as_str()
        .unwrap()
        .contains("no attention block"));
    assert!(f.path("y.npz").exists());
    // The saved outputs are their own reference: --expect passes, and a different seed fails
    // with exit code 3.
    let o = attnrt(&[
        "run",
        &f.s("tiny.onnx"),
        "--dim",
        "batch=2",
        "--dim",
        "sequence=3",
        "--expect",
        &f.s("y.npz"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = attnrt(&[
        "run",
        &f.s("tiny.onnx"),
        "--dim",
        "batch=2",
        "--dim",
        "sequence=3",
        "--seed",
        "7",
        "--expect",
        &f.s("y.npz"),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("'y'"));
}

#[test]
fn fuse_never_overwrites_its_input_unless_in_place() {
    let f = Fixture::new();
    let before = std::fs::read(f.path("tiny.onnx")).unwrap();
    let o = attnrt(&["fuse", &f.s("tiny.onnx"), "-o", &f.s("tiny.onnx")]);
    assert_clean_error(&o, 1, &["--in-place"]);
    // Same file through another spelling.
    let other = format!("{}/./tiny.onnx", f.dir.path().display());
    let o = attnrt(&["fuse", &f.s("tiny.onnx"), "-o", &other]);
    assert_clean_error(&o, 1, &["refusing"]);
    assert_eq!(std::fs::read(f.path("tiny.onnx")).unwrap(), before);
    let o = attnrt(&["fuse", &f.s("tiny.onnx"), "-o", &f.s("fused.onnx")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("no attention block fused"),
        "{}",
        stdout(&o)
    );
    assert!(f.path("fused.onnx").exists());
    let o = attnrt(&["fuse", &f.s("tiny.onnx"), "--in-place"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A shipped model, run with its saved inputs, reproduces PyTorch's saved outputs, fused and
/// unfused. Tolerance: atol 1e-4 + rtol 1e-3 (float32 through a different summation order;
/// ONNX Runtime vs PyTorch differ by ~1e-6 on these models, see models/manifest.json).
#[test]
fn shipped_mha_seed_reproduces_pytorch_outputs() {
    let dir = models_dir();
    let model = dir.join("mha_seed.ts.onnx");
    let inputs = dir.join("mha_seed.inputs.npz");
    let outputs = dir.join("mha_seed.outputs.npz");
    let o = attnrt(&[
        "run",
        &model.display().to_string(),
        "--input-npz",
        &inputs.display().to_string(),
        "--expect",
        &outputs.display().to_string(),
        "--atol",
        "1e-4",
        "--rtol",
        "1e-3",
        "--json",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        stdout(&o),
        stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["ok"], true);
    assert!(v["expect"]["unfused"][0]["ok"].as_bool().unwrap());
    if v["ran"]["fused"].as_bool().unwrap() {
        assert!(v["expect"]["fused"][0]["ok"].as_bool().unwrap());
        // Every fused block runs on attnrt's kernel, the projections on attnrt's gemm op.
        let blocks = v["fusion"]["blocks"].as_array().unwrap().len();
        assert!(blocks > 0);
        assert_eq!(v["ops"]["fused"]["attention"], blocks, "{}", v["ops"]);
        assert!(
            v["ops"]["fused"]["projection"].as_u64().unwrap() >= 4,
            "{}",
            v["ops"]
        );
    }
    assert_eq!(v["ops"]["unfused"]["attention"], 0, "{}", v["ops"]);
    assert!(v["ops"]["kernel_isa"].is_string(), "{}", v["ops"]);
}

/// A float16 file (models/half/): `--half-as-float` on (default) runs its projections on
/// attnrt's float32 op and says so in text and `--json`; off runs none there and says that.
#[test]
fn half_as_float_is_reported_and_switches_off() {
    let dir = models_dir().join("half");
    let model = dir.join("bert_eager.ts.fp16.onnx").display().to_string();
    let inputs = dir
        .join("bert_eager.ts.fp16.default.inputs.npz")
        .display()
        .to_string();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            &model,
            "--input-npz",
            &inputs,
            "--atol",
            "3e-2",
            "--rtol",
            "3e-2",
        ];
        args.extend_from_slice(extra);
        let o = attnrt(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        o
    };
    let v: serde_json::Value = serde_json::from_str(&stdout(&run(&["--json"]))).unwrap();
    assert!(
        v["half_as_float"]["tensors"].as_u64().unwrap() > 0,
        "{}",
        v["half_as_float"]
    );
    assert!(
        v["half_as_float"]["declined"].is_null(),
        "{}",
        v["half_as_float"]
    );
    assert!(
        v["ops"]["fused"]["projection"].as_u64().unwrap() > 0,
        "{}",
        v["ops"]
    );
    let off: serde_json::Value =
        serde_json::from_str(&stdout(&run(&["--json", "--half-as-float", "off"]))).unwrap();
    assert!(off["half_as_float"].is_null(), "{}", off["half_as_float"]);
    assert_eq!(off["ops"]["fused"]["projection"], 0, "{}", off["ops"]);
    let text = stdout(&run(&[]));
    assert!(
        text.contains("half precision: float16/bfloat16 arithmetic runs in float32"),
        "{text}"
    );
    let text = stdout(&run(&["--half-as-float", "off"]));
    assert!(
        text.contains("half precision: run in half precision as declared"),
        "{text}"
    );
}

#[test]
fn bench_json_reports_both_paths_and_what_they_ran_on() {
    let dir = models_dir();
    let model = dir.join("mha_seed.ts.onnx");
    let inputs = dir.join("mha_seed.inputs.npz");
    let o = attnrt(&[
        "bench",
        &model.display().to_string(),
        "--input-npz",
        &inputs.display().to_string(),
        "--warmup",
        "1",
        "--reps",
        "3",
        "--threads",
        "1",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    // stdout is one JSON object (the progress bar goes to stderr).
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["blocks_fused"], 1);
    assert_eq!(v["threads"], 1);
    for path in ["fused", "unfused"] {
        let median = v[path]["median_ms"].as_f64().unwrap();
        assert!(median > 0.0 && median.is_finite(), "{path}: {}", v[path]);
        assert_eq!(v[path]["reps"], 3, "{path}: {}", v[path]);
    }
    // The speedup is the median of the per-round ratios, inside its own quartiles.
    let q: Vec<f64> = v["speedup_quartiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(q.len(), 3, "{}", v["speedup_quartiles"]);
    assert!(q[0] > 0.0 && q[0] <= q[1] && q[1] <= q[2], "{q:?}");
    assert_eq!(v["speedup"].as_f64().unwrap(), q[1]);
    assert_eq!(v["ops"]["fused"]["attention"], 1, "{}", v["ops"]);
    assert_eq!(v["ops"]["unfused"]["attention"], 0, "{}", v["ops"]);
}

/// A debug build says its timings mean nothing, in text and in `--json` (`"build"`); the test
/// binary is a debug build unless the suite runs with `--release`.
#[test]
fn timings_say_which_build_they_come_from() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/mha_seed.ts.onnx");
    let debug = cfg!(debug_assertions);
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_attnrt"))
        .args(["run", model])
        .output()
        .unwrap();
    assert!(text.status.success());
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert_eq!(
        stdout.contains("note: debug build; timings are not meaningful"),
        debug,
        "{stdout}"
    );
    let json = std::process::Command::new(env!("CARGO_BIN_EXE_attnrt"))
        .args(["run", model, "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["build"], if debug { "debug" } else { "release" });
}
