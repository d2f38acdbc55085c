#!/usr/bin/env python3
"""Dynamically quantized copies of shipped float models, as ONNX Runtime's CPU recipes make them.

For each model ``models/<name>.<exporter>.onnx`` this writes, beside it:

- ``<name>.<exporter>.qint8.onnx``: ``quantize_dynamic(weight_type=QInt8, per_channel=True)``,
  the default step of optimum's and sentence-transformers' CPU recipes (QOperator form:
  ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul`` per projection);
- ``<name>.<exporter>.qint8rr.onnx``: the same with ``reduce_range=True`` (weights in 7 bits);
- ``<name>.<exporter>.qdq.onnx`` (single-case models only): ``quantize_static`` in the QDQ form
  (``QuantFormat.QDQ``, per-channel int8 weights, uint8 activations, every ``MatMul`` quantized,
  calibrated on ``<name>.inputs.npz``): ``QuantizeLinear -> DequantizeLinear`` on activations and
  ``DequantizeLinear`` on the int8 weights, each into a float ``MatMul``;
- ONNX Runtime's outputs on each saved case of the source (``models/manifest.json``'s ``cases``):
  ``<name>.<exporter>.<variant>.outputs.npz`` for a single-case model (on ``<name>.inputs.npz``),
  ``<name>.<exporter>.<variant>.<case>.outputs.npz`` for a decoder with a key/value cache (its
  ``prefill`` and ``decode_*`` cases, inputs as the float model's); the QDQ file's with graph
  optimizations off, so ONNX Runtime computes what the graph says -- dequantize, then float
  products -- rather than its own int8 kernels;
- ``quantized.json``: the manifest of those files (source, variant, cases, ONNX Runtime version).

Why two: on CPUs without VNNI (this VM: AVX2) ONNX Runtime's u8 x s8 kernel sums pairs of products
in 16 bits with saturation (``vpmaddubsw``), so on full-range int8 weights its integer products
are not the graph's exact ones (on ``bert_eager.ts.qint8.onnx`` 55 of the 1280 sums of the first
query projection are off, by up to 14506) and its outputs move by up to ~0.7 from the exact
arithmetic. With 7-bit weights no pair saturates (255 * 64 * 2 < 32767), so the ``qint8rr``
outputs are the graph's own arithmetic on every CPU, a tight reference for attnrt.

Run with the test venv (``source scripts/python-env.sh``: numpy, onnx, onnxruntime):

    target/py/bin/python models/quantize.py       # every shipped quantized model (DEFAULT_MODELS)
    target/py/bin/python models/quantize.py --model gpt2_eager.ts   # just this one (manifest kept)
    target/py/bin/python models/quantize.py --src ../large-models/bert_base_eager.ts.onnx \\
        --out ../large-models    # a large model, no inputs/outputs written (and no QDQ file
                                 # without --calibration ../large-models/<case>.inputs.npz)
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)

MODELS = Path(__file__).resolve().parent

# variant -> reduce_range for quantize_dynamic, or None for the static QDQ form
VARIANTS = {"qint8": False, "qint8rr": True, "qdq": None}

# The shipped quantized models: an encoder and the two decoders with a key/value cache.
DEFAULT_MODELS = ["bert_eager.ts", "llama_cache_eager.ts", "gpt2_cache_eager.ts"]

MANIFEST = MODELS / "quantized.json"


class NpzReader(CalibrationDataReader):
    """The calibration data: the feeds of one .npz file, once."""

    def __init__(self, npz: Path):
        self.feeds = iter([dict(np.load(npz))])

    def get_next(self):
        return next(self.feeds, None)


def quantize(src: Path, dst: Path, reduce_range: bool | None, inputs: Path | None) -> None:
    # The quantizer logs a suggestion to pre-process the model on every call.
    logging.getLogger().setLevel(logging.ERROR)
    if reduce_range is None:
        quantize_static(str(src), str(dst), NpzReader(inputs), quant_format=QuantFormat.QDQ,
                        per_channel=True, weight_type=QuantType.QInt8,
                        activation_type=QuantType.QUInt8, op_types_to_quantize=["MatMul"])
    else:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=reduce_range)
    model = onnx.load(str(dst))
    onnx.checker.check_model(model)


def ort_outputs(model: Path, inputs: Path, dst: Path, as_written: bool = False) -> None:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if as_written:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    feeds = dict(np.load(inputs))
    names = [o.name for o in sess.get_outputs()]
    np.savez(dst, **dict(zip(names, sess.run(names, feeds))))


def source_cases(stem: str) -> list[dict]:
    """The saved cases of ``models/<stem>.onnx`` as ``models/manifest.json`` lists them."""
    manifest = json.loads((MODELS / "manifest.json").read_text())
    entry = next(m for m in manifest["models"] if m["file"] == f"{stem}.onnx")
    return entry.get("cases") or [{"name": "default", "inputs_npz": entry["inputs_npz"]}]


def quantize_shipped(stem: str) -> list[dict]:
    """The variants of ``models/<stem>.onnx`` (QDQ for a single-case model only), ONNX Runtime's
    outputs on its saved cases, and their manifest entries."""
    entries = []
    source = source_cases(stem)
    for variant, rr in VARIANTS.items():
        if rr is None and len(source) > 1:
            continue  # the QDQ form is calibrated on a single case
        dst = MODELS / f"{stem}.{variant}.onnx"
        quantize(MODELS / f"{stem}.onnx", dst, rr, MODELS / source[0]["inputs_npz"])
        cases = []
        for case in source:
            name = case["name"]
            tail = "" if name == "default" else f".{name}"
            outputs = f"{stem}.{variant}{tail}.outputs.npz"
            ort_outputs(dst, MODELS / case["inputs_npz"], MODELS / outputs, as_written=rr is None)
            cases.append({"name": name, "inputs_npz": case["inputs_npz"], "outputs_npz": outputs})
        entries.append({"file": dst.name, "source": f"{stem}.onnx", "variant": variant,
                        "reduce_range": rr, "cases": cases})
        print(f"{dst.name}: {dst.stat().st_size} bytes, {len(cases)} case(s), outputs from "
              f"onnxruntime {ort.__version__}")
    return entries


def write_manifest(entries: list[dict]) -> None:
    """``quantized.json`` with ``entries`` replacing those of the same files."""
    old = json.loads(MANIFEST.read_text())["models"] if MANIFEST.exists() else []
    files = {e["file"] for e in entries}
    models = [m for m in old if m["file"] not in files] + entries
    manifest = {
        "generated_by": "models/quantize.py",
        "recipe": "onnxruntime.quantization.quantize_dynamic(weight_type=QInt8, per_channel=True"
                  "[, reduce_range=True for qint8rr]); qdq: quantize_static(QuantFormat.QDQ, "
                  "per_channel=True, QInt8 weights, QUInt8 activations, MatMul only)",
        "outputs": "ONNX Runtime (CPU, 1 thread; default graph optimizations, off for qdq) on the "
                    "quantized file",
        "versions": {"onnx": onnx.__version__, "onnxruntime": ort.__version__},
        "models": sorted(models, key=lambda m: m["file"]),
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[],
                    help="<name>.<exporter> of a file in models/ (repeatable; default: DEFAULT_MODELS)")
    ap.add_argument("--src", type=Path, help="quantize this file instead (with --out)")
    ap.add_argument("--out", type=Path, help="folder for --src's quantized files")
    ap.add_argument("--calibration", type=Path,
                    help="--src's calibration inputs (.npz) for the QDQ file (none: no QDQ file)")
    args = ap.parse_args()
    if args.src:
        out = args.out or args.src.parent
        stem = args.src.name.removesuffix(".onnx")
        for variant, rr in VARIANTS.items():
            if rr is None and args.calibration is None:
                continue
            dst = out / f"{stem}.{variant}.onnx"
            quantize(args.src, dst, rr, args.calibration)
            print(f"{dst}: {dst.stat().st_size} bytes")
        return 0
    entries = [e for stem in args.model or DEFAULT_MODELS for e in quantize_shipped(stem)]
    write_manifest(entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
