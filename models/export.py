#!/usr/bin/env python3
"""Export the small attention models shipped in ``models/``.

Run by hand from the repository root (never in CI: it needs torch and transformers)::

    python models/export.py                 # every model, every exporter
    python models/export.py --only bert     # models whose name contains "bert"
    python models/export.py --list          # just list the model names

For each model this writes, into ``models/``:

* ``<model>.<ts|dynamo>[.opsetN].onnx``  one self-contained ONNX file per exporter run
  (``ts`` = ``torch.onnx.export(dynamo=False)`` at opset 17, ``dynamo`` = the dynamo exporter
  at its default opset, plus ``.opset23`` for modules that call scaled_dot_product_attention);
* ``<model>.inputs.npz``   the seeded inputs, keys = ONNX graph input names;
* ``<model>.outputs.npz``  PyTorch's outputs on those inputs, keys = ONNX graph output names;
* ``mha_seed.ts.extdata.onnx`` + ``mha_seed.ts.extdata.onnx.data``: the one deliberate
  external-data model (weights in the side file, biases inline);
* ``manifest.json``  one entry per ONNX file (see models/README.md for the fields);
* ``PATTERNS.md``    the node sequences the exporters emitted around each Softmax.

Every model is built from a tiny config with random weights (no downloads), everything is
seeded, so re-running the script gives the same weights and inputs.  Each export is run in
ONNX Runtime and compared with PyTorch; an export ORT cannot reproduce within ``--max-diff``
is dropped (and listed as such in the manifest).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import traceback
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

import metadata_paths  # models/ (the script's folder is on sys.path)

MODELS_DIR = Path(__file__).resolve().parent
# What the manifest's entries written here say made them (others name their own script).
THIS = "models/export.py"

# Tiny dimensions shared by the hand-written modules: d_model 64, 4 heads of 16.
D_MODEL = 64
N_HEADS = 4
VOCAB = 100
MAX_POS = 128
# Shapes of the saved inputs: batch 2 and a sequence that is neither 1 nor a power of two so
# that dynamic Reshape paths are really exercised; cross attention uses Lq != Lk.
BATCH = 2
SEQ = 10
SEQ_Q = 7

TS_OPSET = 17


# --------------------------------------------------------------------------------------------
# Hand-written modules (the seeds' MultiHeadAttention and its variants)
# --------------------------------------------------------------------------------------------


class SeedMultiHeadAttention(nn.Module):
    """The hand-written MHA of the seeds (shared/seeds/003): Linear Q/K/V, view + transpose(1, 2),
    matmul with k.transpose(-2, -1), / math.sqrt(d_k), masked_fill, softmax(dim=-1), matmul,
    transpose(1, 2).contiguous().view, output Linear.  ``scale`` selects the variant:
    "div" (the seed), "mul" (multiply by 1/sqrt(d_k)) or "none" (T5-like)."""

    def __init__(self, heads: int, d_model: int, scale: str = "div", causal: bool = False):
        super().__init__()
        self.d_model = d_model
        self.d_k = d_model // heads
        self.h = heads
        self.scale = scale
        self.q_linear = nn.Linear(d_model, d_model)
        self.k_linear = nn.Linear(d_model, d_model)
        self.v_linear = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(0.1)
        self.out = nn.Linear(d_model, d_model)
        self.causal = causal
        if causal:
            # nanoGPT style: a registered lower-triangular buffer sliced to the sequence length.
            self.register_buffer(
                "tril", torch.tril(torch.ones(MAX_POS, MAX_POS)).view(1, 1, MAX_POS, MAX_POS)
            )

    def attention(self, q, k, v, mask=None, additive_mask=None):
        scores = torch.matmul(q, k.transpose(-2, -1))
        if self.scale == "div":
            scores = scores / math.sqrt(self.d_k)
        elif self.scale == "mul":
            scores = scores * (1.0 / math.sqrt(self.d_k))
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        if additive_mask is not None:
            scores = scores + additive_mask
        if self.causal:
            lq, lk = q.size(-2), k.size(-2)
            scores = scores.masked_fill(self.tril[:, :, :lq, :lk] == 0, float("-inf"))
        scores = F.softmax(scores, dim=-1)
        scores = self.dropout(scores)
        return torch.matmul(scores, v)

    def forward(self, q, k, v, mask=None, additive_mask=None):
        batch_size = q.size(0)
        q = self.q_linear(q).view(batch_size, -1, self.h, self.d_k).transpose(1, 2)
        k = self.k_linear(k).view(batch_size, -1, self.h, self.d_k).transpose(1, 2)
        v = self.v_linear(v).view(batch_size, -1, self.h, self.d_k).transpose(1, 2)
        scores = self.attention(q, k, v, mask, additive_mask)
        concat = scores.transpose(1, 2).contiguous().view(batch_size, -1, self.d_model)
        return self.out(concat)


class SelfAttention(nn.Module):
    """Self-attention wrapper: forward(x) = mha(x, x, x)."""

    def __init__(self, mha: nn.Module):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x)


class SelfAttentionMasked(nn.Module):
    """forward(x, mask) with a [B, 1, 1, L] padding mask (1 = keep, 0 = masked_fill)."""

    def __init__(self, mha: nn.Module):
        super().__init__()
        self.mha = mha

    def forward(self, x, mask):
        return self.mha(x, x, x, mask=mask)


class SelfAttentionAdditive(nn.Module):
    """forward(x, attn_bias) with a float [B, 1, L, L] bias added to the scores."""

    def __init__(self, mha: nn.Module):
        super().__init__()
        self.mha = mha

    def forward(self, x, attn_bias):
        return self.mha(x, x, x, additive_mask=attn_bias)


class CrossAttention(nn.Module):
    """Cross attention: queries from ``x`` [B, Lq, D], keys/values from ``memory`` [B, Lk, D]."""

    def __init__(self, mha: nn.Module):
        super().__init__()
        self.mha = mha

    def forward(self, x, memory):
        return self.mha(x, memory, memory)


class GqaAttention(nn.Module):
    """LLaMA-style grouped-query attention: 4 query heads share 2 K/V heads through repeat_kv
    (Unsqueeze -> Expand -> Reshape), scale by Mul after the QK matmul, no biases."""

    def __init__(self, d_model: int = D_MODEL, q_heads: int = 4, kv_heads: int = 2):
        super().__init__()
        self.h = q_heads
        self.kvh = kv_heads
        self.d_k = d_model // q_heads
        self.q_proj = nn.Linear(d_model, q_heads * self.d_k, bias=False)
        self.k_proj = nn.Linear(d_model, kv_heads * self.d_k, bias=False)
        self.v_proj = nn.Linear(d_model, kv_heads * self.d_k, bias=False)
        self.o_proj = nn.Linear(q_heads * self.d_k, d_model, bias=False)
        self.scaling = self.d_k**-0.5

    @staticmethod
    def repeat_kv(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
        # Verbatim transformers' repeat_kv.
        batch, kv_heads, slen, head_dim = hidden.shape
        if n_rep == 1:
            return hidden
        hidden = hidden[:, :, None, :, :].expand(batch, kv_heads, n_rep, slen, head_dim)
        return hidden.reshape(batch, kv_heads * n_rep, slen, head_dim)

    def forward(self, x):
        b, l, _ = x.shape
        q = self.q_proj(x).view(b, l, -1, self.d_k).transpose(1, 2)
        k = self.k_proj(x).view(b, l, -1, self.d_k).transpose(1, 2)
        v = self.v_proj(x).view(b, l, -1, self.d_k).transpose(1, 2)
        k = self.repeat_kv(k, self.h // self.kvh)
        v = self.repeat_kv(v, self.h // self.kvh)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(b, l, -1)
        return self.o_proj(o)


class PackedQkvAttention(nn.Module):
    """One Linear to 3*d, then chunk into Q, K, V (exports as Split or Slice)."""

    def __init__(self, d_model: int = D_MODEL, heads: int = N_HEADS):
        super().__init__()
        self.h = heads
        self.d_k = d_model // heads
        self.d_model = d_model
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, l, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, l, self.h, self.d_k).transpose(1, 2)
        k = k.view(b, l, self.h, self.d_k).transpose(1, 2)
        v = v.view(b, l, self.h, self.d_k).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        att = F.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, l, self.d_model)
        return self.proj(y)


class SdpaAttention(nn.Module):
    """Projections + F.scaled_dot_product_attention.  ``mask``: None, or "padding" (forward takes
    an int64 [B, L] attention_mask turned into a bool [B, 1, 1, L] attn_mask)."""

    def __init__(self, d_model: int = D_MODEL, heads: int = N_HEADS, causal: bool = False):
        super().__init__()
        self.h = heads
        self.d_k = d_model // heads
        self.d_model = d_model
        self.causal = causal
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)

    def forward(self, x, attention_mask=None):
        b, l, _ = x.shape
        q = self.q_proj(x).view(b, l, self.h, self.d_k).transpose(1, 2)
        k = self.k_proj(x).view(b, l, self.h, self.d_k).transpose(1, 2)
        v = self.v_proj(x).view(b, l, self.h, self.d_k).transpose(1, 2)
        attn_mask = None
        if attention_mask is not None:
            attn_mask = attention_mask[:, None, None, :].bool()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=self.causal)
        y = y.transpose(1, 2).reshape(b, l, self.d_model)
        return self.o_proj(y)


class TorchMha(nn.Module):
    """nn.MultiheadAttention as self attention; returns the attention output only."""

    def __init__(self, batch_first: bool, need_weights: bool):
        super().__init__()
        self.mha = nn.MultiheadAttention(D_MODEL, N_HEADS, dropout=0.1, batch_first=batch_first)
        self.need_weights = need_weights

    def forward(self, x):
        out, _ = self.mha(x, x, x, need_weights=self.need_weights)
        return out


class TorchEncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            D_MODEL, N_HEADS, dim_feedforward=128, dropout=0.1, batch_first=True
        )

    def forward(self, x):
        return self.layer(x)


# --------------------------------------------------------------------------------------------
# transformers models from tiny configs
# --------------------------------------------------------------------------------------------


class HfEncoder(nn.Module):
    """forward(input_ids, attention_mask) -> last_hidden_state (a plain tensor, so both
    exporters see one output)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class HfDecoderOnly(nn.Module):
    """Decoder-only models (GPT-2, LLaMA) without past key values."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.last_hidden_state


class HfVision(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).last_hidden_state


class HfSeq2Seq(nn.Module):
    """Encoder-decoder (BART): returns the decoder's last hidden state, no cache."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            use_cache=False,
        )
        return out.last_hidden_state


