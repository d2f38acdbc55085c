//! The classes behind `attnrt.Model` and `attnrt.Generator` (shaped after onnxruntime-genai's
//! `Model`, `GeneratorParams` and `Generator`): a decoder with a KV cache opened once (fused
//! unless told not to), with its encoder for an encoder–decoder pair, and generations on it
//! driven one step at a time from Python, the GIL released while a step (or the encoder) runs.

use std::sync::Arc;

use anyhow::bail;
use attnrt::generate::{DecoderSignature, GenerationOptions, Generator, SamplingOptions};
use attnrt::{ModelProto, SessionOptions, Threads};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::to_named_tensors;
use crate::{load_model, py_err, AttnrtError};

/// A decoder ready to generate (see the module docs), with its encoder (and the decoder that
/// makes its first step) for an encoder–decoder pair.
#[pyclass(module = "attnrt._attnrt", frozen)]
pub struct DecoderModel {
    generator: Arc<Generator>,
    /// The fusion reports as JSON by part (`decoder`, `first_step`, `encoder`); `None` when
    /// built with `fuse=False`.
    reports: Vec<(&'static str, Option<String>)>,
}

/// The models of a [`DecoderModel`], loaded, each with its name for errors.
struct Parts {
    decoder: (ModelProto, String),
    first_step: Option<(ModelProto, String)>,
    encoder: Option<(ModelProto, String)>,
}

#[pymethods]
impl DecoderModel {
    /// `model`: a path or the bytes of an ONNX decoder exported with its cache; `fuse`: fuse
    /// attention first; `threads`: threads for the matmuls and the attention kernel (default:
    /// all cores); `max_memory`: the memory budget of a step (default: 75% of the memory
    /// available). An encoder–decoder's `encoder` (path or bytes) runs once per generation on
    /// its inputs; `first_step` is the decoder that makes the first step when `model` is a
    /// decoder with past only (optimum's `decoder_model.onnx` beside
    /// `decoder_with_past_model.onnx`).
    #[new]
    #[pyo3(signature = (model, fuse = true, threads = None, max_memory = None, encoder = None,
        first_step = None))]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        fuse: bool,
        threads: Option<usize>,
        max_memory: Option<String>,
        encoder: Option<&Bound<'_, PyAny>>,
        first_step: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<DecoderModel> {
        let budget = crate::memory_budget(max_memory)?;
        if first_step.is_some() && encoder.is_none() {
            return Err(AttnrtError::new_err(
                "first_step= is the first step of an encoder–decoder's decoder: give its \
                 encoder (encoder=) too",
            ));
        }
        let parts = Parts {
            decoder: load_model(model)?,
            first_step: first_step.map(load_model).transpose()?,
            encoder: encoder.map(load_model).transpose()?,
        };
        let options = SessionOptions {
            max_memory: budget,
            ..SessionOptions::default()
        };
        py.detach(|| open(parts, fuse, threads, &options))
            .map_err(py_err)
    }

    /// The fusion report of `part` (`decoder`, `first_step` or `encoder`) as JSON (`None` when
    /// built with `fuse=False`, or when the model has no such part).
    #[pyo3(signature = (part = "decoder"))]
    fn fusion_report(&self, part: &str) -> PyResult<Option<String>> {
        if !["decoder", "first_step", "encoder"].contains(&part) {
            return Err(AttnrtError::new_err(format!(
                "no model part '{part}' (the parts are decoder, first_step and encoder)"
            )));
        }
        let report = self.reports.iter().find(|(p, _)| *p == part);
        Ok(report.and_then(|(_, r)| r.clone()))
    }

    /// The positions the model has (its position table's rows), when its graph shows them.
    fn context_length(&self) -> Option<usize> {
        self.generator.context().map(|c| c.positions)
    }

    /// The vocabulary size, when the logits declare it.
    fn vocab_size(&self) -> Option<usize> {
        self.generator.signature().vocab
    }
}

