//! `attnrt generate`: generation (greedy, or sampled with transformers' logits processors) with
//! a decoder exported with its key/value cache, or an encoder–decoder pair (`--encoder`: the
//! encoder runs once, then the decoder's loop, from `--decoder-start-ids`).
//!
//! Generation stops at the model's context (its position table's rows, or `--max-length`):
//! that is a result, not an error, so the tokens are printed (also in `--json`, with
//! `"stopped": "context"`), a note says why on stderr, and the exit code is 0. A step that fails
//! prints the tokens made before it (`"stopped": "error"`), then the error, and exits 1.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use attnrt::generate::{
    Generation, GenerationFailed, GenerationOptions, GenerationReport, Generator, KvCacheMode,
    SamplingOptions, StepReport, StopReason,
};
use attnrt::harness::{InputOptions, Tolerance};
use attnrt::{Fused, FusionReport, LoadedModel, NamedTensor, SessionOptions, Threads};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::common::{load, threads, LimitArgs, MatmulArgs, MemoryArgs};
use crate::stream::RowText;

/// Arguments of `attnrt generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The decoder (exported with past_key_values inputs and present outputs).
    pub model: PathBuf,
    /// The encoder of an encoder–decoder pair (optimum's `encoder_model.onnx`; MODEL is then
    /// the decoder taking `encoder_hidden_states`, e.g. `decoder_model_merged.onnx`): it runs
    /// once, on --encoder-inputs, before the decoder's first step.
    #[arg(long, value_name = "FILE")]
    pub encoder: Option<PathBuf>,
    /// With a decoder with past (optimum's `decoder_with_past_model.onnx`, MODEL), the decoder
    /// that makes the first step (`decoder_model.onnx`: it computes the cross-attention keys and
    /// values the decoder with past takes).
    #[arg(long, value_name = "FILE", requires = "encoder")]
    pub first_step: Option<PathBuf>,
    /// The encoder's inputs, by name, one row per prompt (default: seeded random inputs, one
    /// row); a single --prompt-ids serves every row.
    #[arg(long, value_name = "FILE.npz", requires = "encoder")]
    pub encoder_inputs: Option<PathBuf>,
    /// The prompt as token ids, e.g. `1,2,3`; given several times, one row of a batch each
    /// (padded on the left). For an encoder–decoder, the decoder's start ids.
    #[arg(long, visible_alias = "decoder-start-ids", value_name = "IDS", value_parser = parse_ids, conflicts_with_all = ["prompt_len", "prompt"])]
    pub prompt_ids: Vec<PromptIds>,
    /// A prompt of N seeded random token ids.
    #[arg(long, value_name = "N", conflicts_with = "prompt")]
    pub prompt_len: Option<usize>,
    /// The prompt as text (needs --tokenizer); given several times, one row of a batch each.
    #[arg(long, value_name = "TEXT", requires = "tokenizer")]
    pub prompt: Vec<String>,
    /// A Hugging Face `tokenizer.json`: encodes --prompt and decodes the generated tokens.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Seed of --prompt-len's random ids and of --do-sample's draws.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Tokens to generate after the prompt.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_new_tokens: usize,
    /// Stop after this token id.
    #[arg(long, value_name = "ID")]
    pub eos: Option<i64>,
    /// Stop a row when its text contains this string (repeatable; needs --tokenizer); the text
    /// ends before it.
    #[arg(long, value_name = "TEXT", requires = "tokenizer")]
    pub stop: Vec<String>,
    /// The most positions to use, prompt and generated tokens together (default: the model's
    /// context, the rows of its position table when it has one).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_length: Option<u64>,
    /// How the key/value cache is kept: `in-place` (held once, the fused attention appends to
    /// it; used where exact, else `copy` and the JSON report's `kv_cache.fallback` says why) or
    /// `copy` (each step's presents, past ++ new, become the next step's past).
    #[arg(long, value_name = "MODE", default_value = "in-place", value_parser = parse_kv_cache)]
    pub kv_cache: KvCacheMode,
    /// Run the original (unfused) graph in lockstep; exit 3 if a token differs or logits drift
    /// beyond --atol/--rtol. On a dynamically quantized decoder, a step that differs is judged
    /// again with the unfused step's int8 activation quantizations pinned (as `run` does).
    #[arg(long)]
    pub check: bool,
    /// Absolute tolerance of --check's logits comparison.
    #[arg(long, value_name = "A", default_value_t = Tolerance::default().atol)]
    pub atol: f64,
    /// Relative tolerance of --check's logits comparison.
    #[arg(long, value_name = "R", default_value_t = Tolerance::default().rtol)]
    pub rtol: f64,
    /// Do not fuse: generate with the original graph.
    #[arg(long, conflicts_with = "check")]
    pub no_fuse: bool,
    /// Threads for tract's matmuls and attnrt's kernel (default: all cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub matmul: MatmulArgs,
    #[command(flatten)]
    pub half: crate::common::HalfArgs,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Time every node of every step: each step's `nodes_ms` in --json, and the median time a
    /// step spends outside its nodes (two clock reads per node, some 0.04 ms a step on a 125M
    /// decoder).
    #[arg(long)]
    pub node_times: bool,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// One `--prompt-ids` value: comma-separated token ids.
