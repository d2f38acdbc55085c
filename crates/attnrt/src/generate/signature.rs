//! What a decoder exported with its key/value cache takes and gives, read off its declared
//! inputs and outputs: the token ids, the optional attention mask and position ids, one past
//! input per cached tensor paired with the present output that continues it, and the logits.
//! The decoder of an encoder–decoder (optimum's Whisper, BART, T5) also takes the encoder's
//! states (`encoder_hidden_states`) and, as a cache of its own, the cross-attention keys and
//! values (`past_key_values.N.encoder.key`): computed from the states by the first step, then
//! fed back unchanged.

use anyhow::{bail, Context, Result};
use attnrt_onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use attnrt_onnx::{DataType, GraphProto, ModelProto, ValueInfoProto};
use attnrt_runtime::{DatumType, ShapePolicy};
use serde::Serialize;

/// One cached tensor: the past input and the present output that is fed back as it next step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheSlot {
    /// The graph input (e.g. `past_key_values.0.key`), `[batch, heads, past, head_size]`.
    pub past: String,
    /// The graph output (e.g. `present.0.key`), `[batch, heads, past + new, head_size]`.
    pub present: String,
    /// Key/value heads.
    pub heads: usize,
    /// Head size.
    pub head_size: usize,
    /// Element type (`DataType` number).
    pub elem_type: i32,
}

/// A decoder's inputs and outputs, as generation uses them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecoderSignature {
    /// The token ids input, `[batch, sequence]`.
    pub input_ids: String,
    /// Its element type.
    pub ids_type: i32,
    /// The attention mask input, `[batch, past + sequence]`, when the model takes one.
    pub attention_mask: Option<(String, i32)>,
    /// The position ids input, `[batch, sequence]`, when the model takes one.
    pub position_ids: Option<(String, i32)>,
    /// The self-attention cache, in input order: it grows by the tokens of every step.
    pub cache: Vec<CacheSlot>,
    /// The cross-attention cache of an encoder–decoder, in input order: the first step's
    /// presents (the keys and values of the encoder's states), fed back unchanged on every later
    /// step. Its past axis is the encoder's sequence.
    pub cross_cache: Vec<CacheSlot>,
    /// The input that takes the encoder's states, `[batch, encoder_sequence, hidden]`, with the
    /// hidden size when declared (an encoder–decoder's decoder).
    pub encoder_states: Option<(String, Option<usize>)>,
    /// The input that takes the encoder's attention mask, `[batch, encoder_sequence]` (BART's
    /// and T5's `encoder_attention_mask`), with its element type.
    pub encoder_mask: Option<(String, i32)>,
    /// The logits output, `[batch, sequence, vocab]`.
    pub logits: String,
    /// The vocabulary size, when the logits declare it.
    pub vocab: Option<usize>,
    /// The `dim_param` of the past length (axis 2 of every past input).
    pub past_dim: String,
    /// The `dim_param` of the attention mask's length, when it is its own name.
    pub total_dim: Option<String>,
    /// The `dim_param` of the tokens fed in a step (axis 1 of the token ids), when it has one.
    pub sequence_dim: Option<String>,
    /// The `dim_param` of the batch (axis 0 of the token ids), when it has one.
    pub batch_dim: Option<String>,
    /// The boolean input that chooses a merged decoder's branch (optimum's
    /// `use_cache_branch`): fed false on the first step (no cache yet), true after.
    pub cache_branch: Option<String>,
}

