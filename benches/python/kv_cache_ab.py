#!/usr/bin/env python3
"""The in-place key/value cache against the copied one, in one attnrt build (issue 26).

Runs ``attnrt generate MODEL --prompt-ids ... --max-new-tokens N --threads T --json`` with
``--kv-cache in-place`` and ``--kv-cache copy`` alternately (the order swapped every round), each
a fresh process, on seeded random prompts of ``--prompt-len`` tokens, a batch of each size of
``--batches``, and prints per batch and mode the report's median decode step and time to first
token of every round, and their medians::

    python benches/python/kv_cache_ab.py --attnrt target/release/attnrt \\
        --model ../genai-bench/llama_gqa_cache_eager.ts.onnx --prompt-len 1024 --batches 1,4

Only the standard library.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess


def run(args, prompts, mode):
    cmd = [args.attnrt, "generate", args.model, "--max-new-tokens", str(args.new_tokens),
           "--threads", str(args.threads), "--json", "--kv-cache", mode]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    out = subprocess.run(cmd, capture_output=True, check=True, text=True).stdout
    r = json.loads(out)["report"]
    if r["kv_cache"]["mode"] != mode:
        raise SystemExit(f"asked for {mode}, ran {r['kv_cache']}")
    return r["median_step_ms"], r["time_to_first_token_ms"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attnrt", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    rng = random.Random(7)
    results: dict = {}
    for rnd in range(args.rounds):
        for batch in map(int, args.batches.split(",")):
            prompts = [[rng.randrange(2, args.vocab) for _ in range(args.prompt_len)]
                       for _ in range(batch)]
            modes = ["in-place", "copy"] if rnd % 2 == 0 else ["copy", "in-place"]
            for mode in modes:
                results.setdefault((batch, mode), []).append(run(args, prompts, mode))
    for (batch, mode), rounds in sorted(results.items()):
        steps = [round(s, 3) for s, _ in rounds]
        ttft = [round(t) for _, t in rounds]
        print(f"batch {batch} {mode}: median step ms {steps} (median "
              f"{statistics.median(steps):.3f}), time to first token ms {ttft}")


if __name__ == "__main__":
    main()
