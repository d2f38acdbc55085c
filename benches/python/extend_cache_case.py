#!/usr/bin/env python3
"""Writes a decode case with a longer cache from an exported one, for the whole-model benches.

models/export_large.py saves decode cases with a past of 127 and 511 positions; timing a step
after a cache of 1023 or 4095 needs the same inputs with a longer past. This takes
``MODEL.CASE.inputs.npz`` (one new token: ``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.N.key/value`` of shape ``[B, H, P, D]``) and writes
``MODEL.decode_p{P'}_n1.inputs.npz`` next to it: every past tensor grown (or cut) to ``P'``
positions with seeded normal values of the original's mean and spread, the mask all ones over
``P' + 1`` keys, the position ``P'``. Outputs are not written: the bench checks attnrt against
ONNX Runtime on the same inputs.

    python benches/python/extend_cache_case.py ../large-models/gpt2_small_cache_eager \\
        --from decode_p511_n1 --past 1023 --past 4095
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def extend(inputs: dict[str, np.ndarray], past: int, rng: np.random.Generator) -> dict:
    out = {}
    for name, a in inputs.items():
        if name.startswith("past_key_values."):
            if a.ndim != 4:
                raise SystemExit(f"{name} has shape {a.shape}; expected [B, H, P, D]")
            grown = rng.normal(a.mean(), a.std() or 1.0, size=(*a.shape[:2], past, a.shape[3]))
            keep = min(past, a.shape[2])
            grown[:, :, :keep] = a[:, :, :keep]
            out[name] = grown.astype(a.dtype)
        elif name == "attention_mask":
            out[name] = np.ones((a.shape[0], past + a.shape[1] - inputs_past(inputs)), a.dtype)
        elif name == "position_ids":
            out[name] = np.full(a.shape, past, a.dtype)
        else:
            out[name] = a
    return out


def inputs_past(inputs: dict[str, np.ndarray]) -> int:
    pasts = {a.shape[2] for n, a in inputs.items() if n.startswith("past_key_values.")}
    if len(pasts) != 1:
        raise SystemExit(f"the past tensors disagree on their length: {sorted(pasts)}")
    return pasts.pop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="path without the .CASE.inputs.npz suffix")
    ap.add_argument("--from", dest="case", default="decode_p511_n1")
    ap.add_argument("--past", type=int, action="append", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    src = Path(f"{args.model}.{args.case}.inputs.npz")
    with np.load(src) as z:
        inputs = {k: z[k] for k in z.files}
    for past in args.past:
        dst = Path(f"{args.model}.decode_p{past}_n1.inputs.npz")
        np.savez(dst, **extend(inputs, past, np.random.default_rng(args.seed)))
        print(f"{dst}: past {past}")


if __name__ == "__main__":
    main()
