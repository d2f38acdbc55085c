#!/usr/bin/env python3
"""Dynamically quantized copies of shipped float models, as ONNX Runtime's CPU recipes make them.

For each model ``models/<name>.<exporter>.onnx`` this writes, beside it:

- ``<name>.<exporter>.qint8.onnx``: ``quantize_dynamic(weight_type=QInt8, per_channel=True)``,
  the default step of optimum's and sentence-transformers' CPU recipes (QOperator form:
  ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul`` per projection);
- ``<name>.<exporter>.qint8rr.onnx``: the same with ``reduce_range=True`` (weights in 7 bits);
- ``<name>.<exporter>.qint8.outputs.npz`` and ``.qint8rr.outputs.npz``: ONNX Runtime's outputs on
  ``<name>.inputs.npz``.

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
        --out ../large-models    # a large model, no inputs/outputs written
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

MODELS = Path(__file__).resolve().parent

VARIANTS = {"qint8": False, "qint8rr": True}


def quantize(src: Path, dst: Path, reduce_range: bool) -> None:
    # The quantizer logs a suggestion to pre-process the model on every call.
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                     reduce_range=reduce_range)
    model = onnx.load(str(dst))
    onnx.checker.check_model(model)


def ort_outputs(model: Path, inputs: Path, dst: Path) -> None:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
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
    args = ap.parse_args()
    if args.src:
        out = args.out or args.src.parent
        stem = args.src.name.removesuffix(".onnx")
        for variant, rr in VARIANTS.items():
            dst = out / f"{stem}.{variant}.onnx"
            quantize(args.src, dst, rr)
            print(f"{dst}: {dst.stat().st_size} bytes")
        return 0
    for stem in args.model or ["bert_eager.ts"]:
        src = MODELS / f"{stem}.onnx"
        inputs = MODELS / f"{stem.split('.')[0]}.inputs.npz"
        for variant, rr in VARIANTS.items():
            dst = MODELS / f"{stem}.{variant}.onnx"
            quantize(src, dst, rr)
            ort_outputs(dst, inputs, MODELS / f"{stem}.{variant}.outputs.npz")
            print(f"{dst.name}: {dst.stat().st_size} bytes, outputs from onnxruntime {ort.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