#[derive(Clone, Debug)]
pub struct PromptIds(pub Vec<i64>);

fn parse_ids(s: &str) -> Result<PromptIds, String> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<i64>()
                .map_err(|_| format!("'{t}' is not a token id (give ids such as 1,2,3)"))
        })
        .collect::<Result<_, _>>()
        .map(PromptIds)
}

/// How the next token is chosen (transformers' definitions and order: repetition penalty,
/// temperature, top-k, top-p, min-p).
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sample the next token (default: greedy); the same --seed gives the same tokens.
    #[arg(long)]
    pub do_sample: bool,
    /// Divide the logits by T before sampling.
    #[arg(long, value_name = "T", default_value_t = 1.0)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all; 1 is greedy).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub top_k: usize,
    /// Sample among the most likely tokens whose probabilities reach P.
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub top_p: f32,
    /// Leave out tokens less likely than P times the most likely.
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of tokens already seen by R (greedy too).
    #[arg(long, value_name = "R", default_value_t = 1.0)]
    pub repetition_penalty: f32,
}

impl SamplingArgs {
    /// The generator's options, drawing from `seed`.
    pub fn options(&self, seed: u64) -> SamplingOptions {
        SamplingOptions {
            do_sample: self.do_sample,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed,
        }
    }
}

fn parse_kv_cache(s: &str) -> Result<KvCacheMode, String> {
    s.parse()
}

