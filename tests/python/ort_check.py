#!/usr/bin/env python3
"""Check a fused model against its original in ONNX Runtime.

    python tests/python/ort_check.py ORIGINAL.onnx FUSED.onnx INPUTS.npz [--atol A] [--rtol R]

1. ``onnx.checker.check_model(FUSED, full_check=True)`` (includes shape inference);
2. runs ORIGINAL and FUSED in ONNX Runtime (CPU) on the arrays of INPUTS.npz (keys = graph
   input names; extra keys are an error unless --allow-extra-inputs);
3. compares every output of FUSED with the output of ORIGINAL that has the same name
   (or, if names differ, the same position).

Prints exactly one JSON line on stdout::

    {"checker": "ok" | "<error>", "max_abs": float, "max_rel": float, "ok": bool,
     "outputs": {name: {"shape": [...], "max_abs": .., "max_rel": .., "ok": bool}}, ...}

and exits 0 when the checker passes and every output element satisfies
``|fused - original| <= atol + rtol * |original|`` (numpy.allclose semantics, NaN == NaN),
1 when the check or the comparison fails, 2 on bad usage or unreadable files.

Needs only onnx, onnxruntime and numpy (tests/python/requirements.txt), never torch.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np


def fail_usage(msg: str) -> "NoReturn":  # noqa: F821
    print(json.dumps({"checker": None, "ok": False, "error": msg}))
    print(f"ort_check: {msg}", file=sys.stderr)
    sys.exit(2)


def load_inputs(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:  # a missing, truncated or non-npz file
        fail_usage(f"cannot read inputs {path}: {type(e).__name__}: {e}")


def make_session(path: Path, threads: int | None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # errors come back as exceptions
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class InputMismatch(ValueError):
    """The npz keys do not match a model's graph inputs."""


def feeds_for(sess, inputs: dict[str, np.ndarray], which: str, allow_extra: bool) -> dict:
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputMismatch(f"{which} model wants inputs {missing}; the npz has {sorted(inputs)}")
    extra = [k for k in inputs if k not in names]
    if extra and not allow_extra:
        raise InputMismatch(f"npz keys {extra} are not inputs of the {which} model (inputs: {names})")
    return {n: inputs[n] for n in names}


def compare(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> dict:
    """Error of ``b`` (fused) relative to ``a`` (original)."""
    if a.shape != b.shape:
        return {"shape": list(b.shape), "expected_shape": list(a.shape), "max_abs": None,
                "max_rel": None, "ok": False, "error": "shape mismatch"}
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        a64 = a.astype(np.float64)
        b64 = b.astype(np.float64)
        both_nan = np.isnan(a64) & np.isnan(b64)
        same_inf = np.isinf(a64) & (a64 == b64)
        diff = np.where(both_nan | same_inf, 0.0, np.abs(a64 - b64))
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only is a failure
        rel = diff / np.maximum(np.abs(np.where(np.isfinite(a64), a64, 0.0)), 1e-30)
        ok = bool(np.all(diff <= atol + rtol * np.abs(np.where(np.isfinite(a64), a64, 0.0))))
    else:
        diff = np.abs(a.astype(np.int64) - b.astype(np.int64)).astype(np.float64)
        rel = diff / np.maximum(np.abs(a.astype(np.float64)), 1.0)
        ok = bool(np.all(diff == 0))
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    return {"shape": list(b.shape), "dtype": str(b.dtype), "max_abs": finite(max_abs),
            "max_rel": finite(max_rel), "ok": ok}


def finite(x: float):
    """JSON has no inf/NaN: report them as strings."""
    return x if math.isfinite(x) else str(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("original", type=Path)
    ap.add_argument("fused", type=Path)
    ap.add_argument("inputs", type=Path, help=".npz with one array per graph input")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=None, help="ORT intra-op threads")
    ap.add_argument("--allow-extra-inputs", action="store_true",
                    help="ignore npz keys that are not inputs of a model")
    args = ap.parse_args()

    import onnx
    import onnxruntime as ort

    for p in (args.original, args.fused):
        if not p.is_file():
            fail_usage(f"no such model file: {p}")
    inputs = load_inputs(args.inputs)

    result: dict = {"original": str(args.original), "fused": str(args.fused),
                    "onnx": onnx.__version__, "onnxruntime": ort.__version__,
                    "atol": args.atol, "rtol": args.rtol}
    try:
        # A path (not a loaded proto) so that external data and >2 GB models are handled.
        onnx.checker.check_model(str(args.fused), full_check=True)
        result["checker"] = "ok"
    except Exception as e:
        result["checker"] = f"{type(e).__name__}: {e}".strip()

    try:
        orig = make_session(args.original, args.threads)
        fused = make_session(args.fused, args.threads)
        ref_names = [o.name for o in orig.get_outputs()]
        got_names = [o.name for o in fused.get_outputs()]
        orig_feeds = feeds_for(orig, inputs, "original", args.allow_extra_inputs)
        fused_feeds = feeds_for(fused, inputs, "fused", args.allow_extra_inputs)
        ref = orig.run(None, orig_feeds)
        got = fused.run(None, fused_feeds)
    except InputMismatch as e:
        result.update(ok=False, error=f"inputs: {e}", max_abs=None, max_rel=None, outputs={})
        print(json.dumps(result))
        return 1
    except Exception as e:
        result.update(ok=False, error=f"onnxruntime: {type(e).__name__}: {e}".strip(),
                      max_abs=None, max_rel=None, outputs={})
        print(json.dumps(result))
        return 1

    outputs = {}
    if len(ref) != len(got):
        result["error"] = f"original has {len(ref)} outputs {ref_names}, fused has {len(got)} {got_names}"
    by_name = dict(zip(ref_names, ref))
    for k, (name, value) in enumerate(zip(got_names, got)):
        expected = by_name.get(name, ref[k] if k < len(ref) else None)
        if expected is None:
            outputs[name] = {"ok": False, "error": "no matching output in the original"}
            continue
        outputs[name] = compare(np.asarray(expected), np.asarray(value), args.atol, args.rtol)

    def worst(key: str):
        vals = [o.get(key) for o in outputs.values()]
        nums = [float(v) if not isinstance(v, (int, float)) else v for v in vals if v is not None]
        return finite(max(nums)) if nums else None

    result["max_abs"] = worst("max_abs")
    result["max_rel"] = worst("max_rel")
    result["outputs"] = outputs
    result["ok"] = (result["checker"] == "ok" and "error" not in result and bool(outputs)
                    and all(o.get("ok") for o in outputs.values()))
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
