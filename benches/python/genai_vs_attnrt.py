#!/usr/bin/env python3
"""Generation, attnrt against onnxruntime-genai: time to first token and per token (issue 26).

Both engines run the same 125 M-parameter LLaMA-style decoder (export_large.py's
``llama_gqa_cache_eager``: attnrt on its TorchScript export, onnxruntime-genai on the model its
builder made from the same weights; ``models/genai_build.py`` makes that one and checks that both
files give the same greedy tokens).  Every measurement is a fresh process; the engines alternate
within each round, so both see the same machine state::

    python benches/python/genai_vs_attnrt.py --attnrt target/release/attnrt \\
        --dir ../genai-bench --prompts 128,1024 --batches 1,4 --new-tokens 32 --rounds 3

Per engine, prompt length and batch: time to first token (the prompt step, from handing over
the prompt to the first token; after the model is loaded), the first decode step, and the median
of the later steps (one token per row each); tokens/s = batch / per-token time.  The
weight-streaming limit is measured in the same run (``--bandwidth``: a two-thread read of a
1 GiB array, median of 5): bytes of weights a step reads (every initializer but the embedding
table, which a step gathers a row from) over that bandwidth.  Prompts are seeded random ids,
rows of a batch of equal length (no padding: onnxruntime-genai pads on the right).
``--attnrt-base`` runs a second attnrt binary (e.g. main's build) in the same rounds, for an
A/B of two builds under the same machine state.

``tokens_equal`` holds per configuration whether every engine gave the same greedy tokens in
every round; ``token_mismatches`` keeps each engine's tokens of any round where they differed.

Needs a Python with onnxruntime-genai, onnx and numpy (run with it; the genai side runs
``sys.executable`` again with ``--worker``).  Prints one JSON object; ``--out`` saves it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

MODEL = "llama_gqa_cache_eager.ts.onnx"
GENAI = "llama_gqa_genai"


def prompts(length: int, batch: int, vocab: int = 32000) -> list[list[int]]:
    rng = np.random.default_rng(1000 + length)
    return rng.integers(2, vocab, size=(batch, length)).tolist()


def genai_worker(args) -> None:
    """One generation in onnxruntime-genai; prints the step times and tokens as JSON."""
    import onnxruntime_genai as og

    ids = np.array(json.loads(Path(args.ids).read_text()), dtype=np.int32)
    model = og.Model(args.model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + args.new_tokens, do_sample=False,
                              batch_size=ids.shape[0])
    gen = og.Generator(model, params)
    started = time.perf_counter()
    gen.append_tokens(ids)
    gen.generate_next_token()  # the first token: from the prompt's logits
    steps = [(time.perf_counter() - started) * 1e3]
    tokens = [gen.get_next_tokens().tolist()]
    for _ in range(args.new_tokens - 1):
        t0 = time.perf_counter()
        gen.generate_next_token()
        steps.append((time.perf_counter() - t0) * 1e3)
        tokens.append(gen.get_next_tokens().tolist())
    rows = [[int(step[r]) for step in tokens] for r in range(ids.shape[0])]
    print(json.dumps({"steps_ms": steps, "rows": rows}))


def run_genai(args, ids_file: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", str(Path(args.dir) / GENAI),
           "--ids", str(ids_file), "--new-tokens", str(args.new_tokens)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_attnrt(args, rows: list[list[int]], binary: str | None = None) -> dict:
    cmd = [binary or args.attnrt, "generate", str(Path(args.dir) / MODEL), "--json",
           "--max-new-tokens", str(args.new_tokens), "--threads", str(args.threads)]
    for row in rows:
        cmd += ["--prompt-ids", ",".join(map(str, row))]
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    steps = [s["ms"] for s in res["report"]["steps"]]
    return {"steps_ms": steps, "rows": [r["tokens"] for r in res["rows"]]}


def summary(steps: list[float], batch: int) -> dict:
    later = steps[2:] or steps[1:]
    per_token = statistics.median(later)
    return {"ttft_ms": steps[0], "first_decode_ms": steps[1] if len(steps) > 1 else None,
            "per_token_ms": per_token, "tokens_per_s": batch * 1e3 / per_token}


def read_bandwidth(gib: float = 1.0, threads: int = 2) -> float:
    """Bytes per second read by ``threads`` threads summing a ``gib`` GiB float32 array."""
    a = np.ones(int(gib * 2**30) // 4, dtype=np.float32)
    parts = np.array_split(a, threads)
    times = []
    for _ in range(5):
        workers = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        times.append(time.perf_counter() - t0)
    return a.nbytes / statistics.median(times)


def weight_bytes_per_step(model: Path) -> int:
    """Initializers' bytes a decode step reads: all but tables only gathered from."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    gathered = {n.input[0] for n in m.graph.node if n.op_type == "Gather"}
    total = 0
    for t in m.graph.initializer:
        if t.name in gathered:
            continue
        count = int(np.prod(t.dims)) if t.dims else 1
        total += count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def measure(args) -> dict:
    results, agree, mismatches = {}, {}, []
    # One file per run: other runs may share the folder.
    tmp = Path(args.dir) / f"genai_bench_ids.{os.getpid()}.json"
    bandwidths = []
    for rnd in range(args.rounds):
        bandwidths.append(read_bandwidth(threads=args.threads))
        for length in args.prompts:
            for batch in args.batches:
                rows = prompts(length, batch)
                tmp.write_text(json.dumps(rows))
                engines = [("attnrt", lambda: run_attnrt(args, rows)),
                           ("onnxruntime-genai", lambda: run_genai(args, tmp))]
                if args.attnrt_base:
                    engines.insert(1, ("attnrt-base",
                                       lambda: run_attnrt(args, rows, args.attnrt_base)))
                if rnd % 2:
                    engines.reverse()
                outs = {}
                for name, run in engines:
                    outs[name] = run()
                    key = f"prompt{length}_batch{batch}"
                    results.setdefault(key, {}).setdefault(name, []).append(
                        summary(outs[name]["steps_ms"], batch))
                    print(f"round {rnd} {key} {name}: {results[key][name][-1]}",
                          file=sys.stderr, flush=True)
                key = f"prompt{length}_batch{batch}"
                equal = all(out["rows"] == outs["onnxruntime-genai"]["rows"]
                            for out in outs.values())
                # Equal in every round; a round that differs keeps every engine's tokens.
                agree[key] = agree.get(key, True) and equal
                if not equal:
                    mismatches.append({"round": rnd, "case": key,
                                       "rows": {name: out["rows"] for name, out in outs.items()}})
    tmp.unlink(missing_ok=True)
    return {"results": results, "tokens_equal": agree, "token_mismatches": mismatches,
            "bandwidth_gb_s": [b / 1e9 for b in bandwidths]}