/// Runs the command; the exit code is 3 when --check finds a difference.
pub fn generate(args: GenerateArgs) -> Result<ExitCode> {
    args.sampling.options(args.seed).validate()?;
    let tol = Tolerance {
        atol: args.atol,
        rtol: args.rtol,
    };
    if !(tol.atol >= 0.0 && tol.rtol >= 0.0) {
        bail!("--atol and --rtol must be non-negative numbers");
    }
    let name = args.model.display().to_string();
    let tokenizer = args
        .tokenizer
        .as_ref()
        .map(|p| {
            tokenizers::Tokenizer::from_file(p)
                .map_err(|e| anyhow::anyhow!("{}: not a tokenizer.json: {e}", p.display()))
        })
        .transpose()?;
    let threads = threads(args.threads)?;
    let (generator, fusion) = open(&args, &name, &threads)?;
    let (generator, encoder) = open_encoder(&args, generator, &threads)?;
    // The weights are packed: the steps' activations come in base pages (memory.rs).
    crate::memory::small_pages_from_now();
    let blocks = fusion.as_ref().map_or(0, |f| f.blocks.len());
    let mut prompts = prompts(&args, tokenizer.as_ref(), generator.signature().vocab)?;
    let encoder_rows = encoder
        .inputs
        .first()
        .and_then(|t| t.tensor.shape().first());
    if let (1, Some(&rows)) = (prompts.len(), encoder_rows) {
        prompts = vec![prompts[0].clone(); rows];
    }
    let options = GenerationOptions {
        prompts,
        max_new_tokens: args.max_new_tokens,
        eos_token: args.eos,
        check: args.check.then_some(tol),
        max_length: args.max_length.map(|n| n as usize),
        sampling: args.sampling.options(args.seed),
        encoder_inputs: encoder.inputs,
        kv_cache: args.kv_cache,
    };
    // Text is printed as it is made for one prompt with a tokenizer (not with --json).
    let streaming = tokenizer.is_some() && !args.json && options.prompts.len() == 1;
    let mut texts = Texts::new(
        tokenizer.as_ref(),
        &args.stop,
        options.prompts.len(),
        streaming,
    );
    let bar = progress(args.max_new_tokens, streaming);
    let outcome = run_steps(&generator, &options, |g, s| {
        on_step(&bar, s);
        texts.update(g)
    });
    bar.finish_and_clear();
    texts.end();
    // A failed step still prints the tokens made before it, then the error.
    let report = match &outcome {
        Ok(report) => report,
        Err(e) => match e.downcast_ref::<GenerationFailed>() {
            Some(failed) => &failed.report,
            None => return outcome.map(|_| ExitCode::FAILURE),
        },
    };
    let shown = Shown {
        name: &name,
        blocks,
        fusion: fusion.as_ref(),
        encoder: encoder.fusion.as_ref().map(|f| (encoder.name.as_str(), f)),
        first_step: encoder
            .first_step
            .as_ref()
            .and_then(|(n, f)| f.as_ref().map(|f| (n.as_str(), f))),
        generator: &generator,
        threads: threads.count(),
    };
    shown.print(&args, report, texts.finals()?.as_deref(), streaming)?;
    let report = outcome?;
    match report.check_ok {
        Some(false) => {
            eprintln!("error: {}", first_disagreement(&report));
            Ok(ExitCode::from(crate::EXIT_DIFF))
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// The decoder loaded, fused unless `--no-fuse`, and a generator for it (with the unfused graph
/// in lockstep for `--check`); the fusion report.
fn open(
    args: &GenerateArgs,
    name: &str,
    threads: &Threads,
) -> Result<(Generator, Option<FusionReport>)> {
    let (loaded, fused) = load_and_fuse(args, &args.model, name)?;
    let model = fused.as_ref().map_or(&loaded.model, |f| &f.model);
    let reference = args.check.then_some(&loaded.model);
    let options = session_options(args);
    let generator = Generator::with_options(model, reference, threads, name, &options)?
        .with_node_times(args.node_times);
    Ok((generator, fused.map(|f| f.report)))
}

/// The model at `path` loaded, and fused unless `--no-fuse` (`name` names it in errors).
fn load_and_fuse(
    args: &GenerateArgs,
    path: &std::path::Path,
    name: &str,
) -> Result<(LoadedModel, Option<Fused>)> {
    let loaded = load(path, &args.limits.limits())?;
    let fused = if args.no_fuse {
        None
    } else {
        Some(attnrt::fuse(&loaded.model).with_context(|| format!("{name}: fusion failed"))?)
    };
    Ok((loaded, fused))
}

/// An encoder–decoder's encoder, as `open_encoder` made it.
#[derive(Default)]
struct OpenedEncoder {
    name: String,
    fusion: Option<FusionReport>,
    inputs: Vec<NamedTensor>,
    /// The first step's decoder (`--first-step`) and its fusion report.
    first_step: Option<(String, Option<FusionReport>)>,
}

/// With `--encoder`: the generator with the encoder loaded and fused (unless `--no-fuse`; the
/// original in lockstep for `--check`), its fusion report and its inputs (`--encoder-inputs`,
/// else seeded random ones).
fn open_encoder(
    args: &GenerateArgs,
    generator: Generator,
    threads: &Threads,
) -> Result<(Generator, OpenedEncoder)> {
    let Some(path) = &args.encoder else {
        return Ok((generator, OpenedEncoder::default()));
    };
    let options = session_options(args);
    let (generator, first_step) = match &args.first_step {
        Some(first) => {
            let name = first.display().to_string();
            let (loaded, fused) = load_and_fuse(args, first, &name)?;
            let model = fused.as_ref().map_or(&loaded.model, |f| &f.model);
            let reference = args.check.then_some(&loaded.model);
            let g = generator.with_first_step(model, reference, threads, &name, &options)?;
            (g, Some((name, fused.map(|f| f.report))))
        }
        None => (generator, None),
    };
    let name = path.display().to_string();
    let limits = args.limits.limits();
    let (loaded, fused) = load_and_fuse(args, path, &name)?;
    let model = fused.as_ref().map_or(&loaded.model, |f| &f.model);
    let reference = args.check.then_some(&loaded.model);
    let generator = generator.with_encoder(model, reference, threads, &name, &options)?;
    let input_options = InputOptions {
        npz: args.encoder_inputs.clone(),
        seed: args.seed,
        max_elements: limits.max_tensor_elements,
        budget: args.memory.budget(),
        ..InputOptions::default()
    };
    let inputs = attnrt::harness::prepare_inputs(&loaded.model, &input_options)
        .with_context(|| format!("preparing the inputs of encoder {name}"))?
        .tensors;
    let encoder = OpenedEncoder {
        name,
        fusion: fused.map(|f| f.report),
        inputs,
        first_step,
    };
    Ok((generator, encoder))
}

/// The session options of the flags (the encoder's and the decoder's).
fn session_options(args: &GenerateArgs) -> SessionOptions {
    SessionOptions {
        attnrt_ops: args.matmul.attnrt_ops(),
        half_as_float: args.half.on(),
        max_memory: args.memory.budget(),
        ..SessionOptions::default()
    }
}

/// What the report shows besides the generation itself.
struct Shown<'a> {
    name: &'a str,
    blocks: usize,
    fusion: Option<&'a FusionReport>,
    /// An encoder–decoder's encoder and its fusion report.
    encoder: Option<(&'a str, &'a FusionReport)>,
    /// The decoder that made the first step (`--first-step`) and its fusion report.
    first_step: Option<(&'a str, &'a FusionReport)>,
    generator: &'a Generator,
    threads: usize,
}

impl Shown<'_> {
    /// Prints the report (text or `--json`) on stdout, and on stderr why generation stopped
    /// early at the context.
    fn print(
        &self,
        args: &GenerateArgs,
        report: &GenerationReport,
        texts: Option<&[String]>,
        streamed: bool,
    ) -> Result<()> {
        let text = texts.map(|t| t[0].clone());
        let tol = args.check.then_some(Tolerance {
            atol: args.atol,
            rtol: args.rtol,
        });
        if args.json {
            let v = json!({
                "model": self.name,
                "threads": self.threads,
                "fused_blocks": self.blocks,
                "fusion": self.fusion,
                "encoder": self.encoder.map(|(model, fusion)| json!({
                    "model": model,
                    "fused_blocks": fusion.blocks.len(),
                    "fusion": fusion,
                })),
                "first_step": self.first_step.map(|(model, fusion)| json!({
                    "model": model,
                    "fused_blocks": fusion.blocks.len(),
                    "fusion": fusion,
                })),
                "signature": self.generator.signature(),
                "report": report,
                "text": text,
                "rows": report.rows.iter().enumerate().map(|(i, r)| json!({
                    "prompt": r.prompt,
                    "tokens": r.tokens,
                    "text": texts.map(|t| &t[i]),
                    "stopped": r.stopped,
                })).collect::<Vec<_>>(),
                "tolerance": tol,
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            let shown_texts = if streamed { None } else { texts };
            print_text(self.name, self.blocks, report, shown_texts, tol);
            if let (Some((model, fusion)), Some(ms)) = (self.encoder, report.encoder_ms) {
                println!(
                    "encoder: {model}: {} attention block(s) fused; ran once in {ms:.2} ms",
                    fusion.blocks.len()
                );
            }
            if let Some((model, fusion)) = self.first_step {
                let n = fusion.blocks.len();
                println!("first step: {model}: {n} attention block(s) fused");
            }
        }
        if let (StopReason::Context, Some(c)) = (report.stopped, &report.context) {
            let given = if c.table.is_none() {
                " (--max-length)"
            } else {
                ""
            };
            eprintln!(
                "note: stopped at {c}{given}: {} prompt and {} generated token(s)",
                report.prompt.len(),
                report.tokens.len()
            );
        }
        Ok(())
    }
}

/// The batch's prompts: `--prompt-ids` or `--prompt` (one row per occurrence), else one
/// seeded random prompt of `--prompt-len` tokens.
fn prompts(
    args: &GenerateArgs,
    tokenizer: Option<&tokenizers::Tokenizer>,
    vocab: Option<usize>,
) -> Result<Vec<Vec<i64>>> {
    if !args.prompt_ids.is_empty() {
        return Ok(args.prompt_ids.iter().map(|p| p.0.clone()).collect());
    }
    if !args.prompt.is_empty() {
        let t = tokenizer.context("--prompt needs --tokenizer")?;
        return args
            .prompt
            .iter()
            .map(|text| {
                let enc = t
                    .encode(text.as_str(), false)
                    .map_err(|e| anyhow::anyhow!("encoding --prompt: {e}"))?;
                Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
            })
            .collect();
    }
    let len = args.prompt_len.unwrap_or(8);
    let vocab = vocab.context(
        "the logits do not declare the vocabulary size: give --prompt-ids instead of a random prompt",
    )?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    Ok(vec![(0..len)
        .map(|_| rng.gen_range(0..vocab as i64))
        .collect()])
}

fn decode(t: &tokenizers::Tokenizer, tokens: &[i64]) -> Result<String> {
    let ids: Vec<u32> = tokens
        .iter()
        .map(|&t| u32::try_from(t).context("a token id does not fit the tokenizer"))
        .collect::<Result<_>>()?;
    t.decode(&ids, true)
        .map_err(|e| anyhow::anyhow!("decoding the generated tokens: {e}"))
}

/// Runs `options`' generation step by step; `after` sees the generation after each step (and
/// may finish rows in it). A failing step gives a [`GenerationFailed`] with the tokens made.
fn run_steps(
    generator: &Generator,
    options: &GenerationOptions,
    mut after: impl FnMut(&mut Generation, &StepReport) -> Result<()>,
) -> Result<GenerationReport> {
    let mut g = generator.start(options)?;
    loop {
        let step = match generator.next_step(&mut g) {
            Ok(Some(step)) => step.clone(),
            Ok(None) => return Ok(generator.report(&g)),
            Err(error) => {
                let report = generator.report(&g);
                return Err(GenerationFailed { report, error }.into());
            }
        };
        after(&mut g, &step)?;
    }
}

/// The rows' texts as they grow (with a tokenizer): streamed to stdout for one row, cut at the
/// stop strings, which finish their row.
struct Texts<'t> {
    tokenizer: Option<&'t tokenizers::Tokenizer>,
    rows: Vec<RowText>,
    /// Each row's whole decoded text so far.
    decoded: Vec<String>,
    /// Rows decoded for the last time.
    done: Vec<bool>,
    streaming: bool,
}

impl<'t> Texts<'t> {
    fn new(
        tokenizer: Option<&'t tokenizers::Tokenizer>,
        stops: &[String],
        rows: usize,
        streaming: bool,
    ) -> Texts<'t> {
        if streaming {
            print!("text: ");
        }
        Texts {
            tokenizer,
            rows: (0..rows).map(|_| RowText::new(stops)).collect(),
            decoded: vec![String::new(); rows],
            done: vec![false; rows],
            streaming,
        }
    }

    /// Decodes the rows still generating, prints what is new (streaming) and finishes the rows
    /// whose text reached a stop string.
    fn update(&mut self, g: &mut Generation) -> Result<()> {
        let Some(t) = self.tokenizer else {
            return Ok(());
        };
        for r in 0..g.batch() {
            if self.done[r] {
                continue;
            }
            // a row that finished this step is decoded once more, with its last token
            self.done[r] = g.is_row_finished(r);
            self.decoded[r] = decode(t, g.tokens(r))?;
            let (new, stopped) = self.rows[r].feed(&self.decoded[r]);
            if self.streaming {
                print!("{new}");
                std::io::Write::flush(&mut std::io::stdout())?;
            }
            if stopped {
                g.finish_row(r, StopReason::Stop);
                self.done[r] = true;
            }
        }
        Ok(())
    }

    /// Prints the rest of a streamed row and ends its line.
    fn end(&mut self) {
        if self.streaming {
            println!("{}", self.rows[0].rest(&self.decoded[0]));
        }
    }

    /// Each row's final text (cut before its stop string), with a tokenizer.
    fn finals(&self) -> Result<Option<Vec<String>>> {
        if self.tokenizer.is_none() {
            return Ok(None);
        }
        Ok(Some(
            self.rows
                .iter()
                .zip(&self.decoded)
                .map(|(r, d)| r.text(d).to_string())
                .collect(),
        ))
    }
}

fn progress(total: usize, hidden: bool) -> ProgressBar {
    let target = if hidden {
        indicatif::ProgressDrawTarget::hidden()
    } else {
        indicatif::ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(total as u64), target);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} tokens {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix("generate");
    bar
}

fn on_step(bar: &ProgressBar, s: &StepReport) {
    bar.inc(1);
    bar.set_message(format!("last step {:.1} ms", s.ms));
}

fn first_disagreement(r: &GenerationReport) -> String {
    r.steps
        .iter()
        .find_map(|s| {
            let c = s.check.as_ref().filter(|c| !c.ok)?;
            if let Some(p) = &c.pinned {
                return Some(format!(
                    "step {}: with the unfused graph's int8 quantization pinned, logits differ by \
                     {:.3e}, tokens {:?} vs {:?}, {} projection(s) diverged",
                    s.step,
                    p.logits.max_abs,
                    p.tokens,
                    c.reference_tokens,
                    p.pins.diverged.len()
                ));
            }
            Some(if c.reference_token != s.token {
                format!(
                    "step {}: token {} but the unfused graph gives {}",
                    s.step, s.token, c.reference_token
                )
            } else {
                format!(
                    "step {}: logits differ from the unfused graph by {:.3e} (beyond tolerance)",
                    s.step, c.logits.max_abs
                )
            })
        })
        .unwrap_or_else(|| "the check failed".into())
}

fn print_text(
    name: &str,
    blocks: usize,
    r: &GenerationReport,
    texts: Option<&[String]>,
    tol: Option<Tolerance>,
) {
    let ids = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    println!("model: {name}");
    println!("fusion: {blocks} attention block(s) fused");
    for (i, row) in r.rows.iter().enumerate() {
        // a batch numbers its rows; one prompt prints as it always has
        let at = if r.rows.len() > 1 {
            format!(" [row {i}]")
        } else {
            String::new()
        };
        println!(
            "prompt{at}: {} token(s): {}",
            row.prompt.len(),
            ids(&row.prompt)
        );
        println!(
            "generated{at}: {} token(s): {}",
            row.tokens.len(),
            ids(&row.tokens)
        );
        if let Some(t) = texts {
            println!("text{at}: {}", t[i]);
        }
    }
    let planning = r.steps.first().map_or(0.0, |s| s.planning_ms);
    println!(
        "time to first token: {:.2} ms (plans made meanwhile: {planning:.2} ms; the prompt's and the decode steps' plans are made at load, for every batch where tract can plan that)",
        r.time_to_first_token_ms
    );
    if let (Some(tps), Some(ms)) = (r.decode_tokens_per_s, r.median_step_ms) {
        let outside = r.median_step_outside_ms.map_or(String::new(), |o| {
            format!(", {o:.3} ms of it outside the nodes")
        });
        println!("decode: {tps:.1} tokens/s, median {ms:.3} ms per step{outside} (steps that made a plan excluded)");
    }
    println!(
        "plans: {} built in {:.1} ms (one for the prompt and one for the decode steps, at load; per batch size where tract cannot keep the batch symbolic)",
        r.plans.built, r.plans.build_ms
    );
    if let (Some(ok), Some(tol)) = (r.check_ok, tol) {
        let worst = r
            .steps
            .iter()
            .filter_map(|s| s.check.as_ref().map(|c| c.logits.max_abs))
            .fold(0.0, f64::max);
        println!(
            "check vs unfused: {} (worst logits max_abs {worst:.3e}; |a-b| <= {} + {}*|b|)",
            if ok {
                "same tokens, logits within tolerance"
            } else {
                "DIFFERS"
            },
            tol.atol,
            tol.rtol
        );
    }
}
