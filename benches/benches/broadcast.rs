//! Float32 `Mul` with a broadcast tract's fast kernels do not take (crates/attnrt-runtime/src/
//! broadcast_binary.rs) on attnrt's broadcast kernel against tract's generic broadcast, in paired
//! rounds (the two sessions alternate, order swapped every round; the ratio is the median of
//! per-round ratios). Each case is a chain of 24 `t = t · cos`, `cos` shared over the heads as a
//! rotary embedding's is:
//!
//! - `decode b4`: `[4, 12, 1, 64] × [4, 1, 1, 64]`, a batch-4 decode step's `q · cos`;
//! - `prefill b4`: `[4, 12, 128, 64] × [4, 1, 128, 64]`, a batch-4 prompt of 128 tokens.
//!
//! ```sh
//! cargo bench -p attnrt-benches --bench broadcast
//! ATTNRT_BENCH_THREADS=1,2 ATTNRT_BENCH_ROUNDS=50 cargo bench -p attnrt-benches --bench broadcast
//! ```

use anyhow::Result;
use attnrt::harness::time_paired;
use attnrt_benches::{env_list, machine_note, paired_row, random_input, Table};
use attnrt_onnx::{DataType, ModelProto};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, ShapePolicy, Threads};
use attnrt_testkit::{node, value_info, GraphBuilder};

/// Products in each chain.
const CHAIN: usize = 24;

struct Case {
    name: &'static str,
    model: ModelProto,
    inputs: Vec<NamedTensor>,
}

/// `t_{i+1} = t_i · cos`, [`CHAIN`] times, from `t_0 = q`.
fn chain(q: &[usize], cos: &[usize]) -> ModelProto {
    let dims = |s: &[usize]| s.iter().map(|&d| d as i64).collect::<Vec<_>>();
    let (q, cos) = (&dims(q)[..], &dims(cos)[..]);
    let mut g = GraphBuilder::new("rope_chain");
    g.input(value_info("q", DataType::Float, q));
    g.input(value_info("cos", DataType::Float, cos));
    let mut t = "q".to_string();
    for i in 0..CHAIN {
        let out = if i + 1 == CHAIN {
            "y".to_string()
        } else {
            format!("t{i}")
        };
        g.node(node(&format!("mul{i}"), "Mul", &[&t, "cos"], &[&out]));
        t = out;
    }
    g.output(value_info("y", DataType::Float, q));
    g.into_model(17)
}

fn case(name: &'static str, q: &[usize], cos: &[usize]) -> Result<Case> {
    Ok(Case {
        name,
        model: chain(q, cos),
        inputs: vec![random_input("q", q, 0)?, random_input("cos", cos, 1)?],
    })
}

fn session(case: &Case, threads: &Threads, attnrt_ops: bool) -> Result<Session> {
    let options = SessionOptions {
        attnrt_ops,
        shapes: ShapePolicy::PerShape,
        ..SessionOptions::default()
    };
    Session::new(&case.model, threads, case.name, &options)
}

fn main() -> Result<()> {
    let threads_list = env_list("ATTNRT_BENCH_THREADS", &[2])?;
    let rounds = env_list("ATTNRT_BENCH_ROUNDS", &[30])?[0];
    let cases = [
        case("decode b4", &[4, 12, 1, 64], &[4, 1, 1, 64])?,
        case("prefill b4", &[4, 12, 128, 64], &[4, 1, 128, 64])?,
    ];
    let mut table = Table::new(&[
        "case (24 Mul)",
        "threads",
        "tract ms (median)",
        "attnrt ms (median)",
        "tract / attnrt (median of rounds, q1-q3)",
    ]);
    for case in &cases {
        for &n in &threads_list {
            let threads = Threads::new(Some(n))?;
            let ours = session(case, &threads, true)?;
            let tract = session(case, &threads, false)?;
            let t = time_paired(&ours, &tract, &case.inputs, 3, rounds, || {})?;
            table.row(paired_row(case.name, n, &t, 4));
        }
    }
    println!("{}", table.render());
    println!(
        "{rounds} paired rounds after 3 warm-up runs each; {}",
        machine_note()
    );
    Ok(())
}