fn dims(v: &ValueInfoProto) -> Option<(i32, Vec<DimValue>)> {
    use attnrt_onnx::proto::type_proto::Value;
    let Some(Value::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else {
        return None;
    };
    let shape = t.shape.as_ref()?;
    let d = shape
        .dim
        .iter()
        .map(|d| d.value.clone())
        .collect::<Option<Vec<_>>>()?;
    Some((t.elem_type, d))
}

fn fixed(d: &DimValue) -> Option<usize> {
    match d {
        DimValue::DimValue(v) if *v > 0 => usize::try_from(*v).ok(),
        _ => None,
    }
}

fn param(d: &DimValue) -> Option<&str> {
    match d {
        DimValue::DimParam(p) if !p.is_empty() => Some(p),
        _ => None,
    }
}

/// The part of a cache name that identifies the slot: `past_key_values.0.key` and
/// `present.0.key` both give `.0.key`.
fn slot_tag(name: &str, prefixes: &[&str]) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    prefixes
        .iter()
        .find_map(|p| lower.strip_prefix(p).map(str::to_string))
}

const PAST: &[&str] = &["past_key_values", "past_key_value", "past"];
const PRESENT: &[&str] = &["present_key_values", "present_key_value", "present"];

/// The decoder input that takes the encoder's states (optimum's name).
const ENCODER_STATES: &str = "encoder_hidden_states";

/// The decoder input that takes the encoder's attention mask (optimum's name).
const ENCODER_MASK: &str = "encoder_attention_mask";

/// Whether a cache input holds cross-attention keys or values: optimum names them
/// `past_key_values.N.encoder.key` (the self-attention's `.decoder.key`).
fn is_cross(name: &str) -> bool {
    slot_tag(name, PAST).is_some_and(|t| t.contains(".encoder."))
}

impl DecoderSignature {
    /// Reads the signature of `model` (`what` names it in errors).
    pub fn detect(model: &ModelProto, what: &str) -> Result<DecoderSignature> {
        let (graph, inputs) = fed_inputs(model)?;
        let outputs: Vec<&ValueInfoProto> = graph.output.iter().collect();
        let pasts: Vec<&ValueInfoProto> = inputs
            .iter()
            .copied()
            .filter(|i| slot_tag(&i.name, PAST).is_some())
            .collect();
        if pasts.is_empty() {
            bail!(
                "{what}: the model has no cache inputs (past_key_values.*): `attnrt generate` \
                 needs a decoder exported with its key/value cache"
            );
        }
        let (cross_pasts, self_pasts): (Vec<_>, Vec<_>) =
            pasts.iter().copied().partition(|p| is_cross(&p.name));
        let (cache, past_dim) = pair_cache(&self_pasts, &outputs, false, what)?;
        if cache.is_empty() {
            bail!(
                "{what}: the model has no self-attention cache inputs, only cross-attention ones"
            );
        }
        let encoder_states = encoder_states_input(&inputs, what)?;
        let encoder_mask = optional_int_input(&inputs, ENCODER_MASK);
        let cross_cache = cross_cache(&cross_pasts, &outputs, what)?;
        let (input_ids, ids_type) = token_input(&inputs, "input_ids", what)?;
        let attention_mask = optional_int_input(&inputs, "attention_mask");
        let position_ids = optional_int_input(&inputs, "position_ids");
        // A merged decoder's `use_cache_branch`: false on the first step, true after.
        let cache_branch = attnrt_onnx::branch::branch_inputs(model).into_iter().next();
        for i in &inputs {
            let known = [
                Some(input_ids.as_str()),
                attention_mask.as_ref().map(|m| m.0.as_str()),
                position_ids.as_ref().map(|p| p.0.as_str()),
                cache_branch.as_deref(),
                encoder_states.as_ref().map(|e| e.0.as_str()),
                encoder_mask.as_ref().map(|m| m.0.as_str()),
            ];
            if !known.contains(&Some(i.name.as_str())) && !pasts.iter().any(|p| p.name == i.name) {
                bail!(
                    "{what}: input '{}' is none of token ids, attention mask, position ids, \
                     cache, cache branch, encoder states or mask; `attnrt generate` cannot feed \
                     it",
                    i.name
                );
            }
        }
        let total_dim = attention_mask
            .as_ref()
            .and_then(|(m, _)| inputs.iter().find(|i| &i.name == m))
            .and_then(|i| dims(i))
            .and_then(|(_, d)| d.get(1).and_then(param).map(str::to_string))
            .filter(|t| *t != past_dim);
        let ids_dim = |axis: usize| {
            inputs
                .iter()
                .find(|i| i.name == input_ids)
                .and_then(|i| dims(i))
                .and_then(|(_, d)| d.get(axis).and_then(param).map(str::to_string))
                .filter(|s| *s != past_dim)
        };
        let (batch_dim, sequence_dim) = (ids_dim(0), ids_dim(1));
        let batch_dim = batch_dim.filter(|b| Some(b) != sequence_dim.as_ref());
        let presents: Vec<&CacheSlot> = cache.iter().chain(&cross_cache).collect();
        let (logits, vocab) = logits_output(&outputs, &presents, what)?;
        Ok(DecoderSignature {
            input_ids,
            ids_type,
            attention_mask,
            position_ids,
            cache,
            cross_cache,
            encoder_states,
            encoder_mask,
            logits,
            vocab,
            past_dim,
            total_dim,
            sequence_dim,
            batch_dim,
            cache_branch,
        })
    }

