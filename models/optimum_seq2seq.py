"""Text-to-text encoder–decoders exported by optimum (``--task text2text-generation-with-past``),
for ``models/optimum_export.py`` (issue 25 item 4): tiny seeded BART and T5 (d_model 64,
2 + 2 layers, 4 heads of 16, vocabulary 100).

Shipped per model (``bart_optimum``, ``t5_optimum``): the encoder (``encoder_model.onnx``:
``input_ids`` and ``attention_mask`` in, ``last_hidden_state`` out) and the merged decoder
(``decoder_model_merged.onnx``: both caches, ``encoder_attention_mask``, one ``If`` on
``use_cache_branch``), with cases: the encoder on a batch of two rows whose second is padded on
the right, the merged decoder's first step and one later step on its states. And
``<name>.greedy.npz``: PyTorch's greedy tokens for that batch (``input_ids``,
``attention_mask``, ``decoder_start_ids``, ``tokens``): the encoder once, then the decoder on
its own cache, argmax.

The weights are initialised wider than transformers' default (BART ``init_std`` 0.2, T5
``initializer_factor`` 2): with the default the tiny decoders' greedy tokens hardly depend on
the encoder, and a test could not see a lost cross-attention cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

HEADS, HEAD, LAYERS = 4, 16, 2
SOURCES = {
    "bart_optimum": "transformers.BartForConditionalGeneration via optimum-cli export onnx --task "
                    "text2text-generation-with-past",
    "t5_optimum": "transformers.T5ForConditionalGeneration via optimum-cli export onnx --task "
                  "text2text-generation-with-past",
}
TASK = "text2text-generation-with-past"


def bart(dest: Path) -> tuple[Path, list[list[int]]]:
    """The tiny BART saved under `dest`, and its decoder start ids per row."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(28)
    cfg = BartConfig(vocab_size=100, d_model=HEADS * HEAD, encoder_layers=LAYERS,
                     decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                     decoder_attention_heads=HEADS, encoder_ffn_dim=128, decoder_ffn_dim=128,
                     max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                     decoder_start_token_id=2, forced_eos_token_id=None, init_std=0.2)
    path = dest / "bart_tiny_random"
    BartForConditionalGeneration(cfg).eval().save_pretrained(path)
    return path, [[2, 5], [2, 9]]


def t5(dest: Path) -> tuple[Path, list[list[int]]]:
    """The tiny T5 saved under `dest`, and its decoder start ids per row."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(29)
    cfg = T5Config(vocab_size=100, d_model=HEADS * HEAD, d_kv=HEAD, d_ff=128, num_layers=LAYERS,
                   num_decoder_layers=LAYERS, num_heads=HEADS, relative_attention_num_buckets=8,
                   relative_attention_max_distance=20, decoder_start_token_id=0, pad_token_id=0,
                   eos_token_id=1, initializer_factor=2.0)
    path = dest / "t5_tiny_random"
    T5ForConditionalGeneration(cfg).eval().save_pretrained(path)
    return path, [[0, 5], [0, 9]]


def encode(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.get_encoder()(input_ids=torch.from_numpy(ids),
                                   attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()


def step(model, ids, states, mask, past=None):
    """PyTorch's logits and cache (per layer: self k, self v, cross k, cross v) for one decoder
    step on the encoder's `states`; `past` None on the first step."""
    from transformers.cache_utils import EncoderDecoderCache

    cache = (EncoderDecoderCache.from_legacy_cache(tuple(tuple(map(torch.from_numpy, l))
                                                         for l in past))
             if past is not None else None)
    with torch.no_grad():
        out = model(encoder_outputs=(torch.from_numpy(states),),
                    attention_mask=torch.from_numpy(mask), decoder_input_ids=torch.from_numpy(ids),
                    past_key_values=cache, use_cache=True)
    return out.logits.numpy(), [[t.numpy() for t in layer]
                                for layer in out.past_key_values.to_legacy_cache()]