class HfCausalLmWithCache(nn.Module):
    """A decoder-only LM (GPT-2, LLaMA) with its key/value cache as flat tensors.

    forward(input_ids [B, S], attention_mask [B, P+S], position_ids [B, S],
            past_key_values.0.key, past_key_values.0.value, ... [B, Hkv, P, Dh])
      -> (logits [B, S, V], present.0.key, present.0.value, ... [B, Hkv, P+S, Dh])

    transformers v5 passes the cache as a ``Cache`` object, which neither exporter can take as a
    graph input.  The wrapper builds a ``DynamicCache`` from the flat past tensors by filling
    one ``DynamicLayer`` per model layer directly (``keys``/``values`` set, ``is_initialized``
    true) and reads ``layer.keys``/``layer.values`` back as the present outputs.  It does not use
    ``DynamicCache(ddp_cache_data=...)``: that calls ``layer.update``, which concatenates the
    past onto a fresh 1-D empty tensor and would put an extra Concat with a rank-1 constant in
    the graph.  The only cache op left in the export is the model's own
    ``torch.cat([past, new], dim=-2)`` per layer, K and V."""

    def __init__(self, model: nn.Module, layers: int):
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers.cache_utils import DynamicCache, DynamicLayer

        cache = DynamicCache()
        for i in range(self.layers):
            layer = DynamicLayer()
            key, value = past[2 * i], past[2 * i + 1]
            layer.dtype, layer.device = key.dtype, key.device
            layer.keys, layer.values = key, value
            layer.is_initialized = True
            cache.layers.append(layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=cache, use_cache=True)
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def decoder_config(kind: str, impl: str, hidden: int, layers: int, heads: int, kv_heads: int,
                   intermediate: int, vocab: int, positions: int, init_range: float = 0.2):
    """The transformers config of a decoder-only LM (GPT-2, or LLaMA with ``kv_heads`` < ``heads``
    for grouped-query attention); shared with export_large.py.  ``init_range`` 0.2 (here) keeps
    the tiny models' attention far from uniform; export_large.py uses transformers' 0.02."""
    import transformers as tf

    # bos/eos inside the tiny vocabulary: transformers warns about the defaults (50256).
    tokens = dict(bos_token_id=0, eos_token_id=1)
    if kind == "gpt2":
        return tf.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                             n_positions=positions, n_inner=intermediate,
                             initializer_range=init_range, attn_implementation=impl, **tokens)
    if kind == "llama":
        return tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                              intermediate_size=intermediate, num_hidden_layers=layers,
                              num_attention_heads=heads, num_key_value_heads=kv_heads,
                              max_position_embeddings=positions, initializer_range=init_range,
                              attn_implementation=impl, **tokens)
    raise ValueError(f"unknown decoder kind {kind!r}")


def hf_causal_lm(cfg) -> nn.Module:
    import transformers as tf

    lm = tf.GPT2LMHeadModel(cfg) if cfg.model_type == "gpt2" else tf.LlamaForCausalLM(cfg)
    return HfCausalLmWithCache(lm, cfg.num_hidden_layers)


def hf_model(kind: str, impl: str) -> nn.Module:
    """Build a tiny random-init transformers model with the attention implementation ``impl``.
    initializer_range is raised from 0.02 so the softmax is far from uniform (a fused op that
    got the scale wrong must show in the outputs)."""
    import transformers as tf

    common = dict(attn_implementation=impl)
    if kind == "bert":
        cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=2,
                            num_attention_heads=N_HEADS, intermediate_size=128,
                            max_position_embeddings=MAX_POS, initializer_range=0.2, **common)
        return HfEncoder(tf.BertModel(cfg, add_pooling_layer=False))
    if kind == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=VOCAB, dim=D_MODEL, n_layers=2, n_heads=N_HEADS,
                                  hidden_dim=128, max_position_embeddings=MAX_POS,
                                  initializer_range=0.2, **common)
        return HfEncoder(tf.DistilBertModel(cfg))
    if kind == "gpt2":
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=D_MODEL, n_layer=2, n_head=N_HEADS,
                            n_positions=MAX_POS, n_inner=128, initializer_range=0.2,
                            use_cache=False, **common)
        return HfDecoderOnly(tf.GPT2Model(cfg))
    if kind == "llama":
        cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=MAX_POS, initializer_range=0.2,
                             use_cache=False, **common)
        return HfDecoderOnly(tf.LlamaModel(cfg))
    if kind == "t5":
        cfg = tf.T5Config(vocab_size=VOCAB, d_model=D_MODEL, d_kv=16, d_ff=128, num_layers=2,
                          num_heads=N_HEADS, relative_attention_num_buckets=8,
                          relative_attention_max_distance=32, use_cache=False, **common)
        return HfEncoder(tf.T5EncoderModel(cfg))
    if kind == "vit":
        cfg = tf.ViTConfig(hidden_size=D_MODEL, num_hidden_layers=2, num_attention_heads=N_HEADS,
                           intermediate_size=128, image_size=32, patch_size=8, num_channels=3,
                           initializer_range=0.2, **common)
        return HfVision(tf.ViTModel(cfg, add_pooling_layer=False))
    if kind == "bart":
        cfg = tf.BartConfig(vocab_size=VOCAB, d_model=D_MODEL, encoder_layers=2, decoder_layers=2,
                            encoder_attention_heads=N_HEADS, decoder_attention_heads=N_HEADS,
                            encoder_ffn_dim=128, decoder_ffn_dim=128,
                            max_position_embeddings=MAX_POS, init_std=0.2, use_cache=False,
                            **common)
        return HfSeq2Seq(tf.BartModel(cfg))
    raise ValueError(f"unknown transformers model kind {kind!r}")