    /// Checks `first` (named `what`) can make the first step of this decoder (`decoder`): it
    /// takes the token ids, the encoder's states and at most the encoder's mask, and gives the
    /// logits and every present; the encoder's inputs are taken from it.
    pub(super) fn adopt_first_step(
        &mut self,
        first: &ModelProto,
        what: &str,
        decoder: &str,
    ) -> Result<()> {
        let (graph, inputs) = fed_inputs(first)?;
        let presents = self
            .cache
            .iter()
            .chain(&self.cross_cache)
            .map(|c| &c.present);
        for name in std::iter::once(&self.logits).chain(presents) {
            if !graph.output.iter().any(|o| &o.name == name) {
                bail!("{what}: gives no output '{name}', which {decoder}'s first step needs");
            }
        }
        token_input(&inputs, &self.input_ids, what)?;
        let states = encoder_states_input(&inputs, what)?.with_context(|| {
            format!("{what}: takes no encoder states ('{ENCODER_STATES}'): it cannot make the first step of an encoder–decoder")
        })?;
        let mask = optional_int_input(&inputs, ENCODER_MASK);
        for i in &inputs {
            let known = [
                Some(&self.input_ids),
                Some(&states.0),
                mask.as_ref().map(|m| &m.0),
            ];
            if !known.contains(&Some(&i.name)) {
                bail!(
                    "{what}: input '{}' is none of token ids, encoder states or mask; the first \
                     step cannot feed it",
                    i.name
                );
            }
        }
        self.encoder_states = Some(states);
        self.encoder_mask = self.encoder_mask.take().or(mask);
        Ok(())
    }

    /// The `dim_param`s a session keeps symbolic across decode steps: the past length first
    /// (the anchor), then the mask's length when it has its own name.
    pub fn dynamic_dims(&self) -> Vec<String> {
        std::iter::once(self.past_dim.clone())
            .chain(self.total_dim.clone())
            .collect()
    }

    /// How the decode steps' plan may be keyed where tract can plan it: the past length
    /// symbolic (the anchor, the mask's length tied to it) and the batch symbolic on its own,
    /// so that one plan serves every batch size (else the session's own policy, the batch
    /// bound). Empty when the token ids' batch has no name of its own.
    pub fn decode_shapes(&self) -> Vec<ShapePolicy> {
        self.batch_dim
            .iter()
            .map(|batch| ShapePolicy::DynamicDimsFree {
                tied: self.dynamic_dims(),
                free: vec![batch.clone()],
            })
            .collect()
    }

