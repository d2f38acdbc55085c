"""Per-call cost of attnrt's Python session against a direct Rust call and onnxruntime's Python
session, on the same small model and inputs (issue 19's benchmark row).

    source scripts/python-env.sh
    $ATTNRT_PYTHON -m maturin build --release -m crates/attnrt-python/Cargo.toml -o target/wheels-release
    $ATTNRT_PYTHON -m pip install --force-reinstall --no-deps target/wheels-release/attnrt-*.whl
    cargo build --release -p attnrt-cli
    $ATTNRT_PYTHON benches/python/session_overhead.py --attnrt target/release/attnrt

Rounds alternate attnrt-Python / onnxruntime / (Rust, from `attnrt bench --json`), because this
machine's speed drifts; each figure is the median over rounds of the per-call median. The Rust
row is the fused session's own run time measured inside the process (no Python at all), so
"Python − Rust" is what the binding adds per call: feed checks, numpy ↔ tensor copies, the GIL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import attnrt

ROOT = Path(__file__).resolve().parents[2]


def per_call_us(run, calls: int) -> float:
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def rust_us(binary: str, model: Path, npz: Path, threads: int, reps: int) -> float:
    out = subprocess.run(
        [binary, "bench", str(model), "--input-npz", str(npz), "--threads", str(threads),
         "--reps", str(reps), "--json"],
        capture_output=True, text=True, check=True)
    fused = json.loads(out.stdout)["fused"]
    return fused["median_ms"] * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attnrt", required=True, help="the attnrt binary (release build)")
    ap.add_argument("--model", default="mha_seed.ts.onnx", help="a model in models/")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    model = ROOT / "models" / args.model
    npz = ROOT / "models" / args.model.replace(".ts.onnx", ".inputs.npz").replace(".dynamo.onnx", ".inputs.npz")
    feeds = dict(np.load(npz))
    mine = attnrt.InferenceSession(model, threads=args.threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    theirs = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(mine.run(None, feeds)[0], theirs.run(None, feeds)[0], atol=1e-4, rtol=1e-4)

    rows = {"attnrt (Python)": [], "onnxruntime (Python)": [], "attnrt (Rust, in process)": []}
    for _ in range(args.rounds):
        rows["attnrt (Python)"].append(per_call_us(lambda: mine.run(None, feeds), args.calls))
        rows["onnxruntime (Python)"].append(per_call_us(lambda: theirs.run(None, feeds), args.calls))
        rows["attnrt (Rust, in process)"].append(rust_us(args.attnrt, model, npz, args.threads, args.calls))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"model {args.model}, {args.threads} thread(s), {args.calls} calls x {args.rounds} rounds")
    print("| path | median µs per call |")
    print("|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} |")
    print(f"binding overhead (attnrt Python - Rust): {med['attnrt (Python)'] - med['attnrt (Rust, in process)']:.1f} µs per call")
    print(f"onnxruntime / attnrt (both Python): {med['onnxruntime (Python)'] / med['attnrt (Python)']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
