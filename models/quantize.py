#!/usr/bin/env python3
"""Dynamically quantized copies of shipped float models, as ONNX Runtime's CPU recipes make them.

For each model ``models/<name>.<exporter>.onnx`` this writes, beside it:

- ``<name>.<exporter>.qint8.onnx``: ``quantize_dynamic(weight_type=QInt8, per_channel=True)``,
  the default step of optimum's and sentence-transformers' CPU recipes (QOperator form:
  ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul`` per projection);
- ``<name>.<exporter>.qint8rr.onnx``: the same with ``reduce_range=True`` (weights in 7 bits);
- ``<name>.<exporter>.qdq.onnx``: ``quantize_static`` in the QDQ form (``QuantFormat.QDQ``,
  per-channel int8 weights, uint8 activations, every ``MatMul`` quantized, calibrated on
  ``<name>.inputs.npz``): ``QuantizeLinear -> DequantizeLinear`` on activations and
  ``DequantizeLinear`` on the int8 weights, each into a float ``MatMul``;
- ``<name>.<exporter>.qint8.outputs.npz``, ``.qint8rr.outputs.npz`` and ``.qdq.outputs.npz``:
  ONNX Runtime's outputs on ``<name>.inputs.npz`` (the QDQ file's with graph optimizations off,
  so ONNX Runtime computes what the graph says -- dequantize, then float products -- rather
  than its own int8 kernels).

Why two: on CPUs without VNNI (this VM: AVX2) ONNX Runtime's u8 x s8 kernel sums pairs of products
in 16 bits with saturation (``vpmaddubsw``), so on full-range int8 weights its integer products
are not the graph's exact ones (on ``bert_eager.ts.qint8.onnx`` 55 of the 1280 sums of the first
query projection are off, by up to 14506) and its outputs move by up to ~0.7 from the exact
arithmetic. With 7-bit weights no pair saturates (255 * 64 * 2 < 32767), so the ``qint8rr``
outputs are the graph's own arithmetic on every CPU, a tight reference for attnrt.

Run with the test venv (``source scripts/python-env.sh``: numpy, onnx, onnxruntime):

    target/py/bin/python models/quantize.py                  # bert_eager.ts (the shipped pair)
    target/py/bin/python models/quantize.py --model gpt2_eager.ts
    target/py/bin/python models/quantize.py --src ../large-models/bert_base_eager.ts.onnx \\
        --out ../large-models    # a large model, no inputs/outputs written (and no QDQ file
                                 # without --calibration ../large-models/<case>.inputs.npz)
"""
from __future__ import annotations

import argparse
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[],
                    help="<name>.<exporter> of a file in models/ (repeatable; default bert_eager.ts)")
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
    for stem in args.model or ["bert_eager.ts"]:
        src = MODELS / f"{stem}.onnx"
        inputs = MODELS / f"{stem.split('.')[0]}.inputs.npz"
        for variant, rr in VARIANTS.items():
            dst = MODELS / f"{stem}.{variant}.onnx"
            quantize(src, dst, rr, inputs)
            ort_outputs(dst, inputs, MODELS / f"{stem}.{variant}.outputs.npz",
                        as_written=rr is None)
            print(f"{dst.name}: {dst.stat().st_size} bytes, outputs from onnxruntime {ort.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
