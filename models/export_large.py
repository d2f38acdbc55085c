#!/usr/bin/env python3
"""Export realistic-size transformer models (seeded random weights) for whole-model benchmarks.

The sibling of ``models/export.py`` for sizes that must never enter the repository (each file is
0.4-4.4 GB).  Run by hand, in the torch venv, into a folder outside the repo::

    python models/export_large.py --out ../large-models                   # everything
    python models/export_large.py --out DIR --only bert_base --exporter ts  # a subset
    python models/export_large.py --list

Models (batch 1 inputs; vocabularies and sizes of the real checkpoints, weights random):

* ``bert_base_eager``, ``bert_base_sdpa``: BertModel, hidden 768, 12 layers, 12 heads,
  intermediate 3072, vocab 30522 -> ``last_hidden_state``; cases ``seq128``, ``seq512``.
* ``gpt2_small_eager``: GPT2Model (768, 12 layers, 12 heads, vocab 50257), no cache ->
  ``last_hidden_state``; cases ``seq128``, ``seq512``.
* ``gpt2_small_cache_eager``: GPT2LMHeadModel with its key/value cache (inputs and outputs as
  in export.py's ``gpt2_cache_*``: ``past_key_values.N.key/value`` in, ``logits`` and
  ``present.N.key/value`` out).
* ``llama_gqa_cache_eager``: LlamaForCausalLM of GPT-2-small size with grouped-query attention
  (hidden 768, 12 layers, 12 query heads, 4 KV heads of 64, intermediate 2048, vocab 32000), with
  its cache.
  Cache models' cases: ``prefill128`` and ``prefill512`` (past 0), ``decode_p127_n1`` and
  ``decode_p511_n1`` (one new token after a cache of 127 / 511: the per-token step).
* ``--sdpa-decoders`` adds ``gpt2_small_sdpa``, ``gpt2_small_cache_sdpa``,
  ``llama_gqa_cache_sdpa``.
* ``tinyllama_1b_cache_eager`` (only when ``--only`` names it): LlamaForCausalLM of
  TinyLlama-1.1B's sizes (hidden 2048, 22 layers, 32 query / 4 KV heads of 64, intermediate 5632,
  vocab 32000: 1,100 M parameters, 4.4 GB of float32 weights), with its cache; cases
  ``prefill16`` and ``decode_p16_n1``.  Over protobuf's 2 GB, it keeps what the TorchScript
  exporter writes: ``<out>/tinyllama_1b_cache_eager/tinyllama_1b_cache_eager.ts.onnx`` (the graph,
  1 MB) beside one external data file per tensor; no dynamo export, no ORT optimizer file.
  Export, checker and ORT check took 8 min 48 s on the 2-core VM and peaked at 9.4 GB of RSS
  (``/usr/bin/time -v``; built under ``torch.no_grad`` with gradients off)::

      python models/export_large.py --out ../large-models --only tinyllama_1b --exporter ts

Everything follows export.py's conventions and reuses its code: seeded per model, ``.eval()``,
seeded noise on constant-valued parameters, attn_implementation explicit, TorchScript
(``<name>.ts.onnx``, opset 17) and dynamo (``<name>.dynamo.onnx``) exports with dynamic axes
(exported from a batch-2 example that is not saved, so no dim is specialised to 1), the ONNX
checker, and every saved case run in ONNX Runtime (graph optimizations off) against PyTorch.
Weights use transformers' own ``initializer_range`` (0.02): these files are for timing, and
activations stay realistic over 12 layers.

Then ONNX Runtime's transformers optimizer (``onnxruntime.transformers.optimizer.optimize_model``,
the library behind ``python -m onnxruntime.transformers.optimizer``) is run on each TorchScript
export -- model_type ``bert`` for BERT, ``gpt2`` for GPT-2, and for the LLaMA-style model
``gpt2`` and ``qwen3`` (the closest types it has; the one that fuses more is kept) -- at
``--opt-level`` (default 99: ORT's own graph fusions first, then the Python fusions).  The result
is saved beside the export as ``<name>.ts.ortopt.onnx`` (ONNX Runtime's best baseline for speed
comparisons; opt_level 99 output is tied to this machine's CPU), its fused-operator counts
go to the manifest, and it is checked against PyTorch on every case too.

Writes into ``--out``: the .onnx files, ``<name>.<case>.inputs.npz`` / ``.outputs.npz``,
``manifest.json`` (same fields as models/manifest.json where they apply, plus ``ort_optimizer``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export as small  # noqa: E402  (the shared conventions and helpers)

HIDDEN, LAYERS, HEADS = 768, 12, 12
SEQS = (128, 512)
DECODE_PASTS = (127, 511)


@dataclass
class LargeSpec:
    name: str
    kind: str  # "bert" | "gpt2" | "llama"
    impl: str  # attn_implementation
    cache: bool
    default: bool = True
    layers: int = LAYERS
    hidden: int = HIDDEN
    heads: int = HEADS
    kv_heads: int = 0  # 0: 4 for the LLaMA-style models, ``heads`` otherwise
    intermediate: int = 2048  # LLaMA-style models only
    prompts: tuple[int, ...] = SEQS  # prefill lengths of the saved cases
    pasts: tuple[int, ...] = DECODE_PASTS  # cache lengths of the saved decode cases
    external: bool = False  # over 2 GB: the TorchScript exporter's one file per tensor, kept

    def __post_init__(self) -> None:
        if not self.kv_heads:
            self.kv_heads = 4 if self.kind == "llama" else self.heads

    @property
    def outputs(self) -> list[str]:
        return small.decoder_outputs(self.layers) if self.cache else ["last_hidden_state"]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def optimizer_types(self) -> list[str]:
        return {"bert": ["bert"], "gpt2": ["gpt2"], "llama": ["gpt2", "qwen3"]}[self.kind]


def tinyllama() -> LargeSpec:
    """TinyLlama-1.1B's sizes: 4.4 GB of float32 weights, exported with external data."""
    return LargeSpec("tinyllama_1b_cache_eager", "llama", "eager", True, default=False, layers=22,
                     hidden=2048, heads=32, kv_heads=4, intermediate=5632, prompts=(16,),
                     pasts=(16,), external=True)


