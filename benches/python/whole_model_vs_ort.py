#!/usr/bin/env python3
"""Whole models: attnrt (fused, on its kernels) against ONNX Runtime, interleaved rounds.

For each model and case, every round runs ``attnrt bench MODEL --json`` (a fresh process: it
fuses, builds both sessions and times ``--reps`` warm runs of the fused and the unfused model in
alternation) and times ONNX Runtime in this process on the same inputs (``ORT_ENABLE_ALL``, the
same thread count, ``--reps`` warm runs), alternating which goes first. This machine's speed
drifts, so the figure of merit is the median over rounds of the per-round ratio
``ORT time / attnrt fused time`` (> 1: attnrt is faster). Before timing, the fused outputs
(``attnrt run --no-diff --output``) are compared with ONNX Runtime's (|a - b| <= atol + rtol·|b|).

    python benches/python/whole_model_vs_ort.py --attnrt target/release/attnrt \\
        --dir ../large-models --model bert_base_eager.ts --case seq128 --threads 2

Dynamically quantized files (``models/quantize.py --src``) are models like any other:
``--model bert_base_eager.ts --model bert_base_eager.ts.qint8`` times attnrt's float32 and int8
runs against ONNX Runtime's in one invocation (``--report-diff`` for full-range int8 weights).

``--half`` adds a float16 table: each model is converted with ONNX Runtime's own converter
(``convert_float_to_float16(keep_io_types=True)``, written once as ``MODEL.fp16.onnx`` beside it),
and every round times attnrt on the float16 file, attnrt on the float32 file and ONNX Runtime on
the float16 file, in rotating order; the ratios are per round (ORT fp16 / attnrt fp16 and
attnrt fp32 / attnrt fp16), the float16 outputs checked against ONNX Runtime's within
``--half-atol``/``--half-rtol``:

    python benches/python/whole_model_vs_ort.py --attnrt target/release/attnrt \\
        --dir ../large-models --model bert_base_eager.ts --case seq128 --threads 2 --half

``--baseline OTHER_ATTNRT`` times a second attnrt binary (the build before a change) in the same
rounds, the three timings in rotating order; its columns follow (its time, ORT / it, and
baseline / attnrt: > 1 when the change made attnrt faster):

    python benches/python/whole_model_vs_ort.py --attnrt target/release/attnrt \
        --baseline ./attnrt-main --dir ../qdq-large --model bert_base_eager.ts.qint8 --case seq128

ONNX Runtime runs the same ``MODEL.onnx`` file; ``--ort-model-suffix .ortopt`` makes it run
``MODEL.ortopt.onnx`` (its transformers optimizer's output, written by models/export_large.py)
instead, its best baseline. Needs numpy and onnxruntime (tests/python/requirements.txt).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort


def ort_session(path: Path, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_median_ms(sess: ort.InferenceSession, feeds: dict, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def attnrt_median_ms(args, model: Path, npz: Path, binary: str | None = None) -> float:
    cmd = [binary or args.attnrt, "bench", str(model), "--input-npz", str(npz), "--threads",
           str(args.threads), "--reps", str(args.reps), "--warmup", str(args.warmup), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["fused"]["median_ms"])


def check_outputs(args, model: Path, npz: Path, sess: ort.InferenceSession, feeds: dict) -> float:
    """Largest |attnrt - ORT| over every output; exits when one is beyond the tolerance."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npz"
        subprocess.run([args.attnrt, "run", str(model), "--input-npz", str(npz), "--no-diff",
                        "--threads", str(args.threads), "--output", str(out)],
                       check=True, capture_output=True)
        mine = dict(np.load(out))
    names = [o.name for o in sess.get_outputs()]
    theirs = dict(zip(names, sess.run(None, feeds)))
    worst = 0.0
    for name, b in theirs.items():
        a = mine[name]
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        worst = max(worst, float(diff.max(initial=0.0)))
        if not args.report_diff and not np.all(diff <= args.atol + args.rtol * np.abs(b)):
            sys.exit(f"{model.name}: output {name} differs from ONNX Runtime "
                     f"(max abs {diff.max():.3e})")
    return worst


def timed_rounds(args, model: Path, npz: Path, sess, feeds: dict) -> dict[str, list[float]]:
    """Per round, attnrt's, ONNX Runtime's (and with ``--baseline`` the baseline binary's)
    median times, the order rotating from round to round."""
    timers = {
        "attnrt": lambda: attnrt_median_ms(args, model, npz),
        "ort": lambda: ort_median_ms(sess, feeds, args.warmup, args.reps),
    }
    if args.baseline:
        timers["baseline"] = lambda: attnrt_median_ms(args, model, npz, args.baseline)
    times = {k: [] for k in timers}
    order = list(timers)
    for r in range(args.rounds):
        at = r % len(order)
        for k in order[at:] + order[:at]:
            times[k].append(timers[k]())
    return times


def ratio_cell(num: list[float], den: list[float]) -> str:
    """The median of the per-round ratios ``num / den``, and their range."""
    ratios = [n / d for n, d in zip(num, den)]
    return f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})"


def row(times: dict[str, list[float]]) -> str:
    """The timing cells of a table row (see ``main``'s header)."""
    med = {k: statistics.median(v) for k, v in times.items()}
    cells = [f"{med['attnrt']:.1f}", f"{med['ort']:.1f}", ratio_cell(times["ort"], times["attnrt"])]
    if "baseline" in times:
        cells += [f"{med['baseline']:.1f}", ratio_cell(times["ort"], times["baseline"]),
                  ratio_cell(times["baseline"], times["attnrt"])]
    return " | ".join(cells)


