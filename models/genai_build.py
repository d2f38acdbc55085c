#!/usr/bin/env python3
"""Build onnxruntime-genai's model of export_large.py's LLaMA-style decoder, same weights.

The generation benchmark (``benches/python/genai_vs_attnrt.py``, issue 26) compares
``attnrt generate`` on the TorchScript export of ``llama_gqa_cache_eager`` (125 M parameters:
hidden 768, 12 layers, 12 query / 4 KV heads, vocab 32000) with onnxruntime-genai running the
model its own builder makes from the same weights.  This script makes that second model, outside
the repository::

    # a venv with onnxruntime-genai, torch, transformers and onnx (the torch venv's packages
    # can be reached through a .pth file)
    python models/export_large.py --out ../genai-bench --only llama_gqa_cache_eager \\
        --exporter ts --no-optimize
    python models/genai_build.py --out ../genai-bench

It rebuilds the model exactly as export_large.py does (its seed, its constant-parameter noise),
saves it as a transformers folder (``<out>/llama_gqa_hf``) with a placeholder word-level
``tokenizer.json`` (token ``t<i>`` for id i: the builder wants a tokenizer beside the weights, and
the benchmark feeds token ids, never text), and runs
``python -m onnxruntime_genai.models.builder -p fp32 -e cpu`` into ``<out>/llama_gqa_genai``.
Its ``genai_config.json`` gets ``--threads`` intra-op threads.  Last, it checks that the two
files agree: greedy tokens of onnxruntime-genai against a plain ONNX Runtime loop over the
TorchScript export, for one seeded prompt.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export as small  # noqa: E402
import export_large as large  # noqa: E402

SPEC = "llama_gqa_cache_eager"


def rebuilt_model() -> torch.nn.Module:
    """The transformers model of export_large.py's spec, weights as its export has them."""
    spec = next(s for s in large.specs() if s.name == SPEC)
    seed = small.seed_of(spec.name)
    small.seed_everything(seed)
    wrapper = large.build(spec).eval()
    small.perturb_constant_params(wrapper, torch.Generator().manual_seed(seed + 1))
    return wrapper.model


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer.json whose token i is ``t<i>``, and its tokenizer_config.json."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "t0", "eos_token": "t1",
         "unk_token": "t0", "model_max_length": 2048}))


def set_threads(genai_dir: Path, threads: int) -> None:
    path = genai_dir / "genai_config.json"
    cfg = json.loads(path.read_text())
    opts = cfg["model"]["decoder"].setdefault("session_options", {})
    opts["intra_op_num_threads"] = threads
    opts["inter_op_num_threads"] = 1
    path.write_text(json.dumps(cfg, indent=2))


def genai_greedy(genai_dir: Path, ids: np.ndarray, new: int) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(genai_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + new, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    out = []
    for _ in range(new):
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def ort_greedy(onnx_path: Path, ids: np.ndarray, new: int) -> list[int]:
    """A plain ONNX Runtime loop over the TorchScript export (the file attnrt runs)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    past = {i.name: np.zeros((1, 4, 0, 64), np.float32)
            for i in sess.get_inputs() if i.name.startswith("past_key_values")}
    feed_ids, out, total = ids, [], ids.shape[1]
    for _ in range(new):
        start = total - feed_ids.shape[1]
        feeds = {"input_ids": feed_ids, "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.arange(start, total, dtype=np.int64)[None], **past}
        res = sess.run(None, feeds)
        token = int(res[0][0, -1].argmax())
        out.append(token)
        names = [o.name for o in sess.get_outputs()][1:]
        past = {n.replace("present", "past_key_values"): v for n, v in zip(names, res[1:])}
        feed_ids, total = np.array([[token]], np.int64), total + 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the folder export_large.py wrote into")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check-tokens", type=int, default=16)
    args = ap.parse_args()
    out = Path(args.out)
    hf_dir, genai_dir = out / "llama_gqa_hf", out / "llama_gqa_genai"
    model = rebuilt_model()
    model.save_pretrained(str(hf_dir))
    write_tokenizer(hf_dir, model.config.vocab_size)
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir),
                    "-o", str(genai_dir), "-p", "fp32", "-e", "cpu"], check=True)
    set_threads(genai_dir, args.threads)
    ids = small.token_ids(np.random.default_rng(7), 1, 32)
    genai = genai_greedy(genai_dir, ids, args.check_tokens)
    ort_tokens = ort_greedy(out / f"{SPEC}.ts.onnx", ids, args.check_tokens)
    same = genai == ort_tokens
    print(json.dumps({"genai": genai, "onnxruntime": ort_tokens, "equal": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