def specs() -> list[LargeSpec]:
    out = [LargeSpec("bert_base_eager", "bert", "eager", False),
           LargeSpec("bert_base_sdpa", "bert", "sdpa", False),
           LargeSpec("gpt2_small_eager", "gpt2", "eager", False),
           LargeSpec("gpt2_small_cache_eager", "gpt2", "eager", True),
           LargeSpec("llama_gqa_cache_eager", "llama", "eager", True)]
    out += [LargeSpec("gpt2_small_sdpa", "gpt2", "sdpa", False, default=False),
            LargeSpec("gpt2_small_cache_sdpa", "gpt2", "sdpa", True, default=False),
            LargeSpec("llama_gqa_cache_sdpa", "llama", "sdpa", True, default=False),
            tinyllama()]
    return out


def build(spec: LargeSpec) -> nn.Module:
    import transformers as tf

    if spec.cache:
        if spec.kind == "gpt2":
            cfg = small.decoder_config("gpt2", spec.impl, HIDDEN, LAYERS, HEADS, HEADS, 4 * HIDDEN,
                                       50257, 1024, init_range=0.02)
        else:
            cfg = small.decoder_config("llama", spec.impl, spec.hidden, spec.layers, spec.heads,
                                       spec.kv_heads, spec.intermediate, 32000, 2048,
                                       init_range=0.02)
        return small.hf_causal_lm(cfg)
    if spec.kind == "bert":
        cfg = tf.BertConfig(attn_implementation=spec.impl)  # bert-base-uncased's sizes
        return small.HfEncoder(tf.BertModel(cfg, add_pooling_layer=False))
    cfg = tf.GPT2Config(attn_implementation=spec.impl, bos_token_id=0, eos_token_id=1)  # gpt2
    return small.HfDecoderOnly(tf.GPT2Model(cfg))