    /// How a prompt's plan may be keyed, so that one plan serves every prompt length (and
    /// batch size), best first: the tokens fed symbolic (the anchor), the mask's length tied to
    /// it (the past is empty: bound to 0), the batch symbolic on its own; then the same with the
    /// batch bound (for a graph tract cannot plan with two open symbols; attnrt's `Flatten`
    /// and `Mul` parsers make the TorchScript and optimum exports plannable).
    /// Empty when the token ids' length has no name of its own.
    pub fn prompt_shapes(&self) -> Vec<ShapePolicy> {
        let Some(sequence) = self.sequence_dim.clone() else {
            return Vec::new();
        };
        let tied: Vec<String> = std::iter::once(sequence)
            .chain(self.total_dim.clone())
            .collect();
        let free = self.batch_dim.iter().cloned().collect();
        vec![
            ShapePolicy::DynamicDimsFree {
                tied: tied.clone(),
                free,
            },
            ShapePolicy::DynamicDims(tied),
        ]
    }
}

/// `model`'s graph and the inputs a caller feeds (those no initializer gives).
fn fed_inputs(model: &ModelProto) -> Result<(&GraphProto, Vec<&ValueInfoProto>)> {
    let graph = model.graph.as_ref().context("the model has no graph")?;
    let initializers: std::collections::HashSet<&str> =
        graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let inputs = graph
        .input
        .iter()
        .filter(|i| !initializers.contains(i.name.as_str()))
        .collect();
    Ok((graph, inputs))
}

/// The encoder's states input, `[batch, encoder_sequence, hidden]` float, when the decoder
/// takes one.
fn encoder_states_input(
    inputs: &[&ValueInfoProto],
    what: &str,
) -> Result<Option<(String, Option<usize>)>> {
    let Some(i) = inputs.iter().find(|i| i.name == ENCODER_STATES) else {
        return Ok(None);
    };
    match dims(i) {
        Some((t, d)) if d.len() == 3 && is_float(t) => {
            Ok(Some((i.name.clone(), d.get(2).and_then(fixed))))
        }
        _ => bail!(
            "{what}: input '{}' is not float encoder states [batch, encoder sequence, hidden]",
            i.name
        ),
    }
}

/// The cross-attention cache: every cross past paired with its present, which the first step
/// gives: this model's output of that name (a merged decoder), else the output `present<tag>`
/// of the model that makes the first step (optimum's `decoder_model.onnx` beside
/// `decoder_with_past_model.onnx`, [`Generator::with_first_step`](super::Generator::with_first_step)).
fn cross_cache(
    pasts: &[&ValueInfoProto],
    outputs: &[&ValueInfoProto],
    what: &str,
) -> Result<Vec<CacheSlot>> {
    Ok(pair_cache(pasts, outputs, true, what)?.0)
}