/// Opens the generator of `parts` (each fused first when `fuse`), its first step and its
/// encoder added when given.
fn open(
    parts: Parts,
    fuse: bool,
    threads: Option<usize>,
    options: &SessionOptions,
) -> anyhow::Result<DecoderModel> {
    let threads = Threads::new(threads)?;
    let (decoder, what) = parts.decoder;
    let (decoder, report) = crate::fused_if(decoder, &what, fuse)?;
    let mut generator = Generator::with_options(&decoder, None, &threads, &what, options)?;
    let mut reports = vec![("decoder", report)];
    if let Some((model, name)) = parts.first_step {
        let (model, report) = crate::fused_if(model, &name, fuse)?;
        generator = generator.with_first_step(&model, None, &threads, &name, options)?;
        reports.push(("first_step", report));
    }
    check_pairing(generator.signature(), &what, parts.encoder.as_ref())?;
    if let Some((model, name)) = parts.encoder {
        let (model, report) = crate::fused_if(model, &name, fuse)?;
        generator = generator.with_encoder(&model, None, &threads, &name, options)?;
        reports.push(("encoder", report));
    }
    Ok(DecoderModel {
        generator: Arc::new(generator),
        reports,
    })
}

/// Refuses a decoder (`what`, with `signature`) given an `encoder` it cannot take, or given
/// none when it needs one, in the Python API's terms (`encoder=`, `first_step=`).
fn check_pairing(
    signature: &DecoderSignature,
    what: &str,
    encoder: Option<&(ModelProto, String)>,
) -> anyhow::Result<()> {
    match (
        &signature.encoder_states,
        signature.cross_cache.first(),
        encoder,
    ) {
        (Some((states, _)), _, None) => bail!(
            "{what}: takes the encoder's states ('{states}'): give its encoder \
             (attnrt.Model(decoder, encoder=...))"
        ),
        (None, Some(slot), encoder) => {
            let give = match encoder {
                Some((_, e)) => format!("encoder {e} cannot feed it: give the decoder that makes"),
                None => "give the encoder (encoder=) and the decoder that makes".to_string(),
            };
            bail!(
                "{what}: takes the cross-attention keys and values ('{}', ...) but not the \
                 encoder's states, so no step of it can compute them; {give} the first step \
                 (first_step=, optimum's decoder_model.onnx), or use the merged decoder \
                 (decoder_model_merged.onnx)",
                slot.past
            )
        }
        (None, None, Some((_, e))) => bail!(
            "{what}: takes no encoder states (no 'encoder_hidden_states' input), so encoder {e} \
             has nothing to feed: give a decoder-only model without encoder="
        ),
        _ => Ok(()),
    }
}

/// One generation on a [`DecoderModel`], before and between its steps.
#[pyclass(module = "attnrt._attnrt")]
pub struct Generation {
    generator: Arc<Generator>,
    options: GenerationOptions,
    state: Option<attnrt::generate::Generation>,
}