def hf_attn_impl(module: nn.Module) -> str | None:
    inner = getattr(module, "model", None)
    cfg = getattr(inner, "config", None)  # HfCausalLmWithCache.model is the LM itself
    return getattr(cfg, "_attn_implementation", None)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def float_input(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def token_ids(rng: np.random.Generator, b: int, l: int) -> np.ndarray:
    return rng.integers(0, VOCAB, size=(b, l), dtype=np.int64)


def padding_mask(b: int, l: int) -> np.ndarray:
    """Ones, with the last 3 positions of the second row padded (right padding)."""
    m = np.ones((b, l), dtype=np.int64)
    m[1, l - 3:] = 0
    return m


# Decoders with a key/value cache: 2 layers, 4 query heads of 16; LLaMA has 2 KV heads (GQA).
DEC_LAYERS = 2
DEC_HEAD_DIM = D_MODEL // N_HEADS
# The saved cases: (name, past length, new tokens).  The last one is also the exporters'
# example input (past and new both >= 2: the dynamo exporter specialises dims of size 0 and 1).
DECODER_CASES = [("prefill", 0, 8), ("decode_p7_n1", 7, 1), ("decode_p5_n3", 5, 3)]
DECODER_EXPORT_CASE = "decode_p5_n3"


def decoder_feeds(rng: np.random.Generator, b: int, past: int, new: int, kv_heads: int,
                  layers: int = DEC_LAYERS, head_dim: int = DEC_HEAD_DIM) -> dict[str, np.ndarray]:
    """Inputs of one decoder step: ``new`` token ids after a cache of ``past`` positions.

    The second row is padded by 2: on the left inside the past when there is one (what batched
    generation does), on the right of the new tokens for a prefill.  Left padding in a prefill
    makes the padded query rows fully masked, and there PyTorch's SDPA, its eager softmax and
    ONNX Runtime disagree (the dynamo LLaMA SDPA export differs from PyTorch by ~7 at those
    rows): outputs there are implementation-defined, so no saved case has such a row.
    position_ids follow transformers' generate(): cumsum(mask) - 1, 1 where masked."""
    total = past + new
    mask = np.ones((b, total), dtype=np.int64)
    if b > 1:
        if past >= 2:
            mask[1, :2] = 0
        else:
            mask[1, total - 2:] = 0
    pos = np.cumsum(mask, axis=1) - 1
    pos[mask == 0] = 1
    feeds = {"input_ids": token_ids(rng, b, new), "attention_mask": mask,
             "position_ids": pos[:, past:].astype(np.int64)}
    for i in range(layers):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = float_input(rng, b, kv_heads, past, head_dim)
    return feeds


def decoder_dynamic(layers: int = DEC_LAYERS) -> dict[str, dict[int, str]]:
    """Dynamic axes of a decoder with a cache.  ``total_sequence`` (= past_sequence + sequence)
    is declared on the mask and the presents; the dynamo exporter renames it on the outputs to
    the expression it derived (``past_sequence + sequence``)."""
    dyn = {"input_ids": {0: "batch", 1: "sequence"},
           "attention_mask": {0: "batch", 1: "total_sequence"},
           "position_ids": {0: "batch", 1: "sequence"},
           "logits": {0: "batch", 1: "sequence"}}
    for i in range(layers):
        for kv in ("key", "value"):
            dyn[f"past_key_values.{i}.{kv}"] = {0: "batch", 2: "past_sequence"}
            dyn[f"present.{i}.{kv}"] = {0: "batch", 2: "total_sequence"}
    return dyn


def decoder_outputs(layers: int = DEC_LAYERS) -> list[str]:
    return ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


# --------------------------------------------------------------------------------------------
# Model table
# --------------------------------------------------------------------------------------------


@dataclass
class ModelSpec:
    """One model to export.  ``inputs`` gives the named inputs in forward() order; ``dynamic``
    maps input/output names to {axis: dim name}."""

    name: str
    family: str
    source: str
    build: Callable[[], nn.Module]
    # inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q): named inputs for batch B, sequence L (and query
    # length LQ for cross attention); called a second time with other sizes to check that the
    # exported dynamic axes really are dynamic.
    inputs: Callable[..., dict[str, np.ndarray]]
    dynamic: dict[str, dict[int, str]]
    outputs: list[str]
    attention_blocks: int
    tags: list[str]
    uses_sdpa: bool = False
    hf_impl: str | None = None
    note: str = ""
    # Several saved input cases (decoders: prefill and decode steps): cases(rng) -> [(name,
    # inputs)]; the one named ``export_case`` is the exporters' example and the legacy
    # single-case ``<model>.inputs.npz``-style fields point at it.  None: one case from inputs().
    cases: Callable[[np.random.Generator], list[tuple[str, dict[str, np.ndarray]]]] | None = None
    export_case: str | None = None
    # The trailing forward() arguments that are a *args tuple (dynamo's dynamic_shapes nest them).
    varargs_from: int | None = None


def seq_dyn(*names: str) -> dict[str, dict[int, str]]:
    return {n: {0: "batch", 1: "sequence"} for n in names}


def model_specs() -> list[ModelSpec]:
    seed_src = "models/export.py SeedMultiHeadAttention (shared/seeds/003 hand-written MHA)"
    specs: list[ModelSpec] = []

    def x_only(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        return {"x": float_input(rng, B, L, D_MODEL)}

    specs.append(ModelSpec(
        "mha_seed", "seed", seed_src,
        lambda: SelfAttention(SeedMultiHeadAttention(N_HEADS, D_MODEL, "div")),
        x_only, {**seq_dyn("x", "output")}, ["output"], 1, ["div-scale"]))

    def mask_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        m = padding_mask(B, L).reshape(B, 1, 1, L)
        return {"x": float_input(rng, B, L, D_MODEL), "mask": m}

    specs.append(ModelSpec(
        "mha_seed_mask", "seed", seed_src + " with masked_fill(mask == 0, -1e9), mask [B,1,1,L]",
        lambda: SelfAttentionMasked(SeedMultiHeadAttention(N_HEADS, D_MODEL, "div")),
        mask_inputs, {**seq_dyn("x", "output"), "mask": {0: "batch", 3: "sequence"}},
        ["output"], 1, ["div-scale", "bool-mask", "padding-mask"]))

    def additive_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        pad = padding_mask(B, L).astype(bool)
        causal = np.tril(np.ones((L, L), dtype=bool))
        keep = pad[:, None, None, :] & causal[None, None]
        bias = np.where(keep, 0.0, -10000.0).astype(np.float32)
        return {"x": float_input(rng, B, L, D_MODEL), "attn_bias": bias}

    specs.append(ModelSpec(
        "mha_seed_addmask", "seed",
        seed_src + " with scores + attn_bias, float [B,1,L,L] (padding and causal as 0/-1e4)",
        lambda: SelfAttentionAdditive(SeedMultiHeadAttention(N_HEADS, D_MODEL, "div")),
        additive_inputs,
        {**seq_dyn("x", "output"), "attn_bias": {0: "batch", 2: "sequence", 3: "sequence"}},
        ["output"], 1, ["div-scale", "additive-mask"]))

    specs.append(ModelSpec(
        "mha_seed_mul", "seed", seed_src + " scaled by * (1/sqrt(d_k))",
        lambda: SelfAttention(SeedMultiHeadAttention(N_HEADS, D_MODEL, "mul")),
        x_only, seq_dyn("x", "output"), ["output"], 1, ["mul-scale"]))

    specs.append(ModelSpec(
        "mha_seed_causal", "seed",
        seed_src + " with a registered tril buffer sliced to L and masked_fill(-inf)",
        lambda: SelfAttention(SeedMultiHeadAttention(N_HEADS, D_MODEL, "div", causal=True)),
        x_only, seq_dyn("x", "output"), ["output"], 1, ["div-scale", "causal", "bool-mask"]))

    specs.append(ModelSpec(
        "mha_seed_noscale", "seed", seed_src + " without scale (T5-like)",
        lambda: SelfAttention(SeedMultiHeadAttention(N_HEADS, D_MODEL, "none")),
        x_only, seq_dyn("x", "output"), ["output"], 1, ["noscale"]))

    def cross_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        return {"x": float_input(rng, B, LQ, D_MODEL),
                "memory": float_input(rng, B, L, D_MODEL)}

    specs.append(ModelSpec(
        "mha_cross", "seed", seed_src + " as cross attention (Q from x, K/V from memory)",
        lambda: CrossAttention(SeedMultiHeadAttention(N_HEADS, D_MODEL, "div")),
        cross_inputs,
        {"x": {0: "batch", 1: "q_sequence"}, "memory": {0: "batch", 1: "kv_sequence"},
         "output": {0: "batch", 1: "q_sequence"}},
        ["output"], 1, ["div-scale", "cross"]))

    specs.append(ModelSpec(
        "mha_gqa", "seed", "models/export.py GqaAttention (LLaMA repeat_kv, 4 Q heads, 2 KV heads)",
        GqaAttention, x_only, seq_dyn("x", "output"), ["output"], 1, ["mul-scale", "gqa"]))

    specs.append(ModelSpec(
        "mha_packed_qkv", "seed", "models/export.py PackedQkvAttention (Linear to 3d, chunk)",
        PackedQkvAttention, x_only, seq_dyn("x", "output"), ["output"], 1,
        ["div-scale", "packed-qkv"]))

    specs.append(ModelSpec(
        "torch_mha", "torch", "torch.nn.MultiheadAttention(batch_first=True), need_weights=False",
        lambda: TorchMha(batch_first=True, need_weights=False),
        x_only, seq_dyn("x", "output"), ["output"], 1, ["packed-qkv"], uses_sdpa=True,
        note="need_weights=False: F.multi_head_attention_forward calls scaled_dot_product_attention"))

    def seqfirst_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        return {"x": float_input(rng, L, B, D_MODEL)}

    specs.append(ModelSpec(
        "torch_mha_seqfirst", "torch",
        "torch.nn.MultiheadAttention(batch_first=False), need_weights=True (explicit bmm/softmax)",
        lambda: TorchMha(batch_first=False, need_weights=True),
        seqfirst_inputs, {"x": {0: "sequence", 1: "batch"}, "output": {0: "sequence", 1: "batch"}},
        ["output"], 1, ["packed-qkv", "seq-first"]))

    specs.append(ModelSpec(
        "torch_encoder_layer", "torch",
        "torch.nn.TransformerEncoderLayer(batch_first=True), fast path disabled",
        TorchEncoderLayer, x_only, seq_dyn("x", "output"), ["output"], 1, ["packed-qkv"],
        uses_sdpa=True))

    specs.append(ModelSpec(
        "sdpa", "sdpa", "models/export.py SdpaAttention: F.scaled_dot_product_attention",
        lambda: SdpaAttention(), x_only, seq_dyn("x", "output"), ["output"], 1, [],
        uses_sdpa=True))

    specs.append(ModelSpec(
        "sdpa_causal", "sdpa", "models/export.py SdpaAttention: F.scaled_dot_product_attention(is_causal=True)",
        lambda: SdpaAttention(causal=True), x_only, seq_dyn("x", "output"), ["output"], 1,
        ["causal"], uses_sdpa=True))

    def sdpa_mask_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        return {"x": float_input(rng, B, L, D_MODEL),
                "attention_mask": padding_mask(B, L)}

    specs.append(ModelSpec(
        "sdpa_mask", "sdpa",
        "models/export.py SdpaAttention: F.scaled_dot_product_attention(attn_mask=bool [B,1,1,L])",
        lambda: SdpaAttention(), sdpa_mask_inputs, seq_dyn("x", "attention_mask", "output"),
        ["output"], 1, ["bool-mask", "padding-mask"], uses_sdpa=True))

    # transformers models.
    def text_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        return {"input_ids": token_ids(rng, B, L), "attention_mask": padding_mask(B, L)}

    hf_text_dyn = seq_dyn("input_ids", "attention_mask", "last_hidden_state")
    for kind, blocks, tags, src in [
        ("bert", 2, ["additive-mask", "padding-mask"], "transformers.BertModel"),
        ("distilbert", 2, ["padding-mask"], "transformers.DistilBertModel"),
        ("gpt2", 2, ["causal", "packed-qkv", "padding-mask"], "transformers.GPT2Model"),
        ("llama", 2, ["causal", "gqa", "rope", "padding-mask"], "transformers.LlamaModel (2 KV heads, 4 Q heads)"),
        ("t5", 2, ["noscale", "position-bias", "padding-mask"], "transformers.T5EncoderModel"),
    ]:
        for impl in ("eager", "sdpa"):
            specs.append(ModelSpec(
                f"{kind}_{impl}", kind, f"{src} (attn_implementation={impl!r})",
                (lambda k=kind, i=impl: hf_model(k, i)),
                text_inputs, hf_text_dyn, ["last_hidden_state"], blocks, list(tags),
                uses_sdpa=(impl == "sdpa"), hf_impl=impl))

    # Decoder-only LMs with a key/value cache (past in, present out): prefill and decode steps.
    for kind, kv_heads, tags, src in [
        ("gpt2", N_HEADS, ["causal", "packed-qkv", "padding-mask", "kv-cache"],
         "transformers.GPT2LMHeadModel with a DynamicCache (HfCausalLmWithCache)"),
        ("llama", 2, ["causal", "gqa", "rope", "padding-mask", "kv-cache"],
         "transformers.LlamaForCausalLM (2 KV heads, 4 Q heads) with a DynamicCache "
         "(HfCausalLmWithCache)"),
    ]:
        def dec_cases(rng, kvh=kv_heads):
            return [(name, decoder_feeds(rng, BATCH, past, new, kvh))
                    for name, past, new in DECODER_CASES]

        def dec_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q, kvh=kv_heads):
            # The other-shapes check (3, 13, 5): batch 3, past 8, new 5.
            return decoder_feeds(rng, B, L - LQ, LQ, kvh)

        for impl in ("eager", "sdpa"):
            specs.append(ModelSpec(
                f"{kind}_cache_{impl}", kind, f"{src} (attn_implementation={impl!r})",
                (lambda k=kind, i=impl, kvh=kv_heads: hf_causal_lm(decoder_config(
                    k, i, D_MODEL, DEC_LAYERS, N_HEADS, kvh, 128, VOCAB, MAX_POS))),
                dec_inputs, decoder_dynamic(), decoder_outputs(), DEC_LAYERS, list(tags),
                uses_sdpa=(impl == "sdpa"), hf_impl=impl, cases=dec_cases,
                export_case=DECODER_EXPORT_CASE, varargs_from=3,
                note="decoder with a KV cache: inputs input_ids, attention_mask (past + new), "
                     "position_ids, past_key_values.N.key/value; outputs logits, "
                     "present.N.key/value; cases prefill (past 0, new 8), decode_p7_n1, "
                     "decode_p5_n3"))

    def vit_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        return {"pixel_values": float_input(rng, B, 3, 32, 32)}

    for impl in ("eager", "sdpa"):
        specs.append(ModelSpec(
            f"vit_{impl}", "vit", f"transformers.ViTModel (attn_implementation={impl!r})",
            (lambda i=impl: hf_model("vit", i)), vit_inputs,
            {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}},
            ["last_hidden_state"], 2, [], uses_sdpa=(impl == "sdpa"), hf_impl=impl))

    def s2s_inputs(rng, B=BATCH, L=SEQ, LQ=SEQ_Q):
        return {"input_ids": token_ids(rng, B, L), "attention_mask": padding_mask(B, L),
                "decoder_input_ids": token_ids(rng, B, LQ)}

    for impl in ("eager", "sdpa"):
        specs.append(ModelSpec(
            f"bart_{impl}", "bart", f"transformers.BartModel (attn_implementation={impl!r})",
            (lambda i=impl: hf_model("bart", i)), s2s_inputs,
            {"input_ids": {0: "batch", 1: "encoder_sequence"},
             "attention_mask": {0: "batch", 1: "encoder_sequence"},
             "decoder_input_ids": {0: "batch", 1: "decoder_sequence"},
             "last_hidden_state": {0: "batch", 1: "decoder_sequence"}},
            ["last_hidden_state"], 6, ["cross", "causal", "padding-mask"],
            uses_sdpa=(impl == "sdpa"), hf_impl=impl,
            note="2 encoder self-attention, 2 decoder causal self-attention, 2 cross-attention blocks"))
    return specs


