//! The inputs of one generation step and how the outputs of a step become the next inputs.
//! The cache tensors move from one step's outputs into the next step's inputs: no copy.

use anyhow::{bail, Context, Result};
use attnrt_onnx::DataType;
use attnrt_runtime::{DatumType, NamedTensor, Tensor};

use super::DecoderSignature;

/// The state of a generation between steps: the tokens to feed, the past length, the cache.
#[derive(Clone)]
pub struct StepInputs {
    tokens: Vec<i64>,
    past: usize,
    cache: Vec<NamedTensor>,
    ids_type: i32,
    mask: Option<(String, i32)>,
    positions: Option<(String, i32)>,
    input_ids: String,
}

fn datum(elem_type: i32) -> Result<DatumType> {
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

/// A `[1, values.len()]` tensor of `elem_type` holding `values`.
fn row(values: &[i64], elem_type: i32) -> Result<Tensor> {
    let t = Tensor::from_shape(&[1, values.len()], values)?;
    Ok(t.cast_to_dt(datum(elem_type)?)?.into_owned())
}

impl StepInputs {
    /// The prefill: the whole prompt, an empty past.
    pub fn prefill(sig: &DecoderSignature, prompt: &[i64]) -> Result<StepInputs> {
        let cache = sig
            .cache
            .iter()
            .map(|c| -> Result<NamedTensor> {
                let dt = datum(c.elem_type)?;
                Ok(NamedTensor {
                    name: c.past.clone(),
                    tensor: Tensor::zero_dt(dt, &[1, c.heads, 0, c.head_size])?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(StepInputs {
            tokens: prompt.to_vec(),
            past: 0,
            cache,
            ids_type: sig.ids_type,
            mask: sig.attention_mask.clone(),
            positions: sig.position_ids.clone(),
            input_ids: sig.input_ids.clone(),
        })
    }

    /// Tokens fed this step.
    pub fn fed(&self) -> usize {
        self.tokens.len()
    }

    /// Past length this step.
    pub fn past(&self) -> usize {
        self.past
    }

    /// The step's inputs; the cache tensors move out (the outputs bring the next ones).
    pub fn take_tensors(&mut self) -> Result<Vec<NamedTensor>> {
        let mut t = vec![NamedTensor {
            name: self.input_ids.clone(),
            tensor: row(&self.tokens, self.ids_type)?,
        }];
        let total = self.past + self.tokens.len();
        if let Some((name, ty)) = &self.mask {
            t.push(NamedTensor {
                name: name.clone(),
                tensor: row(&vec![1; total], *ty)?,
            });
        }
        if let Some((name, ty)) = &self.positions {
            let positions: Vec<i64> = (self.past as i64..total as i64).collect();
            t.push(NamedTensor {
                name: name.clone(),
                tensor: row(&positions, *ty)?,
            });
        }
        t.append(&mut self.cache);
        Ok(t)
    }

    /// Takes a step's outputs: the presents become the cache, the logits are returned.
    pub fn take_outputs(
        &mut self,
        sig: &DecoderSignature,
        mut outputs: Vec<NamedTensor>,
    ) -> Result<Tensor> {
        let total = self.past + self.tokens.len();
        let mut take = |name: &str| -> Result<Tensor> {
            let at = outputs
                .iter()
                .position(|o| o.name == name)
                .with_context(|| format!("the model gave no output '{name}'"))?;
            Ok(outputs.swap_remove(at).tensor)
        };
        for slot in &sig.cache {
            let present = take(&slot.present)?;
            let want = [1, slot.heads, total, slot.head_size];
            if present.shape() != want {
                bail!(
                    "output '{}' is {:?}, expected {want:?} (past {} + {} new)",
                    slot.present,
                    present.shape(),
                    self.past,
                    self.tokens.len()
                );
            }
            self.cache.push(NamedTensor {
                name: slot.past.clone(),
                tensor: present,
            });
        }
        let logits = take(&sig.logits)?;
        if logits.rank() != 3 || logits.shape()[..2] != [1, self.tokens.len()] {
            bail!(
                "output '{}' is {:?}, expected [1, {}, vocab]",
                sig.logits,
                logits.shape(),
                self.tokens.len()
            );
        }
        Ok(logits)
    }

    /// Moves to the next step, which feeds `token`.
    pub fn advance(&mut self, token: i64) {
        self.past += self.tokens.len();
        self.tokens = vec![token];
    }
}

/// The logits of the last position (of the last batch row), as f32.
pub fn last_logits(logits: &Tensor) -> Result<Vec<f32>> {
    let f = logits.cast_to::<f32>()?;
    let view = f.to_plain_array_view::<f32>()?;
    let vocab = *view.shape().last().context("logits have no axes")?;
    let data = view.as_slice().context("logits are not contiguous")?;
    Ok(data[data.len().saturating_sub(vocab)..].to_vec())
}
