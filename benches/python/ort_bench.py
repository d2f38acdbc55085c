#!/usr/bin/env python3
"""ONNX Runtime on the same single MHA layer the Rust benchmarks time.

The layer: x [1, L, 768] -> Q/K/V projections (MatMul + bias) -> attention (12 heads of 64,
scale 1/8, no mask) -> output projection (MatMul + bias), written two ways with the onnx helper:

  attention_op  the standard ONNX `Attention` op (opset 23) on the 3-D projections
  decomposed    Reshape/Transpose head split, MatMul, Mul, Softmax, MatMul, Transpose/Reshape
                merge (opset 17, as the TorchScript exporter writes it)

Each (form, L) runs in a child process (so its peak RSS is its own), on CPU with
`intra_op_num_threads` threads and ONNX Runtime's default graph optimizations; the median of the
timed runs is printed (and with --json, one JSON object on stdout for the Rust benches).

Usage:
  python benches/python/ort_bench.py [--lens 512,2048] [--threads 2] [--reps 10] [--json]
  python benches/python/ort_bench.py --serve --forms attention_op --lens 2048 [--threads 2]

--serve keeps one session (one form, one length) and times it on demand, so that the Rust benches
can alternate its runs with attnrt's and compare them at the same moment: it prints one JSON line
{"ready": true, "onnxruntime": version} after the warm-up, then answers each stdin line "run N"
with {"ms": [N per-run times]}, and "quit" (or end of input) with {"peak_rss_mb": ...}.

Exit status 3 when onnxruntime or onnx cannot be imported (the Rust benches then skip ORT).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

D_MODEL = 768
HEADS = 12
FORMS = ("attention_op", "decomposed")


def build_layer(form, seed=0):
    """The MHA layer as an onnx ModelProto with a symbolic `sequence` dim."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(D_MODEL)
    inits, nodes = [], []

    def weight(name, shape):
        inits.append(numpy_helper.from_array(rng.uniform(-bound, bound, shape).astype(np.float32), name))
        return name

    def linear(x, name):
        w = weight(f"{name}.weight", (D_MODEL, D_MODEL))
        b = weight(f"{name}.bias", (D_MODEL,))
        nodes.append(helper.make_node("MatMul", [x, w], [f"{name}.mm"]))
        nodes.append(helper.make_node("Add", [f"{name}.mm", b], [f"{name}.out"]))
        return f"{name}.out"

    q, k, v = (linear("x", p) for p in ("q_proj", "k_proj", "v_proj"))
    head = D_MODEL // HEADS
    if form == "attention_op":
        nodes.append(
            helper.make_node("Attention", [q, k, v], ["context"], q_num_heads=HEADS, kv_num_heads=HEADS)
        )
        opset = 23
    elif form == "decomposed":
        inits.append(numpy_helper.from_array(np.array([0, -1, HEADS, head], np.int64), "split"))
        inits.append(numpy_helper.from_array(np.array([0, -1, D_MODEL], np.int64), "merge"))
        inits.append(numpy_helper.from_array(np.array(1.0 / np.sqrt(head), np.float32), "scale"))
        for t, perm in ((q, [0, 2, 1, 3]), (k, [0, 2, 3, 1]), (v, [0, 2, 1, 3])):
            nodes.append(helper.make_node("Reshape", [t, "split"], [f"{t}.r"]))
            nodes.append(helper.make_node("Transpose", [f"{t}.r"], [f"{t}.t"], perm=perm))
        nodes += [
            helper.make_node("MatMul", [f"{q}.t", f"{k}.t"], ["scores"]),
            helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
            helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
            helper.make_node("MatMul", ["probs", f"{v}.t"], ["ctx4"]),
            helper.make_node("Transpose", ["ctx4"], ["ctx4t"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", ["ctx4t", "merge"], ["context"]),
        ]
        opset = 17
    else:
        raise ValueError(f"unknown form {form!r}; expected one of {FORMS}")
    y = linear("context", "out_proj")
    shape = [1, "sequence", D_MODEL]
    graph = helper.make_graph(
        nodes,
        f"mha_layer_{form}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="attnrt-benches")
    model.ir_version = 11 if opset >= 23 else 8
    return model


def make_session(form, length, threads):
    """A checked ORT session of the layer and an input of `length` tokens."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    model = build_layer(form)
    onnx.checker.check_model(model, full_check=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).uniform(-1, 1, (1, length, D_MODEL)).astype(np.float32)
    return sess, {"x": x}


def check_output(out, form, length):
    import numpy as np

    if out.shape != (1, length, D_MODEL) or not np.isfinite(out).all():
        raise RuntimeError(f"{form} L={length}: bad output shape {out.shape} or non-finite values")


def serve(form, length, threads, warmup):
    """The --serve loop (see the module docs)."""
    import onnxruntime as ort

    sess, feed = make_session(form, length, threads)
    for _ in range(max(warmup, 1)):
        check_output(sess.run(None, feed)[0], form, length)
    print(json.dumps({"ready": True, "onnxruntime": ort.__version__}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] != "run" or len(cmd) != 2 or not cmd[1].isdigit():
            print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
            continue
        times = []
        for _ in range(int(cmd[1])):
            t = time.perf_counter()
            sess.run(None, feed)
            times.append((time.perf_counter() - t) * 1e3)
        print(json.dumps({"ms": times}), flush=True)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


def run_case(form, length, threads, warmup, reps):
    """Builds, checks and times one case in this process; returns a dict."""
    import onnxruntime as ort

    sess, feed = make_session(form, length, threads)
    for _ in range(warmup):
        sess.run(None, feed)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = sess.run(None, feed)[0]
        times.append((time.perf_counter() - t) * 1e3)
    check_output(out, form, length)
    return {
        "form": form,
        "len": length,
        "threads": threads,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "reps": reps,
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "onnxruntime": ort.__version__,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lens", default="512,2048", help="comma-separated sequence lengths")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, from {FORMS}")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help="time one form and length on demand (see above)")
    args = ap.parse_args()

    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        print(f"ort_bench: cannot import {e.name}: install onnx, onnxruntime and numpy", file=sys.stderr)
        sys.exit(3)

    try:
        lens = [int(s) for s in args.lens.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--lens {args.lens!r}: expected comma-separated integers")
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    for f in forms:
        if f not in FORMS:
            ap.error(f"--forms: unknown form {f!r}; expected one of {FORMS}")
    if args.threads < 1 or args.reps < 1 or args.warmup < 0:
        ap.error("--threads and --reps must be >= 1, --warmup >= 0")

    if args.serve:
        if len(forms) != 1 or len(lens) != 1:
            ap.error("--serve takes exactly one form (--forms) and one length (--lens)")
        serve(forms[0], lens[0], args.threads, args.warmup)
        return

    if args.child:
        # One case, JSON on stdout for the parent.
        print(json.dumps(run_case(forms[0], lens[0], args.threads, args.warmup, args.reps)))
        return

    results = []
    for length in lens:
        for form in forms:
            cmd = [
                sys.executable, os.path.abspath(__file__), "--child", "--forms", form, "--lens", str(length),
                "--threads", str(args.threads), "--warmup", str(args.warmup), "--reps", str(args.reps),
            ]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"ort_bench: {form} L={length} failed:\n{p.stderr}", file=sys.stderr)
                sys.exit(1)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            results.append(r)
            if not args.json:
                print(
                    f"onnxruntime {r['onnxruntime']} {form:<13} L={length:<5} threads={args.threads} "
                    f"median {r['median_ms']:9.2f} ms  (min {r['min_ms']:.2f}, {r['reps']} reps)  "
                    f"peak RSS {r['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"threads": args.threads, "results": results}))


if __name__ == "__main__":
    main()