/// Pairs every past input with its present output and checks their shapes agree; with
/// `elsewhere`, a past without a present here is paired with the name `present<tag>` (another
/// model gives it).
fn pair_cache(
    pasts: &[&ValueInfoProto],
    outputs: &[&ValueInfoProto],
    elsewhere: bool,
    what: &str,
) -> Result<(Vec<CacheSlot>, String)> {
    let mut cache = Vec::new();
    let mut past_dim: Option<String> = None;
    for p in pasts {
        let tag = slot_tag(&p.name, PAST).unwrap_or_default();
        let present = outputs
            .iter()
            .find(|o| slot_tag(&o.name, PRESENT).as_deref() == Some(tag.as_str()));
        if present.is_none() && !elsewhere {
            bail!(
                "{what}: cache input '{}' has no matching present output (expected a name like \
                 'present{tag}')",
                p.name
            );
        }
        let (elem_type, pd) = dims(p)
            .with_context(|| format!("{what}: cache input '{}' declares no shape", p.name))?;
        let (heads, head_size) = match (
            pd.len(),
            pd.get(1).and_then(fixed),
            pd.get(3).and_then(fixed),
        ) {
            (4, Some(h), Some(d)) => (h, d),
            _ => bail!(
                "{what}: cache input '{}' is not [batch, heads, past, head_size] with fixed \
                 heads and head size",
                p.name
            ),
        };
        if let Some(present) = present {
            let (present_type, od) = dims(present)
                .with_context(|| format!("{what}: output '{}' declares no shape", present.name))?;
            if od.len() != 4
                || od.get(1).and_then(fixed) != Some(heads)
                || od.get(3).and_then(fixed) != Some(head_size)
                || present_type != elem_type
            {
                bail!(
                    "{what}: '{}' and '{}' disagree: the present output must have the past \
                     input's type, heads ({heads}) and head size ({head_size})",
                    p.name,
                    present.name
                );
            }
        }
        let dim = pd[2].clone();
        let name = param(&dim).with_context(|| {
            format!(
                "{what}: cache input '{}' has no named past-length dimension",
                p.name
            )
        })?;
        match &past_dim {
            Some(d) if d != name => {
                bail!("{what}: cache inputs disagree on the past length ('{d}' and '{name}')")
            }
            _ => past_dim = Some(name.to_string()),
        }
        cache.push(CacheSlot {
            past: p.name.clone(),
            present: present.map_or_else(|| format!("present{tag}"), |o| o.name.clone()),
            heads,
            head_size,
            elem_type,
        });
    }
    Ok((cache, past_dim.unwrap_or_default()))
}

/// The runtime's element type of a cache or token tensor of ONNX type `elem_type`.
pub(super) fn datum(elem_type: i32) -> Result<DatumType> {
    Ok(match DataType::try_from(elem_type) {
        Ok(DataType::Int64) => DatumType::I64,
        Ok(DataType::Int32) => DatumType::I32,
        Ok(DataType::Float) => DatumType::F32,
        Ok(DataType::Float16) => DatumType::F16,
        Ok(DataType::Bool) => DatumType::Bool,
        _ => bail!(
            "element type {} is not supported by `attnrt generate`",
            attnrt_onnx::tensor::type_name(elem_type)
        ),
    })
}

fn is_float(t: i32) -> bool {
    t == DataType::Float as i32 || t == DataType::Float16 as i32
}

fn is_int(t: i32) -> bool {
    t == DataType::Int64 as i32 || t == DataType::Int32 as i32
}

fn token_input(inputs: &[&ValueInfoProto], name: &str, what: &str) -> Result<(String, i32)> {
    let i = inputs
        .iter()
        .find(|i| i.name == name)
        .with_context(|| format!("{what}: no '{name}' input (the token ids)"))?;
    match dims(i) {
        Some((t, d)) if is_int(t) && d.len() == 2 => Ok((i.name.clone(), t)),
        _ => bail!("{what}: input '{name}' is not an int32/int64 [batch, sequence] tensor"),
    }
}

fn optional_int_input(inputs: &[&ValueInfoProto], name: &str) -> Option<(String, i32)> {
    let i = inputs.iter().find(|i| i.name == name)?;
    let (t, _) = dims(i)?;
    Some((i.name.clone(), t))
}

fn logits_output(
    outputs: &[&ValueInfoProto],
    cache: &[&CacheSlot],
    what: &str,
) -> Result<(String, Option<usize>)> {
    let candidates: Vec<&&ValueInfoProto> = outputs
        .iter()
        .filter(|o| !cache.iter().any(|c| c.present == o.name))
        .collect();
    let o = candidates
        .iter()
        .find(|o| o.name == "logits")
        .or(candidates.first())
        .with_context(|| format!("{what}: no logits output besides the cache"))?;
    let (t, d) =
        dims(o).with_context(|| format!("{what}: output '{}' declares no shape", o.name))?;
    if d.len() != 3 || !is_float(t) {
        bail!(
            "{what}: output '{}' is not float logits [batch, sequence, vocab]",
            o.name
        );
    }
    Ok((o.name.clone(), d.get(2).and_then(fixed)))
}
