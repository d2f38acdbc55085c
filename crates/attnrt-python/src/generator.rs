//! The classes behind `attnrt.Model` and `attnrt.Generator` (shaped after onnxruntime-genai's
//! `Model`, `GeneratorParams` and `Generator`): a decoder with a KV cache opened once (fused
//! unless told not to), and generations on it driven one step at a time from Python, the GIL
//! released while a step runs.

use std::sync::Arc;

use attnrt::generate::{GenerationOptions, Generator, SamplingOptions};
use attnrt::{SessionOptions, Threads};
use pyo3::prelude::*;

use crate::{load_model, py_err, AttnrtError};

/// A decoder ready to generate (see the module docs).
#[pyclass(module = "attnrt._attnrt", frozen)]
pub struct DecoderModel {
    generator: Arc<Generator>,
    report: Option<String>,
}

#[pymethods]
impl DecoderModel {
    /// `model`: a path or the bytes of an ONNX decoder exported with its cache; `fuse`: fuse
    /// attention first; `threads`: threads for the matmuls and the attention kernel (default:
    /// all cores); `max_memory`: the memory budget of a step (default: 75% of the memory
    /// available).
    #[new]
    #[pyo3(signature = (model, fuse = true, threads = None, max_memory = None))]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        fuse: bool,
        threads: Option<usize>,
        max_memory: Option<String>,
    ) -> PyResult<DecoderModel> {
        let budget = crate::memory_budget(max_memory)?;
        let (proto, what) = load_model(model)?;
        py.detach(|| -> anyhow::Result<DecoderModel> {
            let threads = Threads::new(threads)?;
            let (proto, report) = crate::fused_if(proto, &what, fuse)?;
            let options = SessionOptions {
                max_memory: budget,
                ..SessionOptions::default()
            };
            let generator = Generator::with_options(&proto, None, &threads, &what, &options)?;
            Ok(DecoderModel {
                generator: Arc::new(generator),
                report,
            })
        })
        .map_err(py_err)
    }

    /// The fusion report as JSON (`None` when built with `fuse=False`).
    fn fusion_report(&self) -> Option<String> {
        self.report.clone()
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
    /// `max_new_tokens` and `eos_token_id`.
    #[new]
    #[pyo3(signature = (model, *, max_length = None, max_new_tokens = None, do_sample = false,
        temperature = 1.0, top_k = 0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0,
        random_seed = 0, eos_token_id = None))]
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
    ) -> PyResult<Generation> {
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
            },
            state: None,
        })
    }

    /// Starts the generation on `prompts` (one list of token ids per row of the batch).
    fn append_tokens(&mut self, prompts: Vec<Vec<i64>>) -> PyResult<()> {
        if self.state.is_some() {
            return Err(AttnrtError::new_err(
                "append_tokens: this generator has its prompts already (make a new Generator)",
            ));
        }
        let options = GenerationOptions {
            prompts,
            ..self.options.clone()
        };
        self.state = Some(self.generator.start(&options).map_err(py_err)?);
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