def text_feeds(rng: np.random.Generator, b: int, seq: int) -> dict[str, np.ndarray]:
    return {"input_ids": small.token_ids(rng, b, seq),
            "attention_mask": np.ones((b, seq), dtype=np.int64)}


def cases(spec: LargeSpec, rng: np.random.Generator) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The saved cases (batch 1)."""
    if not spec.cache:
        return [(f"seq{s}", text_feeds(rng, 1, s)) for s in SEQS]
    sizes = (spec.kv_heads, spec.layers, spec.head_dim)
    out = [(f"prefill{s}", small.decoder_feeds(rng, 1, 0, s, *sizes)) for s in spec.prompts]
    out += [(f"decode_p{p}_n1", small.decoder_feeds(rng, 1, p, 1, *sizes)) for p in spec.pasts]
    return out


def example(spec: LargeSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The exporters' example: batch 2 (dynamo would specialise a batch of 1), past 5 / new 3."""
    if spec.cache:
        return small.decoder_feeds(rng, 2, 5, 3, spec.kv_heads, spec.layers, spec.head_dim)
    return text_feeds(rng, 2, 16)


def model_spec(spec: LargeSpec) -> small.ModelSpec:
    """The export.py ModelSpec the exporter helper wants (names, dynamic axes, varargs)."""
    dyn = small.decoder_dynamic(spec.layers) if spec.cache else small.seq_dyn(
        "input_ids", "attention_mask", "last_hidden_state")
    return small.ModelSpec(spec.name, spec.kind, "", lambda: None, lambda *a: {}, dyn,
                           spec.outputs, spec.layers, [], varargs_from=3 if spec.cache else None)