# --------------------------------------------------------------------------------------------
# Seeding, noise, references
# --------------------------------------------------------------------------------------------


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


@torch.no_grad()
def perturb_constant_params(model: nn.Module, gen: torch.Generator, scale: float = 0.05) -> list[str]:
    """Add seeded noise to every parameter whose elements are all equal (biases initialised to 0,
    norm weights to 1): otherwise a fused op that drops a bias would still match PyTorch."""
    touched = []
    for name, p in model.named_parameters():
        if p.numel() > 1 and bool(torch.all(p == p.reshape(-1)[0])):
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
            touched.append(name)
    return touched


def torch_outputs(model: nn.Module, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*[torch.from_numpy(v) for v in feeds.values()])
    if isinstance(out, torch.Tensor):
        out = (out,)
    return [o.detach().cpu().numpy() for o in out]


# --------------------------------------------------------------------------------------------
# Exporting
# --------------------------------------------------------------------------------------------


@dataclass
class ExportJob:
    exporter: str  # "ts" | "dynamo"
    opset: int | None  # None = the exporter's default

    @property
    def suffix(self) -> str:
        if self.exporter == "dynamo" and self.opset is not None:
            return f"dynamo.opset{self.opset}"
        return self.exporter


def jobs_for(spec: ModelSpec) -> list[ExportJob]:
    jobs = [ExportJob("ts", TS_OPSET), ExportJob("dynamo", None)]
    if spec.uses_sdpa:
        # At opset 23 the dynamo exporter maps scaled_dot_product_attention to the standard
        # Attention op: those files are what attnrt's Attention parser must run natively.
        jobs.append(ExportJob("dynamo", 23))
    return jobs


