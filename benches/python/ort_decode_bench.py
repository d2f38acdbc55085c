#!/usr/bin/env python3
"""ONNX Runtime on one decode step of attention: the model the Rust `decode` bench writes (one
ONNX `Attention` node, opset 23, inputs q, k, v, past_key, past_value; outputs y, present_key,
present_value), timed at the given past lengths.

Usage:
  python benches/python/ort_decode_bench.py --model decode.onnx --past 1024 [--threads 2]
      [--reps 50]

Prints one JSON line: {"onnxruntime": version, "past": P, "threads": T, "ms": [per-run times]}.
CPU execution provider, default graph optimizations, `intra_op_num_threads` = --threads; inputs
are seeded uniform noise built once (ORT reads numpy buffers in place), 5 warm-up runs.

Exit status 3 when onnxruntime or onnx cannot be imported (the Rust bench then skips ORT).
"""

import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--past", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        print(f"onnxruntime/onnx/numpy not importable: {e}", file=sys.stderr)
        sys.exit(3)

    model = onnx.load(args.model)
    shapes = {}
    for inp in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else args.past for d in inp.type.tensor_type.shape.dim]
        shapes[inp.name] = dims
    rng = np.random.default_rng(0)
    feeds = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in shapes.items()}

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    for _ in range(5):
        sess.run(None, feeds)
    ms = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        ms.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"onnxruntime": ort.__version__, "past": args.past, "threads": args.threads, "ms": ms}))


if __name__ == "__main__":
    main()
