//! Per-token latency of a whole decoder with a key/value cache: attnrt (fused, the session
//! `attnrt generate` uses) against ONNX Runtime on the same model file, as-is and after its
//! transformers optimizer, in interleaved rounds.
//!
//! A round of one engine is `ATTNRT_BENCH_STEPS` (default 32) greedy one-token steps starting
//! from a seeded random cache of `P` keys per layer (P ∈ `ATTNRT_BENCH_LENS`, default 128, 1024,
//! 4096), each step's presents fed back as the next past, as a generation loop does (so a round
//! covers P … P + steps − 1). Rounds of the engines alternate (attnrt, ORT, ORT optimized,
//! attnrt, …; `ATTNRT_BENCH_ROUNDS`, default 7) with a pause between them, since this machine's
//! speed drifts; the table gives each engine's median step time over all its rounds and the
//! quartiles of the per-round ratios ORT/attnrt. Position ids wrap modulo 128 (the tiny GPT-2s'
//! learned positions; a step's cost does not depend on their values), the same in both engines.
//!
//! Models: `ATTNRT_BENCH_MODELS` (names under `models/`, default `gpt2_cache_eager.ts` and
//! `llama_cache_eager.ts`), threads `ATTNRT_BENCH_THREADS` (first value, default 2),
//! `ATTNRT_BENCH_ORT=0` skips ONNX Runtime. ORT runs in `python/ort_decoder_step.py --serve`
//! children (`$ATTNRT_PYTHON`, else `python3`); the optimized case needs sympy.
//! Run: `cargo bench -p attnrt-benches --bench decoder_step`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use attnrt::generate::DecoderSignature;
use attnrt_benches::ort::{self, OrtServer};
use attnrt_benches::{env_list, fmt_opt, machine_note, median, quartiles, Table};
use attnrt_onnx::ModelProto;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, ShapePolicy, Tensor, Threads};

/// The allocator the shipped CLI and Python module use (`--no-default-features`: the system's).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Position ids wrap modulo this (see the module docs; `ort_decoder_step.py` does the same).
const POSITIONS: usize = 128;

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models")
}

/// One decoder: its fused model's session and signature.
struct Decoder {
    name: String,
    path: PathBuf,
    signature: DecoderSignature,
    session: Session,
}

impl Decoder {
    fn open(name: &str, threads: &Threads) -> Result<Decoder> {
        let path = models_dir().join(format!("{name}.onnx"));
        let model = attnrt::load(&path)?;
        let fused = attnrt::fuse(&model)?;
        let blocks = fused.report.blocks.len();
        anyhow::ensure!(blocks > 0, "{name}: attnrt fused no attention block");
        println!("{name}: {blocks} attention block(s) fused");
        let signature = DecoderSignature::detect(&fused.model, name)?;
        let session = open_session(&fused.model, &signature, threads, name)?;
        check_against_unfused(&session, &model, &signature, threads, name)?;
        Ok(Decoder {
            name: name.into(),
            path,
            signature,
            session,
        })
    }

    /// `steps` greedy steps from a fresh random cache of `past` keys; ms per step.
    fn round(&self, past: usize, steps: usize) -> Result<Vec<f64>> {
        let mut cache = random_cache(&self.signature, past)?;
        let (mut token, mut past, mut ms) = (1i64, past, Vec::with_capacity(steps));
        for _ in 0..steps {
            let mut inputs = step_inputs(&self.signature, token, past)?;
            inputs.append(&mut cache);
            let start = Instant::now();
            let outputs = self.session.run_owned(inputs)?;
            ms.push(start.elapsed().as_secs_f64() * 1e3);
            let (next, logits) = feed_back(&self.signature, outputs)?;
            cache = next;
            token = argmax(&logits)?;
            past += 1;
        }
        Ok(ms)
    }
}