#[pymethods]
impl Generation {
    /// The search options of onnxruntime-genai's `set_search_options` that attnrt has
    /// (`max_length`: prompt and generated tokens together; `random_seed`), and
    /// `max_new_tokens` and `eos_token_id`; `kv_cache`: `"in-place"` (held once, appended to in
    /// place where that is exact) or `"copy"` (each step's presents become the next past).
    #[new]
    #[pyo3(signature = (model, *, max_length = None, max_new_tokens = None, do_sample = false,
        temperature = 1.0, top_k = 0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0,
        random_seed = 0, eos_token_id = None, kv_cache = "in-place"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        model: &DecoderModel,
        max_length: Option<usize>,
        max_new_tokens: Option<usize>,
        do_sample: bool,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        random_seed: u64,
        eos_token_id: Option<i64>,
        kv_cache: &str,
    ) -> PyResult<Generation> {
        let kv_cache = kv_cache.parse().map_err(AttnrtError::new_err)?;
        let sampling = SamplingOptions {
            do_sample,
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            seed: random_seed,
        };
        sampling.validate().map_err(py_err)?;
        if max_length == Some(0) {
            return Err(AttnrtError::new_err("max_length must be at least 1"));
        }
        if max_length.is_none() && max_new_tokens.is_none() && model.context_length().is_none() {
            return Err(AttnrtError::new_err(
                "give max_length or max_new_tokens: the model shows no context length",
            ));
        }
        Ok(Generation {
            generator: Arc::clone(&model.generator),
            options: GenerationOptions {
                prompts: Vec::new(),
                // without max_new_tokens, generation runs to max_length or the model's context
                max_new_tokens: max_new_tokens.unwrap_or(usize::MAX),
                eos_token: eos_token_id,
                check: None,
                max_length,
                sampling,
                encoder_inputs: Vec::new(),
                kv_cache,
            },
            state: None,
        })
    }

    /// An encoder–decoder's encoder inputs (input name → numpy array, one row per prompt),
    /// before `append_tokens`: the encoder runs once on them when the generation starts.
    fn set_encoder_inputs(&mut self, inputs: &Bound<'_, PyDict>) -> PyResult<()> {
        if self.state.is_some() {
            return Err(AttnrtError::new_err(
                "set_encoder_inputs: the generation has started (give them before append_tokens)",
            ));
        }
        self.options.encoder_inputs = to_named_tensors(inputs)?;
        Ok(())
    }

    /// Starts the generation on `prompts` (one list of token ids per row of the batch; an
    /// encoder–decoder's decoder start ids), running an encoder–decoder's encoder on its inputs,
    /// the GIL released.
    fn append_tokens(&mut self, py: Python<'_>, prompts: Vec<Vec<i64>>) -> PyResult<()> {
        if self.state.is_some() {
            return Err(AttnrtError::new_err(
                "append_tokens: this generator has its prompts already (make a new Generator)",
            ));
        }
        let options = GenerationOptions {
            prompts,
            ..self.options.clone()
        };
        let generator = Arc::clone(&self.generator);
        let state = py
            .detach(move || generator.start(&options))
            .map_err(py_err)?;
        self.state = Some(state);
        Ok(())
    }

    /// Whether the generation has ended (false before `append_tokens`).
    fn is_done(&self) -> bool {
        self.state.as_ref().is_some_and(|g| g.is_done())
    }

    /// Runs the next step (the prompt first), the GIL released; `True` when it made tokens,
    /// `False` when the generation had ended (or ends here at the context).
    fn generate_next_token(&mut self, py: Python<'_>) -> PyResult<bool> {
        let generator = Arc::clone(&self.generator);
        let g = self
            .state
            .as_mut()
            .ok_or_else(|| AttnrtError::new_err("generate_next_token: call append_tokens first"))?;
        py.detach(|| generator.next_step(g).map(|s| s.is_some()))
            .map_err(py_err)
    }

    /// The tokens of the last step, one per row (`None` for a row that had finished).
    fn get_next_tokens(&self) -> Vec<Option<i64>> {
        self.state
            .as_ref()
            .and_then(|g| g.steps().last())
            .map_or_else(Vec::new, |s| s.tokens.clone())
    }

    /// Row `row`'s prompt and generated tokens.
    fn get_sequence(&self, row: usize) -> PyResult<Vec<i64>> {
        let g = self
            .state
            .as_ref()
            .ok_or_else(|| AttnrtError::new_err("get_sequence: call append_tokens first"))?;
        let prompt = g.options().prompts.get(row).ok_or_else(|| {
            AttnrtError::new_err(format!("row {row} is not in the batch of {}", g.batch()))
        })?;
        Ok([prompt.as_slice(), g.tokens(row)].concat())
    }

    /// The report so far as JSON (what `attnrt generate --json` prints under `report`).
    fn report(&self) -> PyResult<Option<String>> {
        self.state
            .as_ref()
            .map(|g| serde_json::to_string(&self.generator.report(g)))
            .transpose()
            .map_err(|e| py_err(e.into()))
    }
}
