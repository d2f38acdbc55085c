#!/usr/bin/env python3
"""Models as people download them: exported by optimum (Hugging Face's exporter), not by
torch.onnx.export directly. The sibling of ``models/export.py`` for that tool chain (issue 25).

Run by hand, in a venv with optimum-onnx (it pins transformers 4.57, so not export.py's venv;
torch can be shared through a .pth file pointing at another venv's site-packages)::

    python3 -m venv ../optimum-venv && ../optimum-venv/bin/pip install optimum-onnx onnxruntime
    ../optimum-venv/bin/python models/optimum_export.py

Models (seeded random weights from a tiny config; nothing downloaded):

* ``whisper_optimum``: ``WhisperForConditionalGeneration`` (d_model 64, 2 + 2 layers, 4 heads,
  16 mel bins, vocabulary 100), ``optimum-cli export onnx --task
  automatic-speech-recognition-with-past``. Shipped: ``whisper_optimum.decoder.onnx`` (no past:
  the self-attention cache and the cross-attention keys/values as outputs) and
  ``whisper_optimum.decoder_with_past.onnx`` (self-attention cache in, cross-attention keys and
  values computed once by the first step and fed as inputs), and
  ``whisper_optimum.decoder_merged.onnx``, both in the two branches of one ``If`` on the input
  ``use_cache_branch`` (a case per branch), and ``whisper_optimum.encoder.onnx`` (optimum's
  ``encoder_model.onnx`` of the same export: 16 mel bins × 3000 frames in, 1500 positions out;
  one case of batch 1). ``whisper_optimum.greedy.npz`` holds PyTorch's greedy tokens for the
  pair (encoder once, then the decoder with its cache, argmax; ``greedy_reference``): a batch of
  two rows, the encoder case's features scaled by ``scales`` (1 and 0.5), each row with its own
  ``decoder_start_ids``; ``attnrt generate``'s tests compare with them.

* ``bart_optimum`` and ``t5_optimum``: text-to-text encoder–decoders, their encoder and merged
  decoder with cases and greedy tokens (``models/optimum_seq2seq.py``).

* ``llama_cache_optimum``: ``LlamaForCausalLM`` (hidden 64, 2 layers, 4 query / 2 KV heads,
  vocabulary 100), ``--task text-generation-with-past``: optimum 2's one decoder file with its
  cache (no merged file any more), whose mask axis is named ``past_sequence_length +
  sequence_length``.

Each file gets saved cases (inputs, and PyTorch's outputs) and a manifest entry in export.py's
schema, marked ``"generated_by": "models/optimum_export.py"``; export.py keeps such entries and
their files when it rewrites the manifest. Every case is run in ONNX Runtime (graph
optimizations off) against PyTorch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

MODELS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(MODELS_DIR))
from export import analyse, dims_of, sha256  # noqa: E402  (after the path above)
from metadata_paths import scrub_model  # noqa: E402
import optimum_seq2seq  # noqa: E402

GENERATED_BY = "models/optimum_export.py"
SOURCES = {
    "whisper_optimum": "transformers.WhisperForConditionalGeneration via optimum-cli export onnx "
                       "--task automatic-speech-recognition-with-past",
    "llama_cache_optimum": "transformers.LlamaForCausalLM via optimum-cli export onnx --task "
                           "text-generation-with-past",
    **optimum_seq2seq.SOURCES,
}
LAYERS, HEADS, HEAD = 2, 4, 16


def whisper(dest: Path) -> Path:
    """The tiny Whisper, saved as a transformers checkpoint under `dest`."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(25)
    # init_std 0.4, not 0.02: with transformers' default the tiny decoder barely reads the
    # encoder (its greedy tokens are the same for any features), so no test could see a lost
    # cross-attention cache
    cfg = WhisperConfig(
        vocab_size=100, num_mel_bins=16, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, d_model=HEADS * HEAD,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=1500,
        max_target_positions=64, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, init_std=0.4,
    )
    model = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # LayerNorms start at 1 and 0: move them off the trivial values
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.05 * torch.randn_like(p))
    path = dest / "whisper_tiny_random"
    model.save_pretrained(path)
    return path


def optimum_export(checkpoint: Path, out: Path, task: str) -> None:
    subprocess.run(
        ["optimum-cli", "export", "onnx", "--model", str(checkpoint), "--task", task, str(out)],
        check=True,
    )