fn open_session(
    model: &ModelProto,
    signature: &DecoderSignature,
    threads: &Threads,
    what: &str,
) -> Result<Session> {
    let options = SessionOptions {
        shapes: ShapePolicy::DynamicDims(signature.dynamic_dims()),
        ..SessionOptions::default()
    };
    Session::new(model, threads, what, &options)
}

/// One step at past 64 of the fused and the original graph: the logits must agree.
fn check_against_unfused(
    session: &Session,
    model: &ModelProto,
    signature: &DecoderSignature,
    threads: &Threads,
    what: &str,
) -> Result<()> {
    let reference = open_session(model, signature, threads, what)?;
    let mut inputs = step_inputs(signature, 3, 64)?;
    inputs.extend(random_cache(signature, 64)?);
    let ours = feed_back(signature, session.run(&inputs)?)?.1;
    let theirs = feed_back(signature, reference.run(&inputs)?)?.1;
    let d = attnrt::harness::diff_tensor("logits", &ours, &theirs, Default::default());
    anyhow::ensure!(
        d.ok,
        "{what}: fused and unfused logits differ by {:.2e}",
        d.max_abs
    );
    println!(
        "{what}: fused vs unfused logits at past 64: max |a−b| {:.1e}",
        d.max_abs
    );
    Ok(())
}

fn int_row(values: &[i64]) -> Result<Tensor> {
    Tensor::from_shape(&[1, values.len()], values)
}

/// input_ids, attention_mask and position_ids of a one-token step at `past` (int64; the
/// shipped decoders declare int64 for all three).
fn step_inputs(sig: &DecoderSignature, token: i64, past: usize) -> Result<Vec<NamedTensor>> {
    let mut t = vec![NamedTensor {
        name: sig.input_ids.clone(),
        tensor: int_row(&[token])?,
    }];
    if let Some((name, _)) = &sig.attention_mask {
        t.push(NamedTensor {
            name: name.clone(),
            tensor: int_row(&vec![1; past + 1])?,
        });
    }
    if let Some((name, _)) = &sig.position_ids {
        t.push(NamedTensor {
            name: name.clone(),
            tensor: int_row(&[(past % POSITIONS) as i64])?,
        });
    }
    Ok(t)
}

fn random_cache(sig: &DecoderSignature, past: usize) -> Result<Vec<NamedTensor>> {
    sig.cache
        .iter()
        .enumerate()
        .map(|(i, c)| {
            attnrt_benches::random_input(&c.past, &[1, c.heads, past, c.head_size], 100 + i as u64)
        })
        .collect()
}

