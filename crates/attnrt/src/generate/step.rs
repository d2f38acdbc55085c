//! The inputs of one generation step and how the outputs of a step become the next inputs.
//! The cache tensors move from one step's outputs into the next step's inputs: no copy (with
//! the in-place cache, `kv_cache.rs`, they are zero-byte stand-ins carrying the length).

use anyhow::{bail, Context, Result};
use std::sync::Arc;

use attnrt_runtime::{KvStore, NamedTensor, Tensor};

use super::kv_cache::HeldCache;

use super::encoder::CrossInputs;
use super::signature::datum;
use super::{CacheSlot, DecoderSignature};

/// The state of a generation between steps: the tokens to feed (one row per prompt, the same
/// number in every row), the past length, each row's attention mask and positions, and the
/// cache. Prompts of different lengths are padded on the left: the pads are masked out and the
/// real tokens of every row keep the positions they have alone (transformers' convention:
/// `position_ids = cumsum(attention_mask) - 1`, pads at 1).
#[derive(Clone)]
pub struct StepInputs {
    tokens: Vec<Vec<i64>>,
    past: usize,
    /// Per row, the mask over every position fed so far and this step's.
    mask_rows: Vec<Vec<i64>>,
    /// Per row, the positions of this step's tokens.
    position_rows: Vec<Vec<i64>>,
    cache: Vec<NamedTensor>,
    ids_type: i32,
    mask: Option<(String, i32)>,
    positions: Option<(String, i32)>,
    input_ids: String,
    cache_branch: Option<String>,
    /// An encoder–decoder's encoder states and cross-attention cache.
    cross: Option<CrossInputs>,
    /// The in-place cache (`kv_cache.rs`): the cache tensors are then its zero-byte stand-ins
    /// `[batch, heads, past, 0]`.
    held: Option<HeldCache>,
}

/// The token a pad position holds (masked out, so any id in the vocabulary does).
const PAD: i64 = 0;

/// A `[rows, len]` tensor of `elem_type` holding the rows (all of one length).
fn rows(values: &[Vec<i64>], elem_type: i32) -> Result<Tensor> {
    let len = values.first().map_or(0, Vec::len);
    let t = Tensor::from_shape(&[values.len(), len], &values.concat())?;
    let dt = datum(elem_type)?;
    if t.datum_type() == dt {
        // (`cast_to_dt` to its own type borrows, and `into_owned` would copy it)
        return Ok(t);
    }
    Ok(t.cast_to_dt(dt)?.into_owned())
}

impl StepInputs {
    /// The prefill: every prompt (one row each, padded on the left to the longest), an empty
    /// past, and an encoder–decoder's `cross` inputs. Prompts of different lengths need the
    /// model's attention mask and position ids.
    pub fn prefill(
        sig: &DecoderSignature,
        prompts: &[Vec<i64>],
        cross: Option<CrossInputs>,
        held: Option<HeldCache>,
    ) -> Result<StepInputs> {
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let ragged = prompts.iter().any(|p| p.len() != longest);
        if ragged && (sig.attention_mask.is_none() || sig.position_ids.is_none()) {
            bail!(
                "prompts of different lengths are padded on the left, which needs a model that takes an attention mask and position ids; this one takes {}",
                taken(sig)
            );
        }
        let batch = prompts.len();
        let cache = sig
            .cache
            .iter()
            .map(|c| -> Result<NamedTensor> {
                let dt = datum(c.elem_type)?;
                Ok(NamedTensor {
                    name: c.past.clone(),
                    tensor: Tensor::zero_dt(
                        dt,
                        &[batch, c.heads, 0, head_size(c, held.is_some())],
                    )?,
                })
            })
            .collect::<Result<_>>()?;
        let padded = |p: &Vec<i64>, pad: i64, real: &dyn Fn(usize) -> i64| -> Vec<i64> {
            let n = longest - p.len();
            (0..longest)
                .map(|i| if i < n { pad } else { real(i - n) })
                .collect()
        };
        Ok(StepInputs {
            tokens: prompts.iter().map(|p| padded(p, PAD, &|i| p[i])).collect(),
            past: 0,
            mask_rows: prompts.iter().map(|p| padded(p, 0, &|_| 1)).collect(),
            position_rows: prompts
                .iter()
                .map(|p| padded(p, 1, &|i| i as i64))
                .collect(),
            cache,
            ids_type: sig.ids_type,
            mask: sig.attention_mask.clone(),
            positions: sig.position_ids.clone(),
            input_ids: sig.input_ids.clone(),
            cache_branch: sig.cache_branch.clone(),
            cross,
            held,
        })
    }