def torch_decoder(model, ids, encoder_states, past=None):
    """PyTorch's logits and caches for one decoder step: `past` is per layer (self k, self v,
    cross k, cross v) or None (the first step computes the cross-attention keys and values)."""
    from transformers.cache_utils import EncoderDecoderCache

    cache = EncoderDecoderCache.from_legacy_cache(past) if past is not None else None
    with torch.no_grad():
        out = model.model.decoder(input_ids=torch.from_numpy(ids),
                                  encoder_hidden_states=torch.from_numpy(encoder_states),
                                  past_key_values=cache, use_cache=True)
        logits = model.proj_out(out.last_hidden_state)
    legacy = out.past_key_values.to_legacy_cache()
    return logits.numpy(), [[t.numpy() for t in layer] for layer in legacy]


def cases(model, rng: np.random.Generator) -> dict[str, list[tuple[str, dict, dict]]]:
    """Per shipped file, its cases: (name, inputs, PyTorch's outputs by output name)."""
    batch, enc = 2, 12
    states = rng.standard_normal((batch, enc, HEADS * HEAD)).astype(np.float32)
    prompt = rng.integers(3, 100, (batch, 4)).astype(np.int64)
    logits, layers = torch_decoder(model, prompt, states)
    first = {"logits": logits}
    for i, (sk, sv, ck, cv) in enumerate(layers):
        first |= {f"present.{i}.decoder.key": sk, f"present.{i}.decoder.value": sv,
                  f"present.{i}.encoder.key": ck, f"present.{i}.encoder.value": cv}
    step_ids = rng.integers(3, 100, (batch, 1)).astype(np.int64)
    feeds = {"input_ids": step_ids}
    for i, (sk, sv, ck, cv) in enumerate(layers):
        feeds |= {f"past_key_values.{i}.decoder.key": sk, f"past_key_values.{i}.decoder.value": sv,
                  f"past_key_values.{i}.encoder.key": ck, f"past_key_values.{i}.encoder.value": cv}
    logits, after = torch_decoder(model, step_ids, states, past=tuple(tuple(map(torch.from_numpy, l)) for l in layers))
    second = {"logits": logits}
    for i, (sk, sv, _, _) in enumerate(after):
        second |= {f"present.{i}.decoder.key": sk, f"present.{i}.decoder.value": sv}
    # The merged decoder takes every input of both, and `use_cache_branch`: on the first step
    # the past inputs are read by nothing (empty here); later, its cross-attention presents are
    # empty placeholders (not compared).
    empty = {k: np.zeros((batch, HEADS, 0 if ".decoder." in k else enc, HEAD), np.float32)
             for k in feeds if k.startswith("past_key_values")}
    merged_first = {"input_ids": prompt, "encoder_hidden_states": states, **empty,
                    "use_cache_branch": np.array([False])}
    merged_later = {**feeds, "encoder_hidden_states": states, "use_cache_branch": np.array([True])}
    return {
        "decoder": [("prefill", {"input_ids": prompt, "encoder_hidden_states": states}, first)],
        "decoder_with_past": [("decode_p4_n1", feeds, second)],
        "decoder_merged": [("prefill", merged_first, first),
                           ("decode_p4_n1", merged_later, second)],
    }


def encoder_case(model, rng: np.random.Generator) -> list[tuple[str, dict, dict]]:
    """The encoder's case: one row of log-mel features (3000 frames, as Whisper requires)."""
    features = rng.standard_normal((1, 16, 3000)).astype(np.float32)
    with torch.no_grad():
        states = model.model.encoder(torch.from_numpy(features)).last_hidden_state.numpy()
    return [("case", {"input_features": features}, {"last_hidden_state": states})]


def greedy_reference(model, features: np.ndarray, start: np.ndarray, steps: int) -> np.ndarray:
    """PyTorch's greedy tokens, `[batch, steps]`: the encoder once, then `steps` decoder steps,
    each on the cache of the one before (the cross-attention keys and values of the first)."""
    with torch.no_grad():
        states = model.model.encoder(torch.from_numpy(features)).last_hidden_state.numpy()
    ids, past, tokens = start, None, []
    for _ in range(steps):
        logits, layers = torch_decoder(model, ids, states, past)
        ids = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
        tokens.append(ids)
        past = tuple(tuple(map(torch.from_numpy, layer)) for layer in layers)
    return np.concatenate(tokens, axis=1)