def greedy(model, ids, mask, start: np.ndarray, steps: int) -> np.ndarray:
    """PyTorch's greedy tokens `[batch, steps]`: the encoder once, then the decoder's loop."""
    states = encode(model, ids, mask)
    fed, past, tokens = start, None, []
    for _ in range(steps):
        logits, past = step(model, fed, states, mask, past)
        fed = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
        tokens.append(fed)
    return np.concatenate(tokens, axis=1)


def presents(layers, cross: bool = True) -> dict:
    out = {}
    for i, (sk, sv, ck, cv) in enumerate(layers):
        out |= {f"present.{i}.decoder.key": sk, f"present.{i}.decoder.value": sv}
        if cross:
            out |= {f"present.{i}.encoder.key": ck, f"present.{i}.encoder.value": cv}
    return out


def pasts(layers) -> dict:
    out = {}
    for i, layer in enumerate(layers):
        for (part, kind), t in zip([("decoder", "key"), ("decoder", "value"),
                                    ("encoder", "key"), ("encoder", "value")], layer):
            out[f"past_key_values.{i}.{part}.{kind}"] = t
    return out


def cases(model, start: list[list[int]], rng: np.random.Generator) -> dict:
    """Per shipped part, its cases (name, inputs, PyTorch's outputs); and the greedy record."""
    batch, enc = 2, 7
    ids = rng.integers(3, 100, (batch, enc)).astype(np.int64)
    mask = np.ones((batch, enc), np.int64)
    mask[1, 5:] = 0  # the second row is 5 tokens, padded on the right
    states = encode(model, ids, mask)
    prompt = np.array(start, np.int64)
    logits, layers = step(model, prompt, states, mask)
    later_ids = rng.integers(3, 100, (batch, 1)).astype(np.int64)
    later_logits, after = step(model, later_ids, states, mask, layers)
    empty = {k: np.zeros((batch, HEADS, 0 if ".decoder." in k else enc, HEAD), np.float32)
             for k in pasts(layers)}
    shared = {"encoder_attention_mask": mask, "encoder_hidden_states": states}
    first = {"input_ids": prompt, **shared, **empty, "use_cache_branch": np.array([False])}
    later = {"input_ids": later_ids, **shared, **pasts(layers), "use_cache_branch": np.array([True])}
    tokens = greedy(model, ids, mask, prompt, 12)
    # the tokens must depend on the encoder's input, or a lost cross cache would pass
    assert not np.array_equal(tokens, greedy(model, ids[:, ::-1].copy(), mask, prompt, 12))
    record = {"input_ids": ids, "attention_mask": mask, "decoder_start_ids": prompt,
              "tokens": tokens}
    return {
        "encoder": [("case", {"input_ids": ids, "attention_mask": mask},
                     {"last_hidden_state": states})],
        "decoder_merged": [("prefill", first, {"logits": logits, **presents(layers)}),
                           ("decode_p2_n1", later,
                            {"logits": later_logits, **presents(after, cross=False)})],
    }, record


def export(build, name: str, tmp: Path, optimum_export, models_dir: Path, seed: int) -> dict:
    """Builds, exports and records model `name`: its shipped parts as optimum_export.py's
    per_file entries (file exported, cases), and `<name>.greedy.npz` written."""
    from transformers import AutoModelForSeq2SeqLM

    checkpoint, start = build(tmp)
    out = tmp / f"{name}_onnx"
    optimum_export(checkpoint, out, TASK)
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint).eval()
    per_part, record = cases(model, start, np.random.default_rng(seed))
    np.savez(models_dir / f"{name}.greedy.npz", **record)
    print(f"{name} greedy tokens: {record['tokens'].tolist()}")
    exported = {"encoder": "encoder_model", "decoder_merged": "decoder_model_merged"}
    return {f"{name}.{part}": (out / f"{exported[part]}.onnx", c) for part, c in per_part.items()}
