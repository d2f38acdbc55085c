//! The encoder of an encoder–decoder pair (optimum's Whisper: `encoder_model.onnx` beside the
//! merged decoder). It runs once per generation, before the first decoder step; its output is
//! the decoder's `encoder_hidden_states` on every step. The first step also gives the
//! cross-attention keys and values of those states (the cross cache, [`CrossInputs`]), fed back
//! unchanged on every later step while the self-attention cache grows.

use anyhow::{bail, Context, Result};
use attnrt_onnx::ModelProto;
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};

use super::signature::{datum, CacheSlot, DecoderSignature};

/// An encoder and the decoder input its output feeds.
pub struct Encoder {
    session: Session,
    reference: Option<Session>,
    /// The encoder output that feeds the decoder.
    output: String,
    /// The decoder input it feeds (`encoder_hidden_states`).
    feeds: String,
    what: String,
}

/// What the encoder gave: its states for the generator's session, and for the reference's.
pub struct Encoded {
    /// The states the fused encoder gave, named as the decoder's input.
    pub states: NamedTensor,
    /// The states the reference encoder gave, with a check.
    pub reference: Option<NamedTensor>,
    /// The decoder's encoder attention mask, when it takes one: the encoder's `attention_mask`
    /// input, else ones.
    pub mask: Option<NamedTensor>,
    /// Wall time of the encoder run(s), in milliseconds (the reference's included).
    pub ms: f64,
}

impl Encoder {
    /// Opens a session for `model` (and `reference`, for checks) and finds the output that
    /// feeds `decoder`'s encoder states: the output of the same name, else the only output, else
    /// `last_hidden_state`. `what` names the encoder in errors, `decoder` the decoder.
    pub fn new(
        model: &ModelProto,
        reference: Option<&ModelProto>,
        threads: &Threads,
        what: &str,
        options: &SessionOptions,
        decoder: (&DecoderSignature, &str),
    ) -> Result<Encoder> {
        let (signature, decoder_name) = decoder;
        let Some((feeds, _)) = &signature.encoder_states else {
            let fix = if signature.cross_cache.is_empty() {
                "give a decoder-only model without an encoder"
            } else {
                "give the decoder that makes its first step first (`--first-step`)"
            };
            bail!(
                "{decoder_name}: takes no encoder states (no 'encoder_hidden_states' input), so \
                 encoder {what} has nothing to feed: {fix}"
            );
        };
        let (session, reference) = super::sessions(model, reference, threads, what, options)?;
        let names = session.output_names();
        let output = [feeds.as_str(), "last_hidden_state"]
            .iter()
            .find(|n| names.iter().any(|o| o == *n))
            .map(|n| n.to_string())
            .or_else(|| (names.len() == 1).then(|| names[0].clone()))
            .with_context(|| {
                format!(
                    "encoder {what}: none of its outputs ({}) feeds {decoder_name}'s input \
                     '{feeds}' (expected an output of that name, 'last_hidden_state', or one \
                     output only)",
                    names.join(", ")
                )
            })?;
        Ok(Encoder {
            session,
            reference,
            output,
            feeds: feeds.clone(),
            what: what.to_string(),
        })
    }

