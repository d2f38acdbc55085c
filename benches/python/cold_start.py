#!/usr/bin/env python3
"""Peak RSS and cold start of a decoder: ``attnrt generate`` against ONNX Runtime, each engine in
a fresh process of its own, interleaved rounds.

Every round runs, in alternating order,

* ``attnrt generate MODEL --prompt-ids IDS --max-new-tokens N --threads T --json``, and
* this script as a child (``--ort-child``): ONNX Runtime (CPU EP, ``ORT_ENABLE_ALL``, T intra-op
  threads) loads the same file and generates greedily with the same prompt, the same number of
  tokens and its cache fed back, as attnrt does,

and, with ``--baseline BIN``, the same attnrt command of another build (``attnrt-base``: the
binary before a change, in the same rounds), each under ``/usr/bin/time -v`` (with ``--case NPZ``: ``attnrt run MODEL --input-npz NPZ
--no-diff`` against ONNX Runtime's load and one run, for encoders): the process's peak RSS ("Maximum resident set size") and its
wall time from start to exit (load, fuse/optimize, plan, the prompt, every token) and its CPU
time (user + system: on a machine shared with other work, less noisy than the wall time). Each
engine also reports its own time to the first token and its median decode step.

Copy and read benchmarks measured in the same run (numpy, ``T`` threads, 512 MB buffers, far
past the caches) give the machine's memory bandwidth; the weight-streaming limit of a decode
step is the bytes of weights it reads (every weight of the file, once) over the larger of the
two (the memory traffic the machine was seen to sustain), and each engine's median step is reported as that limit's share (``limit / step``)::

    python benches/python/cold_start.py --attnrt target/release/attnrt \\
        --model ../large-models/tinyllama_1b_cache_eager/tinyllama_1b_cache_eager.ts.onnx \\
        --prompt-len 16 --max-new-tokens 8 --threads 2 --rounds 3

    python benches/python/cold_start.py --attnrt target/release/attnrt \\
        --model ../large-models/bert_base_eager.ts.onnx \\
        --case ../large-models/bert_base_eager.seq512.inputs.npz --threads 2 --rounds 3

Needs numpy, onnx and onnxruntime (the Python test environment).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np


def weights_and_vocab(model: Path) -> tuple[int, int]:
    """Bytes of the file's initializers (inline and external), without loading their data, and
    the last dim of its first output (a decoder's vocabulary, when static)."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    total = 0
    for t in m.graph.initializer:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        total += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    dims = m.graph.output[0].type.tensor_type.shape.dim
    return total, dims[-1].dim_value if dims else 0


def bandwidth_gbs(threads: int, mb: int = 512, rounds: int = 5) -> tuple[float, float]:
    """(copy, read) bandwidth in GB/s: the best of ``rounds`` copies of ``mb`` MB (bytes read +
    written per second) and sums of them (bytes read per second), split over ``threads``
    (numpy releases the GIL in both)."""
    src = np.ones(mb << 18, dtype=np.float32)
    dst = np.zeros_like(src)
    spans = [(p[0], p[-1] + 1) for p in np.array_split(np.arange(src.size), threads)]

    def best(work, nbytes: int) -> float:
        top = 0.0
        for _ in range(rounds):
            workers = [threading.Thread(target=work, args=(a, b)) for a, b in spans]
            t = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            top = max(top, nbytes / (time.perf_counter() - t) / 1e9)
        return top

    copy = best(lambda a, b: np.copyto(dst[a:b], src[a:b]), 2 * src.nbytes)
    read = best(lambda a, b: np.dot(src[a:b], src[a:b]), src.nbytes)
    return copy, read


def ort_child(args) -> None:
    """ONNX Runtime: load, then one run of ``--case`` or greedy generation with the cache fed
    back; JSON on stdout."""
    import onnxruntime as ort

    t0 = time.perf_counter()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(args.model), so, providers=["CPUExecutionProvider"])
    load_s = time.perf_counter() - t0
    if args.case:
        feeds = dict(np.load(args.case))
        t = time.perf_counter()
        sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
        print(json.dumps({"load_s": load_s, "run_ms": (time.perf_counter() - t) * 1e3}))
        return
    past = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    ids = np.array([prompt_ids(args)], dtype=np.int64)
    feeds = {p.name: np.zeros((1, p.shape[1], 0, p.shape[3]), dtype=np.float32) for p in past}
    names = [o.name for o in sess.get_outputs()]
    total, steps, tokens = 0, [], []
    for step in range(args.max_new_tokens):
        new = ids.shape[1]
        feeds.update(input_ids=ids, attention_mask=np.ones((1, total + new), dtype=np.int64),
                     position_ids=np.arange(total, total + new, dtype=np.int64)[None])
        t = time.perf_counter()
        outs = dict(zip(names, sess.run(None, feeds)))
        steps.append((time.perf_counter() - t) * 1e3)
        token = int(np.argmax(outs["logits"][0, -1]))
        tokens.append(token)
        total += new
        ids = np.array([[token]], dtype=np.int64)
        for p in past:
            feeds[p.name] = outs[p.name.replace("past_key_values.", "present.")]
    print(json.dumps({"load_s": load_s, "first_token_ms": steps[0],
                      "median_step_ms": statistics.median(steps[1:]) if len(steps) > 1 else None,
                      "tokens": tokens}))


