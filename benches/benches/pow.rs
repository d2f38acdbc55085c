//! `Pow` by a constant small integer as multiplications (issue 17, crates/attnrt-runtime/src/
//! lower/pow.rs) against tract's scalar `powf`, in paired rounds (the two sessions alternate,
//! order swapped every round; the ratio is the median of per-round ratios):
//!
//! - `pow3` / `pow2` / `pow4`: one `Pow(x, c)` on a float32 `[1, 512, 3072]` input, the size of
//!   GPT-2 small's GELU at L=512 (testkit's `pow_model`);
//! - `gpt2_eager.ts`: the shipped tiny GPT-2 (its GELU's `Pow(x, 3)` in both layers) on its
//!   saved inputs, unfused graph.
//!
//! ```sh
//! cargo bench -p attnrt-benches --bench pow
//! ATTNRT_BENCH_THREADS=1,2 ATTNRT_BENCH_ROUNDS=50 cargo bench -p attnrt-benches --bench pow
//! ```

use anyhow::Result;
use attnrt::harness::{read_npz_tensors, time_paired};
use attnrt_benches::{env_list, machine_note, paired_row, random_input, Table};
use attnrt_onnx::{load_model, Limits, ModelProto};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, ShapePolicy, Threads};
use attnrt_testkit::{manifest::models_dir, pow_model};

struct Case {
    name: String,
    model: ModelProto,
    inputs: Vec<NamedTensor>,
}

fn cases() -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    for exponent in [3.0, 2.0, 4.0] {
        cases.push(Case {
            name: format!("pow{exponent} [1,512,3072]"),
            model: pow_model(&[1, 512, 3072], exponent),
            inputs: vec![random_input("x", &[1, 512, 3072], 0)?],
        });
    }
    let dir = models_dir();
    cases.push(Case {
        name: "gpt2_eager.ts".into(),
        model: load_model(&dir.join("gpt2_eager.ts.onnx"), &Limits::default())?.model,
        inputs: read_npz_tensors(&dir.join("gpt2_eager.inputs.npz"), 1 << 28)?,
    });
    Ok(cases)
}

fn session(case: &Case, threads: &Threads, pow_as_mul: bool) -> Result<Session> {
    // One plan per shape, as `attnrt run`/`attnrt bench` build theirs.
    let options = SessionOptions {
        pow_as_mul,
        shapes: ShapePolicy::PerShape,
        ..SessionOptions::default()
    };
    Session::new(&case.model, threads, &case.name, &options)
}

fn main() -> Result<()> {
    let threads_list = env_list("ATTNRT_BENCH_THREADS", &[2])?;
    let rounds = env_list("ATTNRT_BENCH_ROUNDS", &[30])?[0];
    let mut table = Table::new(&[
        "case",
        "threads",
        "powf ms (median)",
        "muls ms (median)",
        "powf / muls (median of rounds, q1-q3)",
    ]);
    for case in cases()? {
        for &n in &threads_list {
            let threads = Threads::new(Some(n))?;
            let lowered = session(&case, &threads, true)?;
            let reference = session(&case, &threads, false)?;
            let t = time_paired(&lowered, &reference, &case.inputs, 3, rounds, || {})?;
            table.row(paired_row(&case.name, n, &t, 3));
        }
    }
    println!("{}", table.render());
    println!(
        "{rounds} paired rounds after 3 warm-up runs each; {}",
        machine_note()
    );
    Ok(())
}