def report(raw: dict, weight_bytes: int) -> dict:
    bandwidth = statistics.median(raw["bandwidth_gb_s"]) * 1e9
    limit_ms = weight_bytes / bandwidth * 1e3
    table = {}
    for key, engines in raw["results"].items():
        table[key] = {}
        for name, runs in engines.items():
            med = {f: statistics.median(r[f] for r in runs) for f in
                   ("ttft_ms", "first_decode_ms", "per_token_ms", "tokens_per_s")}
            med["limit_fraction"] = limit_ms / med["per_token_ms"]
            table[key][name] = med
        ours, theirs = table[key]["attnrt"], table[key]["onnxruntime-genai"]
        table[key]["genai_over_attnrt"] = {
            "ttft": theirs["ttft_ms"] / ours["ttft_ms"],
            "per_token": theirs["per_token_ms"] / ours["per_token_ms"]}
        if "attnrt-base" in table[key]:
            base = table[key]["attnrt-base"]
            table[key]["base_over_attnrt"] = {
                "ttft": base["ttft_ms"] / ours["ttft_ms"],
                "per_token": base["per_token_ms"] / ours["per_token_ms"]}
    return {"weight_bytes_per_step": weight_bytes, "bandwidth_gb_s": bandwidth / 1e9,
            "weight_streaming_limit_ms": limit_ms, "table": table,
            "tokens_equal": raw["tokens_equal"], "token_mismatches": raw["token_mismatches"],
            "raw": raw}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    ap.add_argument("--attnrt", default="target/release/attnrt")
    ap.add_argument("--attnrt-base", help="an earlier attnrt binary, run in the same rounds "
                    "(A/B: 'attnrt-base' rows and base_over_attnrt ratios)")
    ap.add_argument("--dir", help="the folder of export_large.py and genai_build.py")
    ap.add_argument("--prompts", default="128,1024")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    if args.worker:
        genai_worker(args)
        return 0
    args.prompts = [int(p) for p in args.prompts.split(",")]
    args.batches = [int(b) for b in args.batches.split(",")]
    out = report(measure(args), weight_bytes_per_step(Path(args.dir) / MODEL))
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
