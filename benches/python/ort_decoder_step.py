#!/usr/bin/env python3
"""ONNX Runtime on the decode steps of a whole decoder exported with its key/value cache (the
models the Rust `decoder_step` bench times: input_ids, attention_mask, position_ids,
past_key_values.* in; logits, present.* out).

Usage:
  python benches/python/ort_decoder_step.py --serve --model models/gpt2_cache_eager.ts.onnx
      --past 1024 [--threads 2] [--optimize gpt2]

--serve keeps one session and times decode steps on demand, so that the Rust bench can
alternate its rounds with attnrt's: it prints one JSON line {"ready": true, "onnxruntime":
version, "optimized": ...} after the warm-up, then answers each stdin line "run N" with
{"ms": [N per-step times]}: N greedy steps of one token each, starting from a past of --past
random keys/values (seeded, the same every round), every present fed back as the next past, as a
generation loop does; position ids wrap modulo 128 (the tiny GPT-2s' learned positions). "quit" (or end of input) ends it.

--optimize MODEL_TYPE first runs onnxruntime.transformers.optimizer.optimize_model on the model
(--num-heads/--hidden-size, default 4/64 as in the shipped tiny decoders; the optimizer needs
sympy) and times the optimized model; "optimized" in the ready line lists the fused op counts it
reported.

CPU execution provider, default graph optimizations, `intra_op_num_threads` = --threads.
Exit status 3 when onnxruntime, onnx or numpy cannot be imported (the Rust bench then skips ORT).
"""

import argparse
import json
import os
import sys
import tempfile
import time

# The tiny GPT-2 decoders have 128 learned positions; position ids wrap modulo this so that any
# cache length runs (the cost of a step does not depend on the position's value). The Rust bench
# feeds the same ids.
POSITIONS = 128


def dims(value_info):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value_info.type.tensor_type.shape.dim]


def optimize(path, model_type, num_heads, hidden_size):
    """The transformers optimizer's output for `path` (a temporary file) and its fused op counts.
    opt_level 0: the optimizer's own fusions only (levels above run ORT's offline optimization,
    which imports torch; ORT applies its default graph optimizations at session start anyway)."""
    from onnxruntime.transformers import optimizer

    opt = optimizer.optimize_model(
        path, model_type=model_type, num_heads=num_heads, hidden_size=hidden_size, opt_level=0
    )
    fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    fd, out = tempfile.mkstemp(suffix=".onnx")
    os.close(fd)
    opt.save_model_to_file(out)
    return out, fused


class Decoder:
    """One ORT session and the cache names of the model (past_key_values.* ↔ present.*)."""

    def __init__(self, path, threads):
        import onnx
        import onnxruntime as ort

        model = onnx.load(path, load_external_data=False)
        inits = {i.name for i in model.graph.initializer}
        self.inputs = {i.name: (dims(i), i.type.tensor_type.elem_type) for i in model.graph.input if i.name not in inits}
        self.pasts = [n for n in self.inputs if n.startswith("past")]
        outs = [o.name for o in model.graph.output]
        self.presents = [o for o in outs if o.startswith("present")]
        if len(self.pasts) != len(self.presents) or not self.pasts:
            raise SystemExit(f"{path}: cache inputs {self.pasts} do not pair with outputs {self.presents}")
        self.logits = outs[0]
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    def first_cache(self, past, seed=0):
        import numpy as np

        rng = np.random.default_rng(seed)
        cache = {}
        for n in self.pasts:
            shape = [1 if d == "batch" else (past if isinstance(d, str) else d) for d in self.inputs[n][0]]
            cache[n] = rng.uniform(-1, 1, shape).astype(np.float32)
        return cache

    def steps(self, past, n):
        """n greedy steps from a fresh cache of `past` keys; per-step ms."""
        import numpy as np

        cache = self.first_cache(past)
        token, times = 1, []
        for _ in range(n):
            feed = {"input_ids": np.array([[token]], dtype=np.int64)}
            if "attention_mask" in self.inputs:
                feed["attention_mask"] = np.ones((1, past + 1), dtype=np.int64)
            if "position_ids" in self.inputs:
                feed["position_ids"] = np.array([[past % POSITIONS]], dtype=np.int64)
            feed.update(cache)
            t = time.perf_counter()
            outs = self.sess.run(None, feed)
            times.append((time.perf_counter() - t) * 1e3)
            named = dict(zip([o.name for o in self.sess.get_outputs()], outs))
            cache = {p: named[q] for p, q in zip(self.pasts, self.presents)}
            token = int(np.argmax(named[self.logits][0, -1]))
            past += 1
        return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", action="store_true", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--past", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--optimize", default=None, help="model_type for the transformers optimizer")
    ap.add_argument("--num-heads", type=int, default=4, help="for --optimize (the tiny decoders: 4)")
    ap.add_argument("--hidden-size", type=int, default=64, help="for --optimize (the tiny decoders: 64)")
    args = ap.parse_args()
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
        import onnxruntime as ort
    except ImportError as e:
        print(f"onnxruntime/onnx/numpy not importable: {e}", file=sys.stderr)
        sys.exit(3)

    path, fused = args.model, None
    if args.optimize:
        path, fused = optimize(args.model, args.optimize, args.num_heads, args.hidden_size)
    dec = Decoder(path, args.threads)
    dec.steps(args.past, 5)
    print(json.dumps({"ready": True, "onnxruntime": ort.__version__, "optimized": fused}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] != "run" or len(cmd) != 2 or not cmd[1].isdigit():
            print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
            continue
        print(json.dumps({"ms": dec.steps(args.past, int(cmd[1]))}), flush=True)
    if args.optimize:
        os.remove(path)


if __name__ == "__main__":
    main()
