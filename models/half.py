#!/usr/bin/env python3
"""Write the float16 models of ``models/half/`` from shipped float32 exports.

Each file is what a user who halves a download gets: ONNX Runtime's own converter,
``onnxruntime.transformers.float16.convert_float_to_float16`` (float16 initializers and
intermediates, the Casts it inserts), run on a float32 model shipped in ``models/``. Next to each
file go ONNX Runtime's outputs on the source model's saved inputs (ORT, graph optimizations off,
CPU), so tests compare attnrt with an independent runtime on the same float16 graph.

    source scripts/python-env.sh
    target/py/bin/python models/half.py        # rewrites models/half/

Files (``<source>.fp16[.io16].onnx`` and ``<source>.fp16[.io16].<case>.ort.npz``):

* ``bert_eager.ts.fp16.onnx``: ``keep_io_types=True`` (graph inputs/outputs keep float32; the
  converter puts a Cast at each float boundary), case ``default``.
* ``llama_cache_eager.ts.fp16.io16.onnx``: ``keep_io_types=False`` (the KV cache inputs and the
  logits/present outputs are float16 themselves), cases ``prefill`` and ``decode_p7_n1``; the
  float inputs of the saved cases are rounded to float16 in the ``.inputs.npz`` written beside.

Deterministic: the converter is a pure function of the source file, and the source files are
checked in.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.transformers.float16 import convert_float_to_float16

MODELS = Path(__file__).resolve().parent

# (source file, saved cases, keep_io_types, tag in the output name)
SOURCES = [
    ("bert_eager.ts.onnx", {"default": "bert_eager"}, True, "fp16"),
    (
        "llama_cache_eager.ts.onnx",
        {
            "prefill": "llama_cache_eager.prefill",
            "decode_p7_n1": "llama_cache_eager.decode_p7_n1",
        },
        False,
        "fp16.io16",
    ),
]


def ort_outputs(path: Path, feeds: dict) -> dict:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def feeds_for(model: onnx.ModelProto, saved: dict) -> dict:
    """The saved inputs in the element types the converted graph declares."""
    types = {
        i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        for i in model.graph.input
    }
    return {k: v.astype(types[k]) for k, v in saved.items() if k in types}


def convert(source: str, cases: dict, keep_io_types: bool, tag: str, out: Path) -> dict:
    model = onnx.load(str(MODELS / source))
    half = convert_float_to_float16(model, keep_io_types=keep_io_types)
    stem = source.removesuffix(".onnx") + "." + tag
    path = out / f"{stem}.onnx"
    onnx.save(half, str(path))
    entry = {"file": path.name, "source": source, "keep_io_types": keep_io_types, "cases": []}
    for case, prefix in cases.items():
        saved = dict(np.load(MODELS / f"{prefix}.inputs.npz"))
        feeds = feeds_for(half, saved)
        inputs_npz = f"{stem}.{case}.inputs.npz"
        outputs_npz = f"{stem}.{case}.ort.npz"
        np.savez(out / inputs_npz, **feeds)
        outs = ort_outputs(path, feeds)
        np.savez(out / outputs_npz, **outs)
        # How far the float16 graph is from the float32 one, as ONNX Runtime runs both.
        full = ort_outputs(MODELS / source, {k: v.astype(saved[k].dtype) for k, v in feeds.items()})
        diff = max(
            float(np.max(np.abs(outs[k].astype(np.float64) - full[k].astype(np.float64))))
            for k in outs
        )
        entry["cases"].append(
            {"name": case, "inputs_npz": inputs_npz, "outputs_npz": outputs_npz,
             "ort_fp16_vs_fp32_max_abs": diff}
        )
        print(f"{path.name} {case}: ORT float16 vs float32 max |diff| {diff:.3g}")
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=MODELS / "half")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    entries = [convert(*s, args.out) for s in SOURCES]
    manifest = {
        "generated_by": "models/half.py",
        "versions": {"onnx": onnx.__version__, "onnxruntime": ort.__version__},
        "models": entries,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