def save_greedy(model, features: np.ndarray) -> None:
    """`whisper_optimum.greedy.npz` (see the module docs); the tokens must depend on the encoder's
    states, or a generation that lost the cross-attention cache would pass."""
    scales = np.array([1.0, 0.5], np.float32)
    batch = np.concatenate([features * s for s in scales]).astype(np.float32)
    start = np.array([[1, 5, 7], [1, 9, 7]], np.int64)
    tokens = greedy_reference(model, batch, start, 12)
    assert not np.array_equal(tokens, greedy_reference(model, 0 * batch, start, 12))
    assert not np.array_equal(tokens[0], tokens[1])
    np.savez(MODELS_DIR / "whisper_optimum.greedy.npz", scales=scales, decoder_start_ids=start,
             tokens=tokens)
    print(f"whisper_optimum greedy tokens: {tokens.tolist()}")


def llama(dest: Path) -> Path:
    """The tiny LLaMA-style decoder (grouped-query attention), saved under `dest`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(26)
    cfg = LlamaConfig(vocab_size=100, hidden_size=HEADS * HEAD, intermediate_size=128,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
                      max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.05 * torch.randn_like(p))
    path = dest / "llama_tiny_random"
    model.save_pretrained(path)
    return path


def llama_cases(model, rng: np.random.Generator) -> list[tuple[str, dict, dict]]:
    """A left-padded prefill of two prompts (3 and 5 tokens), then one decode step."""
    from transformers.cache_utils import DynamicCache

    def run(ids, mask, positions, past):
        cache = DynamicCache.from_legacy_cache(past) if past else DynamicCache()
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                        position_ids=torch.from_numpy(positions), past_key_values=cache,
                        use_cache=True)
        layers = [[t.numpy() for t in layer] for layer in out.past_key_values.to_legacy_cache()]
        outputs = {"logits": out.logits.numpy()}
        for i, (k, v) in enumerate(layers):
            outputs |= {f"present.{i}.key": k, f"present.{i}.value": v}
        return outputs, layers

    def feeds(ids, mask, positions, layers):
        f = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        for i, (k, v) in enumerate(layers):
            f |= {f"past_key_values.{i}.key": k, f"past_key_values.{i}.value": v}
        return f

    ids = rng.integers(3, 100, (2, 5)).astype(np.int64)
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=np.int64)
    positions = np.maximum(mask.cumsum(-1) - 1, 0) * mask + (1 - mask)
    empty = [[np.zeros((2, 2, 0, HEAD), np.float32)] * 2 for _ in range(LAYERS)]
    first, layers = run(ids, mask, positions, None)
    step = rng.integers(3, 100, (2, 1)).astype(np.int64)
    mask2 = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    pos2 = positions[:, -1:] + 1
    second, _ = run(step, mask2, pos2, tuple(tuple(map(torch.from_numpy, l)) for l in layers))
    return [("prefill", feeds(ids, mask, positions, empty), first),
            ("decode_p5_n1", feeds(step, mask2, pos2, layers), second)]


def max_diff(path: Path, inputs: dict, want: dict) -> float:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(None, inputs)))
    return max(float(np.abs(got[k] - v).max()) for k, v in want.items())


def softmaxes(g: onnx.GraphProto) -> int:
    """Softmax nodes of `g` and of every subgraph in it (a merged decoder's If branches): one
    attention block each here."""
    return sum((n.op_type == "Softmax") + sum(softmaxes(a.g) for a in n.attribute if a.HasField("g"))
               for n in g.node)


def entry(name: str, path: Path, case_list: list, diffs: list[float], semantic: list[str]) -> dict:
    """The manifest entry of `path`, in export.py's schema; every Softmax is one attention block
    (self- and cross-attention alike, in the main graph or in an If branch)."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    a = analyse(model)
    _, first_inputs, first_outputs = case_list[0]
    cases_json = [{"name": c, "inputs_npz": f"{name}.{c}.inputs.npz",
                   "outputs_npz": f"{name}.{c}.outputs.npz",
                   "input_shapes": {k: list(v.shape) for k, v in inp.items()},
                   "ort_vs_torch_max_abs": d}
                  for (c, inp, _), d in zip(case_list, diffs)]
    values = [*model.graph.input, *model.graph.output]
    return {
        "file": path.name, "model": name, "exporter": "optimum",
        "generated_by": GENERATED_BY,
        "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "source": SOURCES[name.split(".")[0]],
        "family": name.split("_")[0], "attn_implementation": None,
        "size_bytes": path.stat().st_size, "sha256": sha256(path),
        "inputs": [{"name": k, "dtype": str(v.dtype), "shape": list(v.shape)}
                   for k, v in first_inputs.items()],
        "outputs": [{"name": k, "dtype": str(v.dtype), "shape": list(v.shape)}
                    for k, v in first_outputs.items()],
        "dynamic_dims": {vi.name: {str(k): d for k, d in enumerate(dims_of(vi)) if isinstance(d, str)}
                         for vi in values},
        "graph_shapes": {vi.name: dims_of(vi) for vi in values},
        "inputs_npz": cases_json[0]["inputs_npz"], "outputs_npz": cases_json[0]["outputs_npz"],
        "cases": cases_json,
        "attention_blocks": softmaxes(model.graph),
        "softmax_nodes": a["softmax_nodes"],
        "attention_ops": a["attention_ops"],
        "node_count": a["node_count"],
        "tags": sorted(set(semantic) | set(a["graph_tags"])),
        "semantic_tags": sorted(semantic),
        "graph_tags": a["graph_tags"],
        "blocks": a["blocks"],
        "checker": "ok",
        "ort_vs_torch_max_abs": max(diffs),
        "external_data": False,
    }


def main() -> int:
    import transformers
    from transformers import WhisperForConditionalGeneration

    manifest_path = MODELS_DIR / "manifest.json"
    doc = json.loads(manifest_path.read_text())
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = whisper(Path(tmp))
        out = Path(tmp) / "onnx"
        optimum_export(checkpoint, out, "automatic-speech-recognition-with-past")
        model = WhisperForConditionalGeneration.from_pretrained(checkpoint).eval()
        exported = {"decoder": "decoder_model", "decoder_with_past": "decoder_with_past_model",
                    "decoder_merged": "decoder_model_merged", "encoder": "encoder_model"}
        per_file = {f"whisper_optimum.{part}": (out / f"{exported[part]}.onnx", c)
                    for part, c in cases(model, np.random.default_rng(25)).items()}
        encoder = encoder_case(model, np.random.default_rng(27))
        per_file["whisper_optimum.encoder"] = (out / "encoder_model.onnx", encoder)
        save_greedy(model, encoder[0][1]["input_features"])
        from transformers import LlamaForCausalLM

        checkpoint = llama(Path(tmp))
        optimum_export(checkpoint, Path(tmp) / "llama", "text-generation-with-past")
        model = LlamaForCausalLM.from_pretrained(checkpoint).eval()
        per_file["llama_cache_optimum"] = (Path(tmp) / "llama" / "model.onnx",
                                           llama_cases(model, np.random.default_rng(26)))
        for build, name, seed in [(optimum_seq2seq.bart, "bart_optimum", 28),
                                  (optimum_seq2seq.t5, "t5_optimum", 29)]:
            per_file |= optimum_seq2seq.export(build, name, Path(tmp), optimum_export,
                                               MODELS_DIR, seed)
        for name, (exported, case_list) in per_file.items():
            dest = MODELS_DIR / f"{name}.onnx"
            onnx_model = onnx.load(str(exported))
            scrub_model(onnx_model)
            onnx.save(onnx_model, str(dest))
            diffs = []
            for case, inputs, want in case_list:
                np.savez(MODELS_DIR / f"{name}.{case}.inputs.npz", **inputs)
                np.savez(MODELS_DIR / f"{name}.{case}.outputs.npz", **want)
                diffs.append(max_diff(dest, inputs, want))
                print(f"{dest.name} {case}: ONNX Runtime vs PyTorch max |diff| {diffs[-1]:.3e}")
                assert diffs[-1] < 1e-4, f"{dest.name} {case} differs from PyTorch"
            padded = ["padding-mask"] if name.startswith(("bart", "t5")) else []
            semantic = (["causal", "kv-cache", "gqa", "padding-mask"] if "llama" in name else
                        padded if "encoder" in name else
                        ["causal", "cross-attention", *padded]
                        + (["kv-cache"] if "past" in name else []))
            entries.append(entry(name, dest, case_list, diffs, semantic))
    files = {e["file"] for e in entries}
    doc["models"] = [e for e in doc["models"] if e["file"] not in files] + entries
    import optimum

    doc.setdefault("optimum_versions", {}).update(
        {"optimum": getattr(optimum, "__version__", "?"), "transformers": transformers.__version__,
         "torch": torch.__version__, "onnxruntime": ort.__version__})
    manifest_path.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