    /// The in-place cache, when the generation keeps one.
    pub fn store(&self) -> Option<&Arc<KvStore>> {
        self.held.as_ref().map(|h| &h.store)
    }

    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        self.tokens.len()
    }

    /// Tokens fed this step (per row).
    pub fn fed(&self) -> usize {
        self.tokens.first().map_or(0, Vec::len)
    }

    /// Past length this step.
    pub fn past(&self) -> usize {
        self.past
    }

    /// The step's inputs; the cache tensors move out (the outputs bring the next ones).
    pub fn take_tensors(&mut self) -> Result<Vec<NamedTensor>> {
        let mut t = self.feeds(
            &self.tokens,
            &self.mask_rows,
            &self.position_rows,
            self.past > 0,
        )?;
        t.append(&mut self.cache);
        t.extend(self.cross.iter().flat_map(CrossInputs::feeds));
        Ok(t)
    }

    /// The inputs besides the cache: token ids, the mask and positions where the model takes
    /// them (`[rows, len]` each), and a merged decoder's `use_cache_branch`.
    fn feeds(
        &self,
        ids: &[Vec<i64>],
        mask: &[Vec<i64>],
        positions: &[Vec<i64>],
        with_cache: bool,
    ) -> Result<Vec<NamedTensor>> {
        let mut t = vec![NamedTensor {
            name: self.input_ids.clone(),
            tensor: rows(ids, self.ids_type)?,
        }];
        for (input, values) in [(&self.mask, mask), (&self.positions, positions)] {
            if let Some((name, ty)) = input {
                t.push(NamedTensor {
                    name: name.clone(),
                    tensor: rows(values, *ty)?,
                });
            }
        }
        t.extend(self.branch_input(with_cache)?);
        Ok(t)
    }

    /// A merged decoder's `use_cache_branch` holding `with_cache`.
    fn branch_input(&self, with_cache: bool) -> Result<Option<NamedTensor>> {
        let Some(name) = &self.cache_branch else {
            return Ok(None);
        };
        Ok(Some(NamedTensor {
            name: name.clone(),
            tensor: Tensor::from_shape(&[1], &[with_cache])?,
        }))
    }

    /// Inputs shaped like the first decode step's after this prefill (one token per row, a past
    /// of this step's length), holding zeros and ones: what planning that step needs.
    pub fn next_step_shapes(&self, sig: &DecoderSignature) -> Result<Vec<NamedTensor>> {
        let (batch, past) = (self.batch(), self.past + self.fed());
        let ones = vec![vec![1; past + 1]; batch];
        let ids = vec![vec![PAD]; batch];
        let mut t = self.feeds(&ids, &ones, &ids, true)?;
        t.extend(self.cross.iter().flat_map(CrossInputs::feeds));
        for c in &sig.cache {
            let shape = [batch, c.heads, past, head_size(c, self.held.is_some())];
            let tensor = Tensor::zero_dt(datum(c.elem_type)?, &shape)?;
            t.push(NamedTensor {
                name: c.past.clone(),
                tensor,
            });
        }
        Ok(t)
    }

    /// Takes a step's outputs: the presents become the cache, the logits (of every position fed,
    /// or of the last only) are returned.
    pub fn take_outputs(
        &mut self,
        sig: &DecoderSignature,
        mut outputs: Vec<NamedTensor>,
    ) -> Result<Tensor> {
        let (batch, fed) = (self.batch(), self.fed());
        if let Some(cross) = self.cross.as_mut() {
            cross.take_presents(&sig.cross_cache, &mut outputs)?;
        }
        let mut take = |name: &str| -> Result<Tensor> {
            let at = outputs
                .iter()
                .position(|o| o.name == name)
                .with_context(|| format!("the model gave no output '{name}'"))?;
            Ok(outputs.swap_remove(at).tensor)
        };
        let presents = sig
            .cache
            .iter()
            .map(|slot| take(&slot.present))
            .collect::<Result<Vec<_>>>()?;
        self.take_cache(sig, presents)?;
        let logits = take(&sig.logits)?;
        // every position fed, or the last one only (`last_position.rs`)
        if logits.rank() != 3
            || logits.shape()[0] != batch
            || ![fed, 1].contains(&logits.shape()[1])
        {
            bail!(
                "output '{}' is {:?}, expected [{batch}, {fed}, vocab] (or [{batch}, 1, vocab]: \
                 the last position only)",
                sig.logits,
                logits.shape(),
            );
        }
        Ok(logits)
    }

    /// The presents of a step (one per cache slot) become the cache: as they are, or with the
    /// in-place cache as its stand-ins, those made as tensors (a merged decoder's first step)
    /// moved into the store first.
    fn take_cache(&mut self, sig: &DecoderSignature, presents: Vec<Tensor>) -> Result<()> {
        let (batch, fed) = (self.batch(), self.fed());
        let total = self.past + fed;
        let mut tensors = Vec::new();
        let in_place = self.held.is_some();
        for (slot, present) in sig.cache.iter().zip(presents) {
            let want = [batch, slot.heads, total, head_size(slot, in_place)];
            let full = [batch, slot.heads, total, slot.head_size];
            if in_place && self.past == 0 && present.shape() == full {
                self.cache.push(NamedTensor {
                    name: slot.past.clone(),
                    tensor: Tensor::zero_dt(present.datum_type(), &want)?,
                });
                tensors.push((slot.past.as_str(), present));
                continue;
            }
            if present.shape() != want {
                bail!(
                    "output '{}' is {:?}, expected {want:?} (past {} + {fed} new)",
                    slot.present,
                    present.shape(),
                    self.past,
                );
            }
            self.cache.push(NamedTensor {
                name: slot.past.clone(),
                tensor: present,
            });
        }
        match &self.held {
            Some(held) if !tensors.is_empty() => held.move_in(tensors),
            _ => Ok(()),
        }
    }

    /// Moves to the next step, which feeds one token per row (`tokens[row]`).
    pub fn advance(&mut self, tokens: &[i64]) {
        self.past += self.fed();
        for (row, &token) in tokens.iter().enumerate() {
            let next = self.position_rows[row].last().map_or(0, |&p| p + 1);
            self.tokens[row] = vec![token];
            self.mask_rows[row].push(1);
            self.position_rows[row] = vec![next];
        }
    }
}