def half_model(model: Path) -> Path:
    """``MODEL.fp16.onnx`` beside ``model``: ONNX Runtime's float16 converter, keep_io_types."""
    out = model.with_suffix(".fp16.onnx")
    if not out.exists():
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        half = convert_float_to_float16(onnx.load(str(model)), keep_io_types=True)
        onnx.save(half, str(out))
    return out


def half_row(args, stem: str, case: str) -> None:
    """One float16 row: attnrt fp16, attnrt fp32 and ORT fp16 in rotating order per round."""
    model = args.dir / f"{stem}.onnx"
    half = half_model(model)
    npz = args.dir / f"{stem.split('.')[0]}.{case}.inputs.npz"
    feeds = dict(np.load(npz))
    sess = ort_session(half, args.threads)
    tol = argparse.Namespace(**{**vars(args), "atol": args.half_atol, "rtol": args.half_rtol})
    worst = check_outputs(tol, half, npz, sess, feeds)
    timers = {
        "half": lambda: attnrt_median_ms(args, half, npz),
        "float": lambda: attnrt_median_ms(args, model, npz),
        "ort": lambda: ort_median_ms(sess, feeds, args.warmup, args.reps),
    }
    times = {k: [] for k in timers}
    order = list(timers)
    for r in range(args.rounds):
        for k in order[r % 3:] + order[:r % 3]:
            times[k].append(timers[k]())
    med = {k: statistics.median(v) for k, v in times.items()}
    vs_ort = [o / h for o, h in zip(times["ort"], times["half"])]
    vs_f32 = [f / h for f, h in zip(times["float"], times["half"])]
    print(f"| {stem}.fp16 | {case} | {med['half']:.1f} | {med['float']:.1f} | {med['ort']:.1f} "
          f"| {statistics.median(vs_ort):.2f} ({min(vs_ort):.2f}-{max(vs_ort):.2f}) "
          f"| {statistics.median(vs_f32):.2f} ({min(vs_f32):.2f}-{max(vs_f32):.2f}) "
          f"| {worst:.1e} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attnrt", required=True, help="the attnrt binary (a release build)")
    p.add_argument("--baseline", help="a second attnrt binary timed in the same rounds "
                   "(the build before a change)")
    p.add_argument("--dir", required=True, type=Path, help="folder of models and case npz files")
    p.add_argument("--model", action="append", required=True,
                   help="model file stem, e.g. bert_base_eager.ts (repeatable)")
    p.add_argument("--case", action="append", required=True,
                   help="case name, e.g. seq128: reads <family>.<case>.inputs.npz (repeatable)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ort-model-suffix", default="", help="e.g. .ortopt")
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--report-diff", action="store_true",
                   help="report the largest difference from ONNX Runtime without failing on it "
                        "(full-range int8 files on CPUs without VNNI, where ONNX Runtime's "
                        "integer products saturate: see models/quantize.py)")
    p.add_argument("--half", action="store_true",
                   help="also time each model converted to float16 (see the module docs)")
    p.add_argument("--half-atol", type=float, default=2e-2)
    p.add_argument("--half-rtol", type=float, default=2e-2)
    args = p.parse_args()
    print(f"onnxruntime {ort.__version__}, {args.threads} threads, {args.rounds} rounds of "
          f"{args.reps} runs after {args.warmup} warm-up")
    if args.baseline:
        print(f"baseline: {args.baseline}")
        print("| model | case | attnrt ms | ORT ms | ORT / attnrt (median of rounds) "
              "| baseline ms | ORT / baseline | baseline / attnrt | max abs vs ORT |")
        print("|---|---|---|---|---|---|---|---|---|")
    else:
        print("| model | case | attnrt ms | ORT ms | ORT / attnrt (median of rounds) "
              "| max abs vs ORT |")
        print("|---|---|---|---|---|---|")
    for stem in args.model:
        model = args.dir / f"{stem}.onnx"
        family = stem.split(".")[0]
        sess = ort_session(args.dir / f"{stem}{args.ort_model_suffix}.onnx", args.threads)
        for case in args.case:
            npz = args.dir / f"{family}.{case}.inputs.npz"
            feeds = dict(np.load(npz))
            worst = check_outputs(args, model, npz, sess, feeds)
            times = timed_rounds(args, model, npz, sess, feeds)
            print(f"| {stem}{args.ort_model_suffix and ' (ORT: ' + args.ort_model_suffix + ')'} "
                  f"| {case} | {row(times)} | {worst:.1e} |", flush=True)
    if args.half:
        print()
        print("| float16 model | case | attnrt fp16 ms | attnrt fp32 ms | ORT fp16 ms "
              "| ORT fp16 / attnrt fp16 | attnrt fp32 / attnrt fp16 | max abs vs ORT |")
        print("|---|---|---|---|---|---|---|---|")
        for stem in args.model:
            if is_quantized(args.dir / f"{stem}.onnx"):
                continue  # its scales would turn float16 too: an invalid model
            for case in args.case:
                half_row(args, stem, case)


def is_quantized(path: Path) -> bool:
    """Whether the model holds quantization ops (`--half` converts float models only)."""
    ops = {"DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger"}
    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type in ops for node in graph.node)


if __name__ == "__main__":
    main()