def export_once(spec: ModelSpec, model: nn.Module, feeds: dict[str, np.ndarray], job: ExportJob,
                tmp: Path) -> Path:
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    path = tmp / "model.onnx"
    input_names = list(feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if job.exporter == "ts":
            torch.onnx.export(
                model, args, str(path), dynamo=False, opset_version=job.opset,
                input_names=input_names, output_names=spec.outputs,
                dynamic_axes={k: v for k, v in spec.dynamic.items()}, do_constant_folding=True,
            )
        else:
            # String dim names become Dim.DYNAMIC and are used as the ONNX dim_param names.
            dyn = tuple(spec.dynamic.get(n) for n in input_names)
            if spec.varargs_from is not None:
                # forward(a, b, c, *past): the *args tuple is one nested entry of dynamic_shapes.
                k = spec.varargs_from
                dyn = dyn[:k] + (dyn[k:],)
            kwargs = {}
            if job.opset is not None:
                kwargs["opset_version"] = job.opset
            torch.onnx.export(
                model, args, str(path), dynamo=True, input_names=input_names,
                output_names=spec.outputs, dynamic_shapes=dyn, external_data=False,
                report=False, verbose=False, **kwargs,
            )
    return path


ANSI = __import__("re").compile(r"\x1b\[[0-9;]*m")


def error_line(e: BaseException) -> str:
    """One line naming the root cause: exporters wrap the real error (a shape guard, a
    decomposition failure) in a generic ConversionError whose own first line says little."""
    chain = [e]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    parts = []
    for x in (chain[0], chain[-1]) if len(chain) > 1 else (chain[0],):
        text = ANSI.sub("", str(x)).strip()
        first = next((l for l in text.splitlines() if l.strip()), "")
        if "Status Message:" in first and len(first) > 300:
            # ORT puts the whole C++ signature in the message; keep the node and the verdict.
            head, _, tail = first.partition("Status Message:")
            first = f"{head}Status Message: ...{tail[-200:]}"
        parts.append(f"{type(x).__name__}: {first}")
    return " <- ".join(parts)[:600]


def uses_external_data(model: onnx.ModelProto) -> bool:
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return True
    return False


def max_abs_diff(ref: dict[str, np.ndarray], names: list[str], outs: list[np.ndarray]) -> float:
    """max |ref - out| over all outputs; inf when an output is missing or has another shape."""
    worst = 0.0
    for name, o in zip(names, outs):
        r = ref.get(name)
        if r is None or r.shape != o.shape:
            return float("inf")
        worst = max(worst, float(np.max(np.abs(r.astype(np.float64) - o))))
    return worst


def run_ort(path: Path, feeds: dict[str, np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    so = ort.SessionOptions()
    # Check the exported graph as written, not ORT's own fused rewrite of it.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4  # errors are reported through the exception
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise RuntimeError(f"ORT session wants inputs {missing} that the model spec does not have")
    outs = sess.run(None, {n: feeds[n] for n in names})
    return [o.name for o in sess.get_outputs()], outs


# --------------------------------------------------------------------------------------------
# Graph analysis: attention blocks, variant tags, node sequences
# --------------------------------------------------------------------------------------------


class GraphIndex:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        g = model.graph
        self.nodes = list(g.node)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.nodes:
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.initializers = {t.name: t for t in g.initializer}
        self.graph_inputs = {i.name for i in g.input}
        self.order = {id(n): k for k, n in enumerate(self.nodes)}

    def const_value(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        p = self.producer.get(name)
        if p is not None and p.op_type == "Constant":
            for a in p.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name == "value_float":
                    return np.array(a.f, dtype=np.float32)
                if a.name == "value_int":
                    return np.array(a.i, dtype=np.int64)
                if a.name == "value_ints":
                    return np.array(list(a.ints), dtype=np.int64)
                if a.name == "value_floats":
                    return np.array(list(a.floats), dtype=np.float32)
        return None

    def is_projection(self, n: onnx.NodeProto) -> bool:
        """A MatMul/Gemm whose weight is an initializer: the edge of an attention block."""
        if n.op_type not in ("MatMul", "Gemm"):
            return False
        return any(i in self.initializers or self.const_value(i) is not None and
                   self.const_value(i).ndim >= 2 for i in n.input[1:2])

    def attr(self, n: onnx.NodeProto, name: str):
        for a in n.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return None


def fmt_const(v: np.ndarray) -> str:
    if v.size <= 8:
        flat = v.reshape(-1).tolist()
        if v.dtype.kind == "f":
            flat = [float(f"{x:.6g}") for x in flat]
        body = ",".join(str(x) for x in flat)
        return f"const{list(v.shape) if v.ndim else ''}[{body}]" if v.ndim else f"const({body})"
    return f"const{list(v.shape)}:{v.dtype}"


def fmt_attrs(n: onnx.NodeProto) -> str:
    parts = []
    for a in n.attribute:
        if n.op_type == "Constant":
            continue
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        if isinstance(v, onnx.TensorProto):
            v = fmt_const(numpy_helper.to_array(v))
        if isinstance(v, float):
            v = float(f"{v:.6g}")
        parts.append(f"{a.name}={v}")
    return "{" + ", ".join(parts) + "}" if parts else ""


def block_nodes(gi: GraphIndex, sm: onnx.NodeProto, depth: int = 14) -> list[onnx.NodeProto]:
    """Nodes of the attention block around Softmax ``sm``: backwards from the softmax (scores, mask,
    scale, Q/K head split incl. run-time shape computations) and forwards to the context MatMul,
    the head merge and up to the output projection.  Stops at projections and graph inputs."""
    seen: dict[int, onnx.NodeProto] = {}

    def back(tensor: str, d: int):
        p = gi.producer.get(tensor)
        if p is None or id(p) in seen or d < 0:
            return
        seen[id(p)] = p
        if gi.is_projection(p) or p.op_type == "Constant":
            return
        for i in p.input:
            if i:
                back(i, d - 1)

    def fwd(n: onnx.NodeProto, d: int):
        for o in n.output:
            for c in gi.consumers.get(o, []):
                if id(c) in seen or d < 0:
                    continue
                seen[id(c)] = c
                for i in c.input:
                    if i and i not in n.output:
                        back(i, depth // 2)
                if gi.is_projection(c):
                    continue
                fwd(c, d - 1)

    seen[id(sm)] = sm
    # A Softmax's scores, or every input (Q, K, V, mask, ...) of an Attention op.
    for i in (sm.input[:1] if sm.op_type == "Softmax" else sm.input):
        if i:
            back(i, depth)
    fwd(sm, 8)
    return sorted(seen.values(), key=lambda n: gi.order[id(n)])


def describe_nodes(gi: GraphIndex, nodes: list[onnx.NodeProto]) -> list[str]:
    """One line per node: `op_type {attrs}  inputs -> outputs`, constants shown inline."""
    short: dict[str, str] = {}

    def nm(t: str) -> str:
        if not t:
            return "_"
        v = gi.const_value(t)
        if v is not None and (v.size <= 8):
            return fmt_const(v)
        if t in gi.initializers:
            return f"W{list(gi.initializers[t].dims)}"
        if t not in short:
            short[t] = f"t{len(short)}" if t not in gi.graph_inputs else f"${t}"
        return short[t]

    lines = []
    for n in nodes:
        if n.op_type == "Constant":
            continue
        ins = ", ".join(nm(i) for i in n.input)
        outs = ", ".join(nm(o) for o in n.output)
        lines.append(f"{n.op_type:<10} {fmt_attrs(n)}  {ins} -> {outs}".replace("  ", " ", 0))
    return lines


def chain_back(gi: GraphIndex, tensor: str, stop=("MatMul",), limit: int = 8) -> list[onnx.NodeProto]:
    """Follow the data path from ``tensor`` backwards through elementwise ops to the first node
    whose op_type is in ``stop``; at binary ops follow the input that is not a constant and,
    if both are computed, the one that leads to ``stop`` sooner."""
    out = []
    t = tensor
    for _ in range(limit):
        p = gi.producer.get(t)
        if p is None:
            break
        out.append(p)
        if p.op_type in stop:
            break
        cands = [i for i in p.input if i and gi.const_value(i) is None and i in gi.producer]
        if not cands:
            break

        def dist(x, k=0):
            q = gi.producer.get(x)
            if q is None or k > 6:
                return 99
            if q.op_type in stop:
                return k
            return min([dist(i, k + 1) for i in q.input if i] or [99])

        t = min(cands, key=dist)
    return out


def analyse(model: onnx.ModelProto) -> dict:
    """Find the attention blocks (Softmax nodes whose input chain starts at a MatMul and whose
    output feeds a MatMul, and Attention-type ops) and classify each."""
    gi = GraphIndex(model)
    blocks = []
    tags: set[str] = set()
    for n in gi.nodes:
        if n.op_type in ("Attention", "MultiHeadAttention", "GroupQueryAttention"):
            b = {"node": n.name, "op": n.op_type, "attrs": fmt_attrs(n)}
            blocks.append(b)
            tags.add("attention-op")
            if gi.attr(n, "is_causal"):
                tags.add("causal")
            if len(n.input) > 3 and n.input[3]:
                tags.add("attn-mask-input")
            continue
        if n.op_type != "Softmax":
            continue
        back = chain_back(gi, n.input[0])
        if not back or back[-1].op_type != "MatMul":
            continue
        qk = back[-1]
        between = back[:-1]  # nodes from softmax input back to (excluding) the QK MatMul
        ops = [b.op_type for b in between]
        info = {"node": n.name, "op": "Softmax", "axis": gi.attr(n, "axis"),
                "scores_chain": list(reversed(ops))}
        scale = None
        for b in between:
            if b.op_type in ("Div", "Mul"):
                c = [gi.const_value(i) for i in b.input]
                c = [v for v in c if v is not None and v.size == 1]
                if c:
                    val = float(c[0].reshape(-1)[0])
                    scale = f"{b.op_type.lower()}-scale" if val != 1.0 else "mul-one"
                    info["scale_value"] = val
                else:
                    # A computed scalar (e.g. from Sqrt(Shape)) counts as a scale too.
                    scale = f"{b.op_type.lower()}-scale-runtime"
        # Scale applied to Q and/or K before the QK MatMul (SDPA exports): Mul(Q, s), Mul(Kt, s).
        pre = {}
        for idx, inp in enumerate(qk.input[:2]):
            p = gi.producer.get(inp)
            hops = 0
            while p is not None and p.op_type in ("Transpose", "Reshape") and hops < 4:
                p = gi.producer.get(p.input[0])
                hops += 1
            if p is not None and p.op_type in ("Mul", "Div"):
                consts = [gi.const_value(i) for i in p.input]
                val = next((float(v.reshape(-1)[0]) for v in consts if v is not None and v.size == 1), None)
                if val is None:
                    other = [gi.producer.get(i) for i in p.input if i != inp]
                    val = "runtime:" + "/".join(o.op_type for o in other if o is not None)
                pre["q" if idx == 0 else "k"] = f"{p.op_type.lower()} {val}"
        if pre:
            scale = "split-scale" if len(pre) == 2 else f"{next(iter(pre))}-scale"
            info["pre_matmul_scale"] = pre
            if any("runtime" in v for v in pre.values()):
                tags.add("runtime-scale")
        info["scale"] = scale or "noscale"
        tags.add(info["scale"])
        if "Add" in ops:
            tags.add("additive-mask")
        if "Where" in ops:
            tags.add("where-mask")
        # K's path from its projection to the QK MatMul: layout ops only (scale Muls skipped).
        k_path = []
        t = qk.input[1]
        for _ in range(10):
            p = gi.producer.get(t)
            if p is not None and p.op_type == "Concat" and any(
                    i in gi.graph_inputs for i in p.input):
                # The key/value cache: Concat(past_key_values.N.key, new K) on the sequence axis.
                k_path.append(f"Concat[axis={gi.attr(p, 'axis')}](past)")
                tags.add("kv-cache-concat")
                break
            if p is None or p.op_type not in ("Transpose", "Reshape", "Mul", "Div", "Expand",
                                                "Unsqueeze", "Squeeze"):
                break
            if p.op_type == "Transpose":
                k_path.append(f"Transpose{list(gi.attr(p, 'perm') or [])}")
            elif p.op_type != "Mul" and p.op_type != "Div":
                k_path.append(p.op_type)
            data = [i for i in p.input if i and gi.const_value(i) is None]
            if not data:
                break
            t = data[0]
        info["k_path"] = list(reversed(k_path))
        if "Transpose[0, 2, 3, 1]" in k_path:
            tags.add("k-transpose-merged")
        elif "Transpose[0, 1, 3, 2]" in k_path:
            tags.add("k-transpose-second")
        elif "Transpose[0, 2, 1]" in k_path:
            tags.add("k-transpose-3d")
        # Forward: what sits between Softmax and the context MatMul.
        f = []
        t = n.output[0]
        for _ in range(6):
            cs = gi.consumers.get(t, [])
            if not cs:
                break
            if any(c.op_type == "IsNaN" for c in cs):
                # SDPA's fully-masked-row guard: Where(IsNaN(p), 0, p).
                f.append("IsNaN+Where")
                tags.add("nan-guard")
                w = [c for c in cs if c.op_type == "Where"]
                if len(w) != 1:
                    break
                t = w[0].output[0]
                continue
            if len(cs) > 1:
                f.append("(fan-out:" + ",".join(c.op_type for c in cs) + ")")
                break
            c = cs[0]
            f.append(c.op_type)
            if c.op_type == "MatMul":
                break
            t = c.output[0]
        info["after_softmax"] = f
        if "Cast" in f:
            tags.add("softmax-cast")
        blocks.append(info)
    for n in gi.nodes:
        if n.op_type == "Reshape" and len(n.input) > 1 and gi.const_value(n.input[1]) is None:
            tags.add("dynamic-reshape")
        if n.op_type == "Expand":
            tags.add("expand")
        if n.op_type == "Trilu":
            tags.add("trilu")
    return {
        "blocks": blocks,
        "graph_tags": sorted(tags),
        "softmax_nodes": sum(1 for n in gi.nodes if n.op_type == "Softmax"),
        "attention_ops": sum(1 for n in gi.nodes if n.op_type in
                             ("Attention", "MultiHeadAttention", "GroupQueryAttention")),
        "node_count": len(gi.nodes),
        "op_histogram": dict(sorted(
            {op: sum(1 for n in gi.nodes if n.op_type == op)
             for op in {n.op_type for n in gi.nodes}}.items())),
    }


def pattern_dump(model: onnx.ModelProto) -> list[str]:
    """The node listing of the first attention block (Softmax or Attention op)."""
    gi = GraphIndex(model)
    for n in gi.nodes:
        if n.op_type in ("Softmax", "Attention"):
            if n.op_type == "Softmax":
                back = chain_back(gi, n.input[0])
                if not back or back[-1].op_type != "MatMul":
                    continue
            return describe_nodes(gi, block_nodes(gi, n))
    return []


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def dims_of(vi: onnx.ValueInfoProto) -> list:
    out = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(d.dim_param if d.HasField("dim_param") else d.dim_value)
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class SavedCase:
    """One saved input case of a model and PyTorch's outputs on it (keys = graph names)."""

    name: str
    feeds: dict[str, np.ndarray]
    ref: dict[str, np.ndarray]
    inputs_npz: str
    outputs_npz: str


def saved_cases(spec: ModelSpec, model: nn.Module, rng: np.random.Generator) -> list[SavedCase]:
    """Draw the model's input cases, run PyTorch on each and write the npz files: one case
    ``default`` as ``<model>.inputs.npz``/``.outputs.npz``, or, for specs with ``cases``,
    ``<model>.<case>.inputs.npz``/``.outputs.npz`` per case."""
    if spec.cases is None:
        drawn = [("default", spec.inputs(rng))]
    else:
        drawn = spec.cases(rng)
    out = []
    for name, feeds in drawn:
        stem = spec.name if spec.cases is None else f"{spec.name}.{name}"
        ref = dict(zip(spec.outputs, torch_outputs(model, feeds)))
        case = SavedCase(name, feeds, ref, f"{stem}.inputs.npz", f"{stem}.outputs.npz")
        np.savez(MODELS_DIR / case.inputs_npz, **feeds)
        np.savez(MODELS_DIR / case.outputs_npz, **ref)
        out.append(case)
    return out


def check_cases(dest: Path, cases: list[SavedCase], export_case: SavedCase, export_max: float,
                max_diff: float) -> tuple[list[dict], str | None]:
    """Run ``dest`` in ONNX Runtime on every saved case.  Returns the manifest's ``cases``
    entries and the reason to drop the file (a case that differs from PyTorch, or that ORT
    refuses although none of its inputs has a zero-sized dim), or None.  A case ORT refuses
    because of an empty tensor (the prefill's past of length 0) is recorded, not dropped: the
    file is still right for the other cases and other runtimes may accept it."""
    entries, error = [], None
    for c in cases:
        e = {"name": c.name, "inputs_npz": c.inputs_npz, "outputs_npz": c.outputs_npz,
             "input_shapes": {k: list(v.shape) for k, v in c.feeds.items()}}
        if c is export_case:
            e["ort_vs_torch_max_abs"] = export_max
        else:
            try:
                names, outs = run_ort(dest, c.feeds)
                d = max_abs_diff(c.ref, names, outs)
                e["ort_vs_torch_max_abs"] = d
                if not d <= max_diff and error is None:
                    error = f"case {c.name}: max abs diff {d:.3g} > {max_diff}"
            except Exception as ex:
                e["ort_error"] = error_line(ex)
                empty = any(0 in v.shape for v in c.feeds.values())
                if not empty and error is None:
                    error = f"case {c.name}: ORT failed: {e['ort_error']}"
        entries.append(e)
    return entries, error


def export_model(spec: ModelSpec, args, manifest: list, failures: list, patterns: dict) -> None:
    seed = seed_of(spec.name)
    seed_everything(seed)
    model = spec.build()
    model.eval()
    impl = hf_attn_impl(model)
    if spec.hf_impl is not None and impl != spec.hf_impl:
        raise RuntimeError(f"{spec.name}: asked for attn_implementation={spec.hf_impl!r}, "
                           f"transformers gave {impl!r}")
    gen = torch.Generator().manual_seed(seed + 1)
    perturbed = perturb_constant_params(model, gen)
    rng = np.random.default_rng(seed + 2)
    cases = saved_cases(spec, model, rng)
    export_case = next(c for c in cases if c.name == (spec.export_case or "default"))
    feeds, ref_by_name = export_case.feeds, export_case.ref
    alt_feeds = spec.inputs(np.random.default_rng(seed + 3), 3, 13, 5)
    alt_ref_by_name = dict(zip(spec.outputs, torch_outputs(model, alt_feeds)))
    alt_shapes = {k: list(v.shape) for k, v in alt_feeds.items()}
    params = sum(p.numel() for p in model.parameters())
    print(f"== {spec.name}: {params} parameters, {len(perturbed)} constant params perturbed"
          + (f", attn_implementation={impl}" if impl else ""), flush=True)

    for job in jobs_for(spec):
        fname = f"{spec.name}.{job.suffix}.onnx"
        dest = MODELS_DIR / fname
        entry_base = {"file": fname, "model": spec.name, "exporter":
                      "torchscript" if job.exporter == "ts" else "dynamo"}
        with tempfile.TemporaryDirectory(prefix="attnrt-export-") as td:
            try:
                path = export_once(spec, model, feeds, job, Path(td))
                m = onnx.load(str(path), load_external_data=True)
            except Exception as e:  # exporter failures are data for the manifest
                msg = error_line(e)
                print(f"   {fname}: EXPORT FAILED: {msg}", flush=True)
                if args.verbose:
                    traceback.print_exc()
                failures.append({**entry_base, "stage": "export", "error": msg[:500]})
                dest.unlink(missing_ok=True)
                continue
        # One self-contained file: weights inline, no side files.
        for t in m.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                raise RuntimeError(f"{fname}: initializer {t.name} still external after load")
        # No machine paths in what is committed: the dynamo exporter's stack traces name the
        # checkout and the venv (models/metadata_paths.py).
        metadata_paths.scrub_model(m)
        onnx.save_model(m, str(dest), save_as_external_data=False)
        try:
            onnx.checker.check_model(str(dest), full_check=True)
            checker = "ok"
        except Exception as e:
            checker = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        try:
            out_names, outs = run_ort(dest, feeds)
        except Exception as e:
            msg = error_line(e)
            print(f"   {fname}: ORT FAILED: {msg}", flush=True)
            failures.append({**entry_base, "stage": "onnxruntime", "error": msg[:500]})
            dest.unlink()
            continue
        max_abs = max_abs_diff(ref_by_name, out_names, outs)
        case_entries, case_error = check_cases(dest, cases, export_case, max_abs, args.max_diff)
        if not max_abs <= args.max_diff or case_error is not None:
            why = case_error or f"max abs diff {max_abs:.3g} > {args.max_diff}"
            print(f"   {fname}: DROPPED, ORT vs PyTorch: {why}", flush=True)
            failures.append({**entry_base, "stage": "ort-vs-torch", "error": why})
            dest.unlink()
            continue
        # The same export on other batch/sequence sizes: the declared dynamic axes must really be
        # dynamic (a traced constant shape would pass the first check and fail here).
        try:
            alt_names, alt_outs = run_ort(dest, alt_feeds)
            alt_max = max_abs_diff(alt_ref_by_name, alt_names, alt_outs)
            alt_error = None if alt_max <= args.max_diff else f"max abs diff {alt_max:.3g}"
        except Exception as e:
            alt_max, alt_error = None, error_line(e)
        if alt_error is not None:
            print(f"   {fname}: other shapes {alt_shapes}: {alt_error}", flush=True)
        info = analyse(m)
        opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
        size = dest.stat().st_size
        if size > 2 * 1024 * 1024:
            print(f"   WARNING {fname} is {size / 1e6:.1f} MB", flush=True)
        tags = sorted(set(spec.tags) | set(info["graph_tags"]))
        entry = {
            **entry_base,
            "opset": opset,
            "opset_imports": {o.domain or "ai.onnx": o.version for o in m.opset_import},
            "source": spec.source,
            "family": spec.family,
            "attn_implementation": impl,
            "size_bytes": size,
            "sha256": sha256(dest),
            "inputs": [{"name": n, "dtype": str(feeds[n].dtype), "shape": list(feeds[n].shape)}
                       for n in (i.name for i in m.graph.input)],
            "outputs": [{"name": o.name, "shape": list(ref_by_name[o.name].shape),
                         "dtype": str(ref_by_name[o.name].dtype)} for o in m.graph.output],
            "dynamic_dims": {vi.name: {str(k): d for k, d in enumerate(dims_of(vi)) if isinstance(d, str)}
                             for vi in list(m.graph.input) + list(m.graph.output)},
            "graph_shapes": {vi.name: dims_of(vi) for vi in list(m.graph.input) + list(m.graph.output)},
            "inputs_npz": export_case.inputs_npz,
            "outputs_npz": export_case.outputs_npz,
            "cases": case_entries,
            "attention_blocks": spec.attention_blocks,
            "softmax_nodes": info["softmax_nodes"],
            "attention_ops": info["attention_ops"],
            "node_count": info["node_count"],
            "tags": tags,
            "semantic_tags": sorted(spec.tags),
            "graph_tags": info["graph_tags"],
            "blocks": info["blocks"],
            "checker": checker,
            "ort_vs_torch_max_abs": max_abs,
            "other_shapes_check": {"inputs": alt_shapes, "ort_vs_torch_max_abs": alt_max,
                                   "ok": alt_error is None, **({"error": alt_error} if alt_error else {})},
            "external_data": False,
        }
        if spec.note:
            entry["note"] = spec.note
        if alt_error is not None:
            entry["warning_dynamic"] = (f"declares dynamic dims but fails on inputs {alt_shapes}: "
                                        f"{alt_error} (the exporter baked the example shapes in)")
        found = info["softmax_nodes"] if info["attention_ops"] == 0 else info["attention_ops"]
        attn_like = len(info["blocks"])
        if attn_like != spec.attention_blocks:
            entry["warning"] = (f"expected {spec.attention_blocks} attention blocks, analysis found "
                                f"{attn_like} ({info['softmax_nodes']} Softmax, "
                                f"{info['attention_ops']} Attention ops)")
        manifest.append(entry)
        patterns[fname] = (entry, pattern_dump(m))
        print(f"   {fname}: {size / 1024:.0f} KiB opset {opset} blocks {attn_like}/{spec.attention_blocks}"
              f" softmax {info['softmax_nodes']} attn-ops {info['attention_ops']} "
              f"max|ort-torch| {max_abs:.2e} checker {checker} tags {','.join(tags)}", flush=True)
        if len(case_entries) > 1:
            print("      cases: " + ", ".join(
                f"{c['name']} " + (f"{c['ort_vs_torch_max_abs']:.2e}" if "ort_vs_torch_max_abs" in c
                                   else f"ORT error: {c['ort_error']}") for c in case_entries),
                flush=True)
        _ = found

    if spec.name == "mha_seed":
        write_external_data_example(spec, manifest, patterns)


def write_external_data_example(spec: ModelSpec, manifest: list, patterns: dict) -> None:
    """The one deliberate external-data model: mha_seed.ts re-saved with the weight matrices in
    `mha_seed.ts.extdata.onnx.data` (tensors >= 1 KiB) and the biases left inline."""
    src = MODELS_DIR / "mha_seed.ts.onnx"
    if not src.exists():
        return
    m = onnx.load(str(src))
    dest = MODELS_DIR / "mha_seed.ts.extdata.onnx"
    data_name = "mha_seed.ts.extdata.onnx.data"
    (MODELS_DIR / data_name).unlink(missing_ok=True)
    onnx.save_model(m, str(dest), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name, size_threshold=1024, convert_attribute=False)
    # onnx writes the side file 0600; make it as readable as the .onnx next to it.
    os.chmod(MODELS_DIR / data_name, 0o644)
    onnx.checker.check_model(str(dest), full_check=True)
    feeds = dict(np.load(MODELS_DIR / f"{spec.name}.inputs.npz"))
    ref = dict(np.load(MODELS_DIR / f"{spec.name}.outputs.npz"))
    names, outs = run_ort(dest, feeds)
    max_abs = max(float(np.max(np.abs(ref[n] - o))) for n, o in zip(names, outs))
    base = next(e for e in manifest if e["file"] == "mha_seed.ts.onnx")
    reloaded = onnx.load(str(dest), load_external_data=False)
    ext = [t.name for t in reloaded.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    inline = [t.name for t in reloaded.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    entry = {**base, "file": dest.name, "size_bytes": dest.stat().st_size, "sha256": sha256(dest),
             "external_data": True, "external_data_file": data_name,
             "external_data_bytes": (MODELS_DIR / data_name).stat().st_size,
             "external_initializers": ext, "inline_initializers": inline,
             "ort_vs_torch_max_abs": max_abs,
             "note": "deliberate external-data example: mha_seed.ts.onnx with tensors >= 1 KiB in "
                     f"{data_name}"}
    manifest.append(entry)
    print(f"   {dest.name}: external data {data_name} ({len(ext)} external, {len(inline)} inline), "
          f"max|ort-torch| {max_abs:.2e}", flush=True)


PATTERNS_INTRO = """\
# What the exporters emit around each attention Softmax

Generated by `python models/export.py` (do not edit by hand; edit `PATTERNS_INTRO` in the
script).  For every shipped file: the data path from the QK MatMul to the Softmax, what follows
the Softmax, the scale and the K transposition the analysis found.  Then, for one file per
model family and exporter, the full node listing of the first attention block: from the Q/K/V
projections (MatMul/Gemm with a weight initializer, not listed past that) through the head split,
scores, scale, mask, softmax, context MatMul and head merge, including the run-time shape
computations (Shape -> Gather -> Unsqueeze -> Concat) that feed dynamic Reshapes.

Notation: `$name` is a graph input, `W[dims]` an initializer, `const[shape][values]` a small
constant (initializer or Constant node) shown by value, `tN` an intermediate tensor.
"""


# Observations written by hand after reading the generated listings (torch 2.15, transformers
# 5.23); re-read them when the versions move.
PATTERNS_NOTES = """\
## Observations (by hand)

What the fusion rules must accept, read off the listings below (torch 2.15, transformers 5.23):

- **Q/K/V projections.** `MatMul(x, W[in,out]) → Add(bias)`; TorchScript writes the Add as
  `Add(bias, mm)` (bias first), dynamo as `Add(mm, bias)`.  GPT-2 (Conv1D = addmm) flattens to
  2-D and uses `Gemm` then `Reshape` back to 3-D in both exporters; nn.MultiheadAttention's
  out projection is a `Gemm` with transB=1.  LLaMA and `mha_gqa` have no biases.
- **Head split.** `Reshape(proj, [B, L, H, Dh]) → Transpose[0,2,1,3]`.  The Reshape target is
  a run-time `Concat`: TorchScript builds it per tensor as `Shape → Gather(0) → Unsqueeze →
  Concat(·, -1, H, Dh)` (three separate copies for Q, K, V, `allowzero=0`); dynamo builds it
  once from `Shape{start,end}` slices and shares it (`allowzero=1`).  `-1` appears for the
  sequence when the module wrote `view(B, -1, H, Dh)`.  ViT's dynamo export has a constant
  target `[-1, 17, 4, 16]` (sequence is static there).
- **K transposition**, three forms: one `Transpose[0,2,3,1]` straight from the Reshape (both
  exporters for `k.transpose(1,2)` followed by `k.transpose(-2,-1)`; TorchScript merges them);
  `Transpose[0,2,1,3]` then `Transpose[0,1,3,2]` (LLaMA-style, where repeat_kv sits between);
  and, in every **dynamo SDPA** export, `Transpose[0,2,1,3] → Reshape(-1, L, Dh) →
  Transpose[0,2,1] → Reshape(B, H, Dh, L)` — K^T is taken on a 3-D view with two run-time
  shapes built by `Shape → Slice → Concat`.
- **Scale.** Hand-written `/ math.sqrt(d)` → `Div(scores, 4.0)`; `* (1/sqrt(d))` and all eager
  transformers models → `Mul(scores, 0.25)` after the QK MatMul.  SDPA → split scale before the
  MatMul: `Mul(Q, √s)` and `Mul(Kᵀ, √s)` — dynamo folds √s to a constant (0.5 here), TorchScript
  computes it at run time: `Shape(Q) → Slice[-1:] → Cast → Sqrt → Div(1, ·) → Cast → Sqrt`,
  then one Sqrt per side.  nn.MultiheadAttention with need_weights=True scales Q only
  (`Mul(q, 0.25)` before a 3-D `MatMul`/bmm).  T5: no scale; TorchScript keeps a `Mul(·, 1.0)`,
  dynamo drops it; T5 with sdpa passes `scale=1.0` so TorchScript emits `Mul(Q, 1.0)`,
  `Mul(K, 1.0)`.
- **Masks.** Padding masks from transformers arrive as a precomputed additive float tensor:
  a bool tensor built from the 2-D attention_mask (Range/LessOrEqual/And/GatherND or Expand)
  and `Where(bool, 0, -3.4028e38)` (finfo.min, not -inf), added with `Add(scores, mask)`
  after the scale.  The causal triangle is folded into that same tensor (GPT-2, LLaMA, BART
  decoder): there is no `is_causal` to see, only an additive mask of shape [B, 1, Lq, Lk].
  Hand-written `masked_fill(mask == 0, -1e9)` → `Equal(mask, 0) → Cast(bool) →
  Where(cond, -1e9, scores)` (scores as the *else* branch, after the Div).  The nanoGPT-style tril buffer → `Slice(W[1,1,128,128], :L, :L) →
  Equal(0) → Where(cond, -inf, scores)`.  `F.sdpa(is_causal=True)` → `Expand(1.0, [L, L]) →
  Trilu(upper=0) → Equal(0) → Where(-3.4e38 / 0)` then `Add`.  A bool `attn_mask` given to
  F.sdpa → `Where(mask, 0, -inf)` then `Add`.  T5 adds two tensors: `Add(Add(scores,
  position_bias), mask)` in both exporters (TorchScript after a `Mul(·, 1.0)`).
  ViT (dynamo, eager and sdpa) adds an all-zero "mask" `Where(Expand(const true), 0, finfo.min)`
  although the model has no mask: a rule must accept an additive mask that is a constant.
- **After Softmax.** Usually straight into the context `MatMul`.  SDPA exports with a mask add
  the fully-masked-row guard `Where(IsNaN(p), 0, p)` (Softmax output has two consumers: IsNaN
  and Where).  TorchScript keeps dtype round trips: `Softmax → Cast(float)` (GPT-2),
  `Softmax → Cast → Cast` (ViT, LLaMA, `mha_gqa`); dynamo removes them.
- **GQA (LLaMA, mha_gqa).** K and V each go `Unsqueeze(2) → Expand([B, Hkv, n_rep, L, Dh]) →
  Reshape([B, Hq, L, Dh])` between the head split and the MatMuls; RoPE (`Mul cos`, `Slice`,
  `Neg`, `Concat`, `Mul sin`, `Add`) sits on Q and K between the head-split Transpose and the
  repeat.
- **Packed QKV.** One `MatMul(x, W[64,192])` then `Split(axis=2, [64,64,64])` (TorchScript,
  GPT-2) or `Split(num_outputs=3)` (dynamo, opset 18+).  nn.MultiheadAttention (TorchScript)
  goes `Reshape(·, [B, L, 3, 64]) → Unsqueeze(0) → Transpose[3,1,2,0,4] → Squeeze(3) →
  Gather(0|1|2)` and works seq-first on 3-D `[B·H, L, Dh]` tensors.
- **Static shapes.** TorchScript exports of nn.MultiheadAttention and
  nn.TransformerEncoderLayer bake the example sequence length into Reshape targets
  (`Concat(const 10, …)`); they declare dynamic axes but fail on other shapes (see
  `other_shapes_check` in manifest.json).  All other files were re-run in ORT at batch 3 /
  sequence 13 (cross: Lq 5, Lk 13) and match PyTorch there.
- **Attention op (dynamo, opset 23).** Emitted for F.scaled_dot_product_attention only, with
  **4-D** Q/K/V `[B, H, L, Dh]` (after the head-split Transposes, no q_num_heads/kv_num_heads),
  `scale` set when the caller passed one (transformers does), `is_causal=1` only for
  `is_causal=True` with no mask; transformers models pass their additive mask as input 3 and
  `is_causal=0`.  ORT 1.31 rejects an `attn_mask` whose second-to-last dim is 1 (a
  `[B,1,1,L]` padding mask): "inconsistent q_sequence_length" — a fused node meant for ORT must
  expand the mask to `[.., Lq, Lk]`.  For LLaMA at opset 23 the exporter also emits
  `RotaryEmbedding`, which ORT rejects for these shapes.

### Decoders with a key/value cache (`gpt2_cache_*`, `llama_cache_*`)

- **Cache Concat.** Per layer `Concat{axis=-2}(past_key_values.N.key, K_new)` and the same for V,
  in both exporters; the Concat's output *is* the graph output `present.N.key` / `.value` (it
  also feeds attention).  K_new comes straight from the head-split `Transpose[0,2,1,3]` (GPT-2)
  or after RoPE's `Add` (LLaMA); V always from the head split.  Everything after the cache works
  on past + new keys: K's transposition (`Transpose[0,1,3,2]` in TorchScript, the 3-D
  `Reshape → Transpose[0,2,1] → Reshape` in dynamo SDPA) and the GQA repeat come after the
  Concat, so the fused node must take past and new K/V and still produce `present`.
- **Causal mask with a past (bottom-right).** Built once per model from run-time lengths and
  shared by all layers: past = `Shape(past_key_values.0.key)` → `Gather(2)` (TorchScript) or
  `Shape{start=2,end=3}` → `Squeeze` of *whichever* past tensor dynamo picked for that symbol
  (`past_key_values.0.value`, `past_key_values.1.key`, ...; batch may come from another one);
  cache_position = `Range(0, S) + past`, kv index = `Range(0, past + S)`;
  `LessOrEqual(kv[None,None,None,:], cache_position[None,None,:,None])`: query i sees keys
  j ≤ past + i, the bottom-right alignment of the ONNX `Attention` op's `is_causal` with
  `past_key`.  It is `And`ed with the padding mask gathered from `attention_mask` (TorchScript:
  `Flatten` + `Gather` at batch·len + kv; dynamo: `GatherND` with broadcast batch indices),
  `Expand`ed to `[B, 1, S, past + S]` and turned into `Where(mask, 0, -3.4028e38)` (finfo.min),
  then added to the scores after the scale (`Add(Mul(QKᵀ, 0.25), mask)`; SDPA: after the split
  scale).  There is no `is_causal=1` anywhere: the dynamo opset-23 `Attention` gets this float
  mask as input 3 with `is_causal=0`.
- **Symbolic lengths: Shape/Gather/Where.** TorchScript builds every run-time `Expand` target
  (the mask's and repeat_kv's) as `Concat(dims) → Reshape(-1) → Where(Equal(t, -1),
  ConstantOfShape(1), t)` (torch's `expand(-1)` convention), with dims from `Shape → Gather`;
  total length = `Add(Gather(Shape(past), 2), Gather(Shape(x), 1))`.  Dynamo reads dims with
  `Shape{start,end}` slices and computes `Add(new, past)` once; its Reshape/Expand targets are
  `Concat`s of those and constants (`Concat(B, 2, 2, past + S, 16)`).  The graph declares
  `past_sequence` on past inputs; the presents are `total_sequence` (TorchScript) or
  `past_sequence + sequence` (dynamo).
- **GQA with a cache (LLaMA).** The cache holds the 2 KV heads; the repeat to 4 comes after the
  cache Concat: `Unsqueeze(2) → Expand([B, 2, 2, past + S, 16]) → Reshape([B, 4, past + S,
  16])`, for K and V, in every export (opset 23 too: its `Attention` gets the repeated 4-head
  K/V, `past_key`/`past_value` inputs unused).
- **Rest of the decoder.** position_ids is an input; RoPE's cos/sin come from it (`Cast →
  Mul(inv_freq) → Concat → Cos/Sin`) once per model.  After Softmax: `Cast` (GPT-2 TorchScript),
  `Cast → Cast` (LLaMA TorchScript), `IsNaN`/`Where` (SDPA).  LLaMA at opset 23 emits
  `RotaryEmbedding` and `RMSNormalization`; with a cache and explicit position_ids ONNX Runtime
  runs them (unlike `llama_sdpa.dynamo.opset23` without a cache).  All exports run in ONNX
  Runtime with an empty past (past length 0).
"""


def write_patterns(patterns: dict) -> None:
    lines = [PATTERNS_INTRO, PATTERNS_NOTES, "", "## Summary per file (first attention block)", "",
             "| file | blocks | QK MatMul → Softmax | scale | K path (projection → MatMul) | Softmax → context MatMul |",
             "|---|---|---|---|---|---|"]
    for fname, (entry, _) in patterns.items():
        for b in entry["blocks"][:1]:
            if b["op"] != "Softmax":
                lines.append(f"| {fname} | {b['op']} ×{entry['attention_ops']} | — | — | — | {b['attrs']} |")
                continue
            chain = " → ".join(["MatMul"] + b["scores_chain"] + ["Softmax"])
            sc = b["scale"]
            if "scale_value" in b:
                sc += f" {b['scale_value']:.6g}"
            if "pre_matmul_scale" in b:
                sc += " (" + ", ".join(f"{k}: {v}" for k, v in b["pre_matmul_scale"].items()) + ")"
            lines.append(f"| {fname} | {len(entry['blocks'])} | {chain} | {sc} | "
                         f"{' → '.join(b.get('k_path', []))} | {' → '.join(b['after_softmax'])} |")
    lines += ["", "## Node listings (first attention block)", ""]
    for fname, (entry, dump) in patterns.items():
        if not dump:
            continue
        lines += [f"### {fname}", "", f"{entry['source']}; opset {entry['opset']}; "
                  f"tags: {', '.join(entry['tags'])}", "", "```"] + dump + ["```", ""]
    (MODELS_DIR / "PATTERNS.md").write_text("\n".join(lines))


def manifest_table(doc: dict) -> str:
    """The markdown table of models/README.md, from manifest.json."""
    rows = ["| file | KiB | exporter | opset | attention blocks (found/expected) | variant tags "
            "| max abs ORT−PyTorch (all cases) | other shapes |", "|---|---:|---|---:|---|---|---:|---|"]
    for e in doc["models"]:
        kind = "Attention op" if e["attention_ops"] else "Softmax"
        ok = "ok" if e["other_shapes_check"]["ok"] else "**static**"
        diffs = [c["ort_vs_torch_max_abs"] for c in e.get("cases", []) if "ort_vs_torch_max_abs" in c]
        worst = max(diffs + [e["ort_vs_torch_max_abs"]])
        refused = [c["name"] for c in e.get("cases", []) if "ort_error" in c]
        rows.append(f"| {e['file']} | {e['size_bytes'] / 1024:.0f} | {e['exporter']} | {e['opset']} | "
                    f"{len(e['blocks'])}/{e['attention_blocks']} ({kind}) | {', '.join(e['tags'])} | "
                    f"{worst:.1e}{' (ORT refused ' + ', '.join(refused) + ')' if refused else ''} | {ok} |")
    rows += ["", "| file | stage | error |", "|---|---|---|"]
    for f in doc["failures"]:
        err = f["error"] if len(f["error"]) <= 200 else "…" + f["error"][-200:]
        rows.append(f"| {f['file']} | {f['stage']} | {err.replace('|', '/')} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[],
                    help="export only models whose name contains this (repeatable); the manifest "
                         "keeps the other models' existing entries")
    ap.add_argument("--list", action="store_true", help="list model names and exit")
    ap.add_argument("--max-diff", type=float, default=1e-4,
                    help="drop exports whose ORT output differs from PyTorch by more (default 1e-4)")
    ap.add_argument("--verbose", action="store_true", help="print exporter tracebacks")
    ap.add_argument("--table", action="store_true",
                    help="print the README table from manifest.json and exit (exports nothing)")
    args = ap.parse_args()
    if args.table:
        print(manifest_table(json.loads((MODELS_DIR / "manifest.json").read_text())))
        return 0

    specs = model_specs()
    if args.list:
        for s in specs:
            print(f"{s.name:24} {s.source}")
        return 0
    selected = [s for s in specs if not args.only or any(o in s.name for o in args.only)]
    if not selected:
        print(f"no model matches {args.only}", file=sys.stderr)
        return 2

    # nn.MultiheadAttention / TransformerEncoderLayer have a fused "fast path" in eval mode that
    # bypasses the decomposed ops; exporters trace the decomposed path only when it is off.
    torch.backends.mha.set_fastpath_enabled(False)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    manifest_path = MODELS_DIR / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    names = {s.name for s in selected}
    # Entries (and files) of the other export scripts (models/optimum_export.py) are kept.
    others = [e for e in old.get("models", []) if e.get("generated_by", THIS) != THIS]
    others_prefixes = tuple(e["model"] + "." for e in others)
    manifest = [e for e in old.get("models", []) if e["model"] not in names] if args.only else others
    failures = [f for f in old.get("failures", []) if f["model"] not in names] if args.only else []
    if not args.only:
        for p in [*MODELS_DIR.glob("*.onnx*"), *MODELS_DIR.glob("*.npz")]:
            if not p.name.startswith(others_prefixes):
                p.unlink()
    patterns: dict = {}
    for spec in selected:
        if args.only:
            for p in MODELS_DIR.glob(f"{spec.name}.*"):
                if p.suffix in (".onnx", ".npz", ".data"):
                    p.unlink()
        try:
            export_model(spec, args, manifest, failures, patterns)
        except Exception as e:
            msg = error_line(e)
            print(f"== {spec.name}: FAILED before export: {msg}", flush=True)
            if args.verbose:
                traceback.print_exc()
            failures.append({"file": None, "model": spec.name, "exporter": None, "stage": "build",
                             "error": msg[:500]})

    order = {s.name: k for k, s in enumerate(specs)}
    manifest.sort(key=lambda e: (order.get(e["model"], 999), e["file"]))
    failures.sort(key=lambda f: (order.get(f["model"], 999), f["file"] or ""))
    import transformers

    doc = {
        "generated_by": THIS,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__, "onnxruntime": ort.__version__,
                     "numpy": np.__version__},
        "tolerance_note": "ort_vs_torch_max_abs: max |ONNX Runtime (CPU, graph optimizations off) "
                          "- PyTorch| over all outputs on the saved inputs",
        "models": manifest,
        "failures": failures,
        **{k: v for k, v in old.items() if k == "optimum_versions"},
    }
    manifest_path.write_text(json.dumps(doc, indent=1) + "\n")
    if not args.only:
        write_patterns(patterns)
    total = sum(p.stat().st_size for p in MODELS_DIR.iterdir() if p.is_file())
    print(f"\n{len(manifest)} model files, {len(failures)} failures, models/ holds {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