/// The head size of `slot`'s tensors: 0 for the stand-ins of an in-place cache.
fn head_size(slot: &CacheSlot, in_place: bool) -> usize {
    if in_place {
        0
    } else {
        slot.head_size
    }
}

/// What a signature takes besides the ids and the cache, for errors.
fn taken(sig: &DecoderSignature) -> String {
    let names: Vec<&str> = [&sig.attention_mask, &sig.position_ids]
        .into_iter()
        .flatten()
        .map(|(n, _)| n.as_str())
        .collect();
    if names.is_empty() {
        "neither".into()
    } else {
        format!("only '{}'", names.join("', '"))
    }
}

/// The logits of the last position of every row, as f32.
pub fn last_logits(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    let f = logits.cast_to::<f32>()?;
    let view = f.to_plain_array_view::<f32>()?;
    let [rows, fed, vocab] = *view.shape() else {
        bail!("logits are not [batch, sequence, vocab]");
    };
    let data = view.as_slice().context("logits are not contiguous")?;
    Ok((0..rows)
        .map(|r| {
            let last = (r * fed + fed - 1) * vocab;
            data[last..last + vocab].to_vec()
        })
        .collect())
}

/// `logits` at the positions `like` has: their last position when `like` has only that one (a
/// decoder whose logits are computed at the last position only), else all of them.
pub fn at_positions_of(logits: &Tensor, like: &Tensor) -> Result<Tensor> {
    let (fed, wanted) = (logits.shape()[1], like.shape()[1]);
    if wanted == fed || wanted != 1 {
        return Ok(logits.clone());
    }
    logits.slice(1, fed - 1, fed)
}