def prompt_ids(args) -> list[int]:
    rng = np.random.default_rng(args.seed)
    return [int(x) for x in rng.integers(2, args.vocab, args.prompt_len)]


def timed(cmd: list[str]) -> tuple[dict, float, float, float]:
    """Runs ``cmd`` under /usr/bin/time -v: (its JSON stdout, peak RSS in MiB, wall seconds,
    CPU seconds: user + system, less sensitive than wall time to other processes' load)."""
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")

    def field(name: str) -> float:
        return float(re.search(re.escape(name) + r": ([\d.]+)", r.stderr).group(1))

    cpu = field("User time (seconds)") + field("System time (seconds)")
    return json.loads(r.stdout), field("Maximum resident set size (kbytes)") / 1024, wall, cpu


def engines(args) -> dict[str, list[str]]:
    """The command of each engine, in the order the first round runs them."""
    cmds = engine_commands(args)
    if args.baseline:
        cmds["attnrt-base"] = [args.baseline, *cmds["attnrt"][1:]]
    return cmds


def engine_commands(args) -> dict[str, list[str]]:
    common = ["--threads", str(args.threads)]
    if args.case:
        return {
            "attnrt": [args.attnrt, "run", str(args.model), "--input-npz", str(args.case),
                       "--no-diff", "--json", *common],
            "ort": [sys.executable, __file__, "--ort-child", "--model", str(args.model),
                    "--case", str(args.case), *common],
        }
    ids = ",".join(map(str, prompt_ids(args)))
    return {
        "attnrt": [args.attnrt, "generate", str(args.model), "--prompt-ids", ids,
                   "--max-new-tokens", str(args.max_new_tokens), "--json", *common],
        "ort": [sys.executable, __file__, "--ort-child", "--model", str(args.model),
                "--prompt-len", str(args.prompt_len), "--seed", str(args.seed),
                "--vocab", str(args.vocab),
                "--max-new-tokens", str(args.max_new_tokens), *common],
    }


def step_ms(engine: str, out: dict) -> tuple[float, float | None]:
    """(time to the first token, median decode step), ms, as the engine reports them; with
    ``--case``, (the run, None)."""
    if engine == "ort":
        return out.get("first_token_ms", out.get("run_ms")), out.get("median_step_ms")
    if "report" not in out:
        return out["time_ms"]["fused"], None
    r = out["report"]
    return r["time_to_first_token_ms"], r["median_step_ms"]


def tokens_of(engine: str, out: dict) -> list[int] | None:
    if engine == "ort":
        return out.get("tokens")
    return out["report"]["tokens"] if "report" in out else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attnrt", help="the attnrt binary (a release build)")
    p.add_argument("--baseline", help="another attnrt binary, run as `attnrt-base` in the same "
                                      "rounds (the build before a change)")
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--case", type=Path,
                   help="an inputs .npz: one run after loading (`attnrt run --no-diff`) instead "
                        "of generation")
    p.add_argument("--vocab", type=int, default=0,
                   help="prompt ids are drawn from [2, N) (default: the logits' last dim)")
    p.add_argument("--ort-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ort_child:
        return ort_child(args)
    weights, vocab = weights_and_vocab(args.model)
    args.vocab = args.vocab or vocab or 2
    copy, read = bandwidth_gbs(args.threads)
    limit_ms = weights / (max(copy, read) * 1e9) * 1e3
    print(f"weights {weights / 1e6:.0f} MB; bandwidth ({args.threads} threads): copy {copy:.1f} "
          f"GB/s, read {read:.1f} GB/s; weight-streaming limit of a step (weights / the larger) "
          f"{limit_ms:.1f} ms; load average {os.getloadavg()[0]:.1f}")
    print("| round | engine | peak RSS MiB | × weights | wall s | CPU s | first token (run) ms "
          "| median step ms | limit / step |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    cmds, tokens = engines(args), {}
    names = list(cmds)
    for r in range(args.rounds):
        # Each round starts with the next engine, so none is always first (or last).
        order = names[r % len(names):] + names[:r % len(names)]
        for e in order:
            out, rss, wall, cpu = timed(cmds[e])
            first, step = step_ms(e, out)
            tokens[e] = tokens_of(e, out)
            share = f"{limit_ms / step:.0%}" if step else "-"
            print(f"| {r} | {e} | {rss:,.0f} | {rss * 2**20 / weights:.2f} | {wall:.1f} | "
                  f"{cpu:.1f} | {first:.0f} | {step or 0:.1f} | {share} |", flush=True)
    if args.case:
        return
    same = tokens["attnrt"] == tokens["ort"]
    print(f"tokens: attnrt {tokens['attnrt']}, ORT {tokens['ort']} ({'same' if same else 'DIFFER'})")
    if "attnrt-base" in tokens:
        same = tokens["attnrt-base"] == tokens["attnrt"]
        print(f"tokens: attnrt-base {'the same' if same else 'DIFFER: ' + str(tokens['attnrt-base'])}")


if __name__ == "__main__":
    main()