    /// Runs the encoder (and the reference encoder) on `inputs`, once, and checks its states
    /// fit the decoder: `[rows, sequence, hidden]` with `rows` the batch of prompts.
    pub fn encode(
        &self,
        inputs: &[NamedTensor],
        rows: usize,
        signature: &DecoderSignature,
    ) -> Result<Encoded> {
        if inputs.is_empty() {
            bail!(
                "encoder {}: no inputs given (the encoder runs once, on its inputs, before the \
                 decoder)",
                self.what
            );
        }
        let started = std::time::Instant::now();
        let states = self.states(&self.session, inputs, rows, signature)?;
        let reference = self
            .reference
            .as_ref()
            .map(|r| self.states(r, inputs, rows, signature))
            .transpose()?;
        let mask = mask(inputs, &states.tensor, signature)?;
        Ok(Encoded {
            states,
            reference,
            mask,
            ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    fn states(
        &self,
        session: &Session,
        inputs: &[NamedTensor],
        rows: usize,
        signature: &DecoderSignature,
    ) -> Result<NamedTensor> {
        let what = &self.what;
        let outputs = session
            .run(inputs)
            .with_context(|| format!("running encoder {what}"))?;
        let tensor = outputs
            .into_iter()
            .find(|o| o.name == self.output)
            .with_context(|| format!("encoder {what} gave no output '{}'", self.output))?
            .tensor;
        let hidden = signature.encoder_states.as_ref().and_then(|(_, h)| *h);
        let shape = tensor.shape();
        if shape.len() != 3 || shape[0] != rows || hidden.is_some_and(|h| shape[2] != h) {
            let hidden = hidden.map_or("hidden".to_string(), |h| h.to_string());
            bail!(
                "encoder {what}: output '{}' is {shape:?}, but the decoder's '{}' takes [{rows}, \
                 encoder sequence, {hidden}] ({rows} row(s) of decoder start ids)",
                self.output,
                self.feeds
            );
        }
        Ok(NamedTensor {
            name: self.feeds.clone(),
            tensor,
        })
    }
}

/// The decoder's `encoder_attention_mask` (when it takes one) for the encoder's `states`: the
/// encoder's own `attention_mask` input, which must be `[rows, encoder sequence]`, else ones.
fn mask(
    inputs: &[NamedTensor],
    states: &Tensor,
    signature: &DecoderSignature,
) -> Result<Option<NamedTensor>> {
    let Some((name, elem_type)) = &signature.encoder_mask else {
        return Ok(None);
    };
    let (rows, sequence) = (states.shape()[0], states.shape()[1]);
    let tensor = match inputs.iter().find(|t| t.name == "attention_mask") {
        Some(given) if given.tensor.shape() == [rows, sequence] => given.tensor.clone(),
        Some(given) => bail!(
            "the encoder's input 'attention_mask' is {:?}, but its states are {:?}: the decoder's \
             '{name}' must be [rows, encoder sequence]",
            given.tensor.shape(),
            states.shape()
        ),
        None => Tensor::from_shape(&[rows, sequence], &vec![1i64; rows * sequence])?,
    };
    Ok(Some(NamedTensor {
        name: name.clone(),
        tensor: tensor.cast_to_dt(datum(*elem_type)?)?.into_owned(),
    }))
}

/// The inputs of an encoder–decoder's decoder besides the tokens and the self-attention cache:
/// the encoder's states, fed every step, and the cross cache, placeholders (zeros, read by no
/// branch) until the first step gives it.
#[derive(Clone)]
pub struct CrossInputs {
    states: NamedTensor,
    mask: Option<NamedTensor>,
    cache: Vec<NamedTensor>,
    filled: bool,
}

impl CrossInputs {
    /// The inputs before the first step: `states`, the encoder `mask` when the decoder takes
    /// one, and a zero placeholder `[rows, heads, encoder sequence, head_size]` for every cross
    /// slot.
    pub fn new(
        states: NamedTensor,
        mask: Option<NamedTensor>,
        slots: &[CacheSlot],
    ) -> Result<CrossInputs> {
        let (rows, sequence) = (states.tensor.shape()[0], states.tensor.shape()[1]);
        let cache = slots
            .iter()
            .map(|c| -> Result<NamedTensor> {
                let shape = [rows, c.heads, sequence, c.head_size];
                Ok(NamedTensor {
                    name: c.past.clone(),
                    tensor: Tensor::zero_dt(datum(c.elem_type)?, &shape)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(CrossInputs {
            states,
            mask,
            cache,
            filled: false,
        })
    }

    /// A step's copies of the states, the mask and the cross cache (tract takes its inputs by
    /// value).
    pub fn feeds(&self) -> Vec<NamedTensor> {
        std::iter::once(&self.states)
            .chain(&self.mask)
            .chain(&self.cache)
            .cloned()
            .collect()
    }

    /// Takes the cross presents out of a step's `outputs`: the first step's become the cache
    /// (checked against the placeholders' shapes); a later step's (a merged decoder's with-past
    /// branch gives empty placeholders) are dropped.
    pub fn take_presents(
        &mut self,
        slots: &[CacheSlot],
        outputs: &mut Vec<NamedTensor>,
    ) -> Result<()> {
        for (slot, cached) in slots.iter().zip(&mut self.cache) {
            let at = outputs.iter().position(|o| o.name == slot.present);
            let present = at.map(|at| outputs.swap_remove(at).tensor);
            if self.filled {
                continue;
            }
            let present =
                present.with_context(|| format!("the model gave no output '{}'", slot.present))?;
            if present.shape() != cached.tensor.shape() {
                bail!(
                    "output '{}' is {:?}, expected {:?} (the cross-attention keys or values of \
                     the encoder's states)",
                    slot.present,
                    present.shape(),
                    cached.tensor.shape()
                );
            }
            cached.tensor = present;
        }
        self.filled = true;
        Ok(())
    }
}