/// The presents renamed as the next step's pasts, and the logits.
fn feed_back(
    sig: &DecoderSignature,
    mut outputs: Vec<NamedTensor>,
) -> Result<(Vec<NamedTensor>, Tensor)> {
    let mut take = |name: &str| -> Result<Tensor> {
        let at = outputs
            .iter()
            .position(|o| o.name == name)
            .with_context(|| format!("no output '{name}'"))?;
        Ok(outputs.swap_remove(at).tensor)
    };
    let cache = sig
        .cache
        .iter()
        .map(|c| {
            Ok(NamedTensor {
                name: c.past.clone(),
                tensor: take(&c.present)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((cache, take(&sig.logits)?))
}

fn argmax(logits: &Tensor) -> Result<i64> {
    let data = logits.try_as_plain_ram()?.as_slice::<f32>()?;
    let vocab = *logits.shape().last().context("logits have no axes")?;
    let last = &data[data.len() - vocab..];
    Ok(last
        .iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0 as i64)
}

/// The ORT children for one model and past: as-is, and after the transformers optimizer.
fn ort_servers(path: &Path, past: usize, threads: usize) -> Vec<(&'static str, OrtServer)> {
    if std::env::var("ATTNRT_BENCH_ORT").as_deref() == Ok("0") {
        return Vec::new();
    }
    let script = ort::script_path().with_file_name("ort_decoder_step.py");
    let mut servers = Vec::new();
    for (label, extra) in [
        ("ORT", vec![]),
        ("ORT optimized", vec!["--optimize", "gpt2"]),
    ] {
        let mut args: Vec<String> = vec![
            "--serve".into(),
            "--model".into(),
            path.to_string_lossy().into(),
            "--past".into(),
            past.to_string(),
            "--threads".into(),
            threads.to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        match OrtServer::spawn(&script, &args, &format!("P{past}")) {
            Ok(Some(s)) => {
                if !s.ready["optimized"].is_null() {
                    println!("  {label}: the optimizer fused {}", s.ready["optimized"]);
                }
                servers.push((label, s));
            }
            Ok(None) => {}
            Err(e) => eprintln!("{label} skipped at P{past}: {e:#}"),
        }
    }
    servers
}

/// Interleaved rounds of attnrt and the ORT children at one past length; adds rows to `table`.
fn compare(dec: &Decoder, past: usize, threads: usize, table: &mut Table) -> Result<()> {
    let steps = env_list("ATTNRT_BENCH_STEPS", &[32])?[0];
    let rounds = env_list("ATTNRT_BENCH_ROUNDS", &[7])?[0];
    let mut servers = ort_servers(&dec.path, past, threads);
    // ORT's workers spin for ≈ 50 ms after a run; let them stop before the next engine runs.
    let idle = || std::thread::sleep(Duration::from_millis(150));
    dec.round(past, 4)?;
    let mut ours: Vec<f64> = Vec::new();
    let mut theirs: Vec<Vec<f64>> = vec![Vec::new(); servers.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); servers.len()];
    for _ in 0..rounds {
        let a = dec.round(past, steps)?;
        let a_med = median(&a);
        ours.extend(a);
        idle();
        for (i, (_, s)) in servers.iter_mut().enumerate() {
            let o = s.time(steps)?;
            ratios[i].push(median(&o) / a_med);
            theirs[i].extend(o);
            idle();
        }
    }
    let mut row = vec![
        dec.name.clone(),
        past.to_string(),
        format!("{:.3}", median(&ours)),
    ];
    for label in ["ORT", "ORT optimized"] {
        let at = servers.iter().position(|(l, _)| *l == label);
        let (ms, ratio) = match at {
            Some(i) => {
                let [p25, m, p75] = quartiles(&ratios[i]);
                (
                    Some(median(&theirs[i])),
                    format!("{m:.2} ({p25:.2}–{p75:.2})"),
                )
            }
            None => (None, "–".into()),
        };
        row.push(fmt_opt(ms, 3));
        row.push(ratio);
    }
    table.row(row);
    if let Some((_, s)) = servers.first() {
        println!("  onnxruntime {}", s.version);
    }
    Ok(())
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench` (and maybe a filter); this bench takes its options from the
    // environment only.
    let names = std::env::var("ATTNRT_BENCH_MODELS")
        .unwrap_or_else(|_| "gpt2_cache_eager.ts,llama_cache_eager.ts".into());
    let lens = env_list("ATTNRT_BENCH_LENS", &[128, 1024, 4096])?;
    let t = env_list("ATTNRT_BENCH_THREADS", &[2])?[0];
    let threads = Threads::new(Some(t))?;
    println!("{}", machine_note());
    println!("threads: {t}");
    let mut table = Table::new(&[
        "model",
        "past",
        "attnrt ms/token",
        "ORT ms/token",
        "ORT/attnrt (quartiles)",
        "ORT optimized ms/token",
        "ORT optimized/attnrt (quartiles)",
    ]);
    for name in names.split(',').filter(|n| !n.is_empty()) {
        let dec = Decoder::open(name, &threads)?;
        for &past in &lens {
            println!("{name} P{past} …");
            compare(&dec, past, t, &mut table)?;
        }
    }
    println!(
        "\nper-token latency (median step, ms), interleaved rounds\n{}",
        table.render()
    );
    println!("{}", machine_note());
    Ok(())
}