def run_ort_opt(path: Path, feeds: dict[str, np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    """ONNX Runtime with all graph optimizations (how the optimized files are meant to run)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 4
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return [o.name for o in sess.get_outputs()], sess.run(None, {n: feeds[n] for n in names})


def check(path: Path, saved: list[dict], refs: dict, runner) -> list[dict]:
    """Every case in ORT against PyTorch: [{name, ort_vs_torch_max_abs | ort_error, ...}]."""
    out = []
    for c in saved:
        e = {"name": c["name"]}
        try:
            t0 = time.perf_counter()
            names, outs = runner(path, c["feeds"])
            e["ort_seconds"] = round(time.perf_counter() - t0, 3)
            e["ort_vs_torch_max_abs"] = small.max_abs_diff(refs[c["name"]], names, outs)
            e["torch_max_abs_output"] = max(float(np.max(np.abs(v))) for v in refs[c["name"]].values())
        except Exception as ex:
            e["ort_error"] = small.error_line(ex)
        out.append(e)
    return out


def optimize(spec: LargeSpec, src: Path, dest: Path, opt_level: int) -> dict:
    """ONNX Runtime's transformers optimizer on ``src``; the model type that fuses the most
    operators is saved to ``dest``.  Returns what it fused per model type tried."""
    from onnxruntime.transformers.optimizer import optimize_model

    tried, best = {}, None
    for mt in spec.optimizer_types:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt = optimize_model(str(src), model_type=mt, num_heads=spec.heads,
                                     hidden_size=spec.hidden,
                                     opt_level=opt_level, use_gpu=False)
            stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
            ops = {}
            for n in opt.model.graph.node:
                ops[n.op_type] = ops.get(n.op_type, 0) + 1
            tried[mt] = {"fused": stats, "attention_like_ops": {
                k: v for k, v in ops.items()
                if k in ("Attention", "MultiHeadAttention", "GroupQueryAttention")},
                "softmax_nodes": ops.get("Softmax", 0)}
            score = sum(stats.values())
            if best is None or score > best[0]:
                best = (score, mt, opt)
        except Exception as ex:
            tried[mt] = {"error": small.error_line(ex)}
    if best is None:
        return {"tried": tried}
    small.metadata_paths.scrub_model(best[2].model)
    best[2].save_model_to_file(str(dest), use_external_data_format=False)
    return {"model_type": best[1], "opt_level": opt_level, "tried": tried}


def keep_export(spec: LargeSpec, path: Path, dest: Path) -> onnx.ModelProto:
    """Save the export at ``path`` as ``dest`` without machine paths in node metadata.  A model
    over 2 GB keeps the TorchScript exporter's one file per tensor: the files move into ``dest``'s
    folder (emptied first) and only the graph is re-saved, its external references unchanged."""
    if not spec.external:
        m = onnx.load(str(path), load_external_data=True)
        small.metadata_paths.scrub_model(m)
        onnx.save_model(m, str(dest), save_as_external_data=False)
        return m
    m = onnx.load(str(path), load_external_data=False)
    small.metadata_paths.scrub_model(m)
    shutil.rmtree(dest.parent, ignore_errors=True)
    dest.parent.mkdir(parents=True)
    for f in path.parent.iterdir():
        if f != path:
            shutil.move(str(f), dest.parent / f.name)
    onnx.save_model(m, str(dest))
    return m


def export_one(spec: LargeSpec, args, manifest: list, failures: list) -> None:
    out_dir = Path(args.out)
    seed = small.seed_of(spec.name)
    small.seed_everything(seed)
    model = build(spec).eval().requires_grad_(False)
    impl = small.hf_attn_impl(model)
    if impl != spec.impl:
        raise RuntimeError(f"{spec.name}: asked for {spec.impl}, transformers gave {impl}")
    small.perturb_constant_params(model, torch.Generator().manual_seed(seed + 1))
    rng = np.random.default_rng(seed + 2)
    saved, refs = [], {}
    for name, feeds in cases(spec, rng):
        ref = dict(zip(spec.outputs, small.torch_outputs(model, feeds)))
        stem = f"{spec.name}.{name}"
        np.savez(out_dir / f"{stem}.inputs.npz", **feeds)
        np.savez(out_dir / f"{stem}.outputs.npz", **ref)
        saved.append({"name": name, "feeds": feeds, "inputs_npz": f"{stem}.inputs.npz",
                      "outputs_npz": f"{stem}.outputs.npz",
                      "input_shapes": {k: list(v.shape) for k, v in feeds.items()}})
        refs[name] = ref
    ex = example(spec, rng)
    params = sum(p.numel() for p in model.parameters())
    print(f"== {spec.name}: {params / 1e6:.1f} M parameters, attn_implementation={impl}", flush=True)
    for exporter in args.exporter:
        if spec.external and exporter != "ts":
            continue  # the dynamo exporter's single file cannot hold > 2 GB
        fname = f"{spec.name}.{exporter}.onnx"
        if spec.external:
            fname = f"{spec.name}/{fname}"  # a folder of its own for the tensor files
        dest = out_dir / fname
        base = {"file": fname, "model": spec.name, "exporter":
                "torchscript" if exporter == "ts" else "dynamo"}
        t0 = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="attnrt-export-large-") as td:
                job = small.ExportJob(exporter, small.TS_OPSET if exporter == "ts" else None)
                with torch.no_grad():
                    path = small.export_once(model_spec(spec), model, ex, job, Path(td))
                m = keep_export(spec, path, dest)
        except Exception as e:
            msg = small.error_line(e)
            print(f"   {fname}: EXPORT FAILED: {msg}", flush=True)
            if args.verbose:
                traceback.print_exc()
            failures.append({**base, "stage": "export", "error": msg[:500]})
            continue
        export_s = time.perf_counter() - t0
        try:
            onnx.checker.check_model(str(dest), full_check=True)
            checker = "ok"
        except Exception as e:
            checker = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        results = check(dest, saved, refs, small.run_ort)
        bad = [r for r in results if not r.get("ort_vs_torch_max_abs", np.inf) <= args.max_diff]
        info = small.analyse(m)
        entry = {**base, "source": f"{spec.kind} ({spec.impl})", "attn_implementation": impl,
                 "parameters": params, "size_bytes": dest.stat().st_size,
                 "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
                 "export_seconds": round(export_s, 1), "checker": checker,
                 "graph_shapes": {vi.name: small.dims_of(vi)
                                  for vi in list(m.graph.input) + list(m.graph.output)},
                 "attention_blocks": spec.layers, "softmax_nodes": info["softmax_nodes"],
                 "attention_ops": info["attention_ops"], "node_count": info["node_count"],
                 "graph_tags": info["graph_tags"],
                 "cases": [{k: v for k, v in c.items() if k != "feeds"} | r
                           for c, r in zip(saved, results)]}
        if bad:
            entry["warning"] = f"ORT differs from PyTorch by more than {args.max_diff}: {bad}"
        print(f"   {fname}: {entry['size_bytes'] / 1e6:.0f} MB, export {export_s:.0f} s, checker "
              f"{checker}; ORT vs PyTorch: " + ", ".join(
                  f"{r['name']} {r['ort_vs_torch_max_abs']:.2e}" if "ort_vs_torch_max_abs" in r
                  else f"{r['name']} ERROR {r['ort_error']}" for r in results), flush=True)
        if exporter == "ts" and args.optimize and not spec.external:
            opt_dest = out_dir / f"{spec.name}.ts.ortopt.onnx"
            t0 = time.perf_counter()
            opt = optimize(spec, dest, opt_dest, args.opt_level)
            if opt_dest.exists():
                opt["file"] = opt_dest.name
                opt["size_bytes"] = opt_dest.stat().st_size
                opt["cases"] = check(opt_dest, saved, refs, run_ort_opt)
            opt["seconds"] = round(time.perf_counter() - t0, 1)
            entry["ort_optimizer"] = opt
            print(f"   {spec.name}.ts.ortopt.onnx: {json.dumps(opt)}", flush=True)
        manifest.append(entry)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (outside the repository)")
    ap.add_argument("--only", action="append", default=[],
                    help="models whose name contains this (repeatable); manifest keeps the rest")
    ap.add_argument("--exporter", action="append", choices=["ts", "dynamo"],
                    help="exporters to run (repeatable; default both)")
    ap.add_argument("--sdpa-decoders", action="store_true",
                    help="also the SDPA variants of the GPT-2 and LLaMA-style models")
    ap.add_argument("--no-optimize", dest="optimize", action="store_false",
                    help="skip ONNX Runtime's transformers optimizer")
    ap.add_argument("--opt-level", type=int, default=99, choices=[0, 1, 2, 99])
    ap.add_argument("--max-diff", type=float, default=1e-3,
                    help="flag (not drop) exports whose ORT output differs from PyTorch by more")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    args.exporter = args.exporter or ["ts", "dynamo"]
    def named(s: LargeSpec) -> bool:
        return any(o in s.name for o in args.only)

    # The 1.1B decoder (external) is exported only when --only names it.
    chosen = [s for s in specs() if (not args.only or named(s)) and (
        s.default or args.sdpa_decoders and s.impl == "sdpa" or s.external and named(s))]
    if args.list:
        for s in specs():
            print(f"{s.name:26} {s.kind} {s.impl} cache={s.cache} default={s.default}")
        return 0
    if not args.out:
        ap.error("--out DIR is required")
    out_dir = Path(args.out).resolve()
    if (Path(__file__).resolve().parent.parent in out_dir.parents):
        ap.error(f"--out {out_dir} is inside the repository; large models stay outside it")
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    path = out_dir / "manifest.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    done = {(s.name, e) for s in chosen for e in args.exporter}
    manifest = [e for e in old.get("models", []) if (e["model"], e["file"].split(".")[1]) not in done]
    failures = [f for f in old.get("failures", []) if (f["model"], f["file"].split(".")[1]) not in done]
    for spec in chosen:
        try:
            export_one(spec, args, manifest, failures)
        except Exception as e:
            print(f"== {spec.name}: FAILED: {small.error_line(e)}", flush=True)
            if args.verbose:
                traceback.print_exc()
            failures.append({"file": f"{spec.name}.?", "model": spec.name, "stage": "build",
                             "error": small.error_line(e)[:500]})
        manifest.sort(key=lambda e: e["file"])
        import transformers
        doc = {"generated_by": "models/export_large.py",
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "onnx": onnx.__version__, "onnxruntime": ort.__version__},
               "models": manifest, "failures": failures}
        path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(manifest)} files, {len(failures)} failures in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
