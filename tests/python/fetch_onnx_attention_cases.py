#!/usr/bin/env python3
"""Fetch the ONNX `Attention` conformance cases and convert them for `attnrt run`.

    python tests/python/fetch_onnx_attention_cases.py DEST [--wheel onnx-1.22.0-....whl]
                                                          [--download-dir DIR] [--json]

onnx >= 1.23 wheels no longer ship ``onnx/backend/test/data/node``; the onnx 1.22.0 wheel has
the ``test_attention_*`` node tests (each a ``model.onnx`` plus ``test_data_set_0/input_N.pb``
and ``output_N.pb``).  This script

1. downloads that wheel with ``pip download --no-deps --only-binary=:all: onnx==1.22.0``
   (or uses ``--wheel``),
2. extracts every ``test_attention_*`` directory into ``DEST/<case>/``,
3. writes ``DEST/<case>/inputs.npz`` and ``outputs.npz`` next to ``model.onnx``, keyed by
   the graph's input and output names, so the Rust side can run
   ``attnrt run DEST/<case>/model.onnx --input-npz DEST/<case>/inputs.npz`` and compare,
4. writes ``DEST/cases.json`` (one entry per case: Q/K rank, mask kind, causal, past KV,
   softcap, qk_matmul_output_mode, head counts, dtypes and shapes) and prints a table.

Needs onnx and numpy (tests/python/requirements.txt) and pip.  Extracted data is not meant to
be committed: keep DEST outside the repository (or in an ignored folder).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np

ONNX_VERSION = "1.22.0"
PREFIX = "onnx/backend/test/data/node/"


def download_wheel(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           f"onnx=={ONNX_VERSION}", "-d", str(dest), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pip download failed ({' '.join(cmd)}):\n{proc.stderr.strip()}")
    wheels = sorted(dest.glob(f"onnx-{ONNX_VERSION}-*.whl"))
    if not wheels:
        raise SystemExit(f"pip download left no onnx-{ONNX_VERSION} wheel in {dest}")
    return wheels[0]


def extract_cases(wheel: Path, dest: Path) -> list[str]:
    """Extract every test_attention_* directory; returns the case names."""
    cases: set[str] = set()
    dest_resolved = dest.resolve()
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.filename.startswith(PREFIX + "test_attention_") or info.is_dir():
                continue
            rel = PurePosixPath(info.filename[len(PREFIX):])
            if ".." in rel.parts or rel.is_absolute():
                raise SystemExit(f"refusing suspicious path in wheel: {info.filename}")
            target = (dest / Path(*rel.parts)).resolve()
            if dest_resolved not in target.parents:
                raise SystemExit(f"refusing to write outside {dest}: {info.filename}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
            cases.add(rel.parts[0])
    return sorted(cases)


def read_tensor(path: Path) -> tuple[str, np.ndarray]:
    from onnx import TensorProto, numpy_helper

    t = TensorProto()
    t.ParseFromString(path.read_bytes())
    return t.name, numpy_helper.to_array(t)


def convert_case(case_dir: Path) -> dict:
    """Write inputs.npz/outputs.npz for one case and describe it."""
    import onnx

    model = onnx.load(str(case_dir / "model.onnx"))
    g = model.graph
    data = case_dir / "test_data_set_0"
    in_names = [i.name for i in g.input]
    out_names = [o.name for o in g.output]
    arrays = {}
    for kind, names in (("input", in_names), ("output", out_names)):
        files = sorted(data.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        if len(files) != len(names):
            raise SystemExit(f"{case_dir.name}: {len(files)} {kind} files for graph {kind}s {names}")
        arrs = {}
        for name, f in zip(names, files):
            tname, arr = read_tensor(f)
            if tname and tname != name:
                raise SystemExit(f"{case_dir.name}: {f.name} holds tensor {tname!r}, graph {kind} is {name!r}")
            arrs[name] = arr
        np.savez(case_dir / f"{kind}s.npz", **arrs)
        arrays[kind] = arrs
    return describe(case_dir.name, model, arrays["input"], arrays["output"])


def describe(name: str, model, inputs: dict, outputs: dict) -> dict:
    from onnx import helper

    g = model.graph
    node = next((n for n in g.node if n.op_type == "Attention"), None)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute} if node else {}
    # Attention's inputs by position: Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen.
    roles = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    graph_in = [i.name for i in g.input]
    if node is not None:
        role_of = {t: roles[k] for k, t in enumerate(node.input) if t and k < len(roles)}
    else:  # an _expanded case: the function body inlined; inputs keep the op's input order
        role_of = {t: roles[k] for k, t in enumerate(graph_in) if k < len(roles)}
    by_role = {role_of.get(n, n): inputs[n] for n in graph_in}
    mask = by_role.get("attn_mask")
    if mask is None:
        mask_kind = "none"
    elif mask.dtype == np.bool_:
        mask_kind = f"bool{list(mask.shape)}"
    else:
        mask_kind = f"float{list(mask.shape)}"
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return {
        "case": name,
        "expanded": name.endswith("_expanded"),
        "opset": opset,
        "attention_node": node is not None,
        "node_count": len(g.node),
        "qk_rank": f"{by_role['Q'].ndim}D/{by_role['K'].ndim}D" if "Q" in by_role and "K" in by_role else "?",
        "q_shape": list(by_role["Q"].shape) if "Q" in by_role else None,
        "k_shape": list(by_role["K"].shape) if "K" in by_role else None,
        "v_shape": list(by_role["V"].shape) if "V" in by_role else None,
        "dtype": str(by_role["Q"].dtype) if "Q" in by_role else None,
        "mask": mask_kind,
        "is_causal": int(attrs.get("is_causal", 0)),
        "past_kv": "past_key" in by_role,
        "nonpad_kv_seqlen": "nonpad_kv_seqlen" in by_role,
        "softcap": float(attrs.get("softcap", 0.0)),
        "scale": float(attrs["scale"]) if "scale" in attrs else None,
        "qk_matmul_output_mode": int(attrs.get("qk_matmul_output_mode", 0)),
        "q_num_heads": attrs.get("q_num_heads"),
        "kv_num_heads": attrs.get("kv_num_heads"),
        "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in inputs.items()},
        "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in outputs.items()},
    }


def table(cases: list[dict]) -> str:
    head = ("| case | opset | Q/K | dtype | mask | causal | past kv | nonpad_kv_seqlen | softcap | "
            "qk mode | heads q/kv | outputs |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for c in cases:
        heads = f"{c['q_num_heads']}/{c['kv_num_heads']}" if c["q_num_heads"] else "-"
        rows.append(f"| {c['case']} | {c['opset']} | {c['qk_rank']} | {c['dtype']} | {c['mask']} | "
                    f"{c['is_causal']} | {'yes' if c['past_kv'] else '-'} | "
                    f"{'yes' if c['nonpad_kv_seqlen'] else '-'} | {c['softcap'] or '-'} | "
                    f"{c['qk_matmul_output_mode']} | {heads} | {len(c['outputs'])} |")
    return "\n".join([head] + rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", type=Path, help="destination folder (created)")
    ap.add_argument("--wheel", type=Path, help=f"use this onnx {ONNX_VERSION} wheel instead of downloading")
    ap.add_argument("--download-dir", type=Path, help="keep the downloaded wheel here")
    ap.add_argument("--json", action="store_true", help="print cases.json instead of the table")
    args = ap.parse_args()

    args.dest.mkdir(parents=True, exist_ok=True)
    if args.wheel:
        if not args.wheel.is_file():
            raise SystemExit(f"no such wheel: {args.wheel}")
        wheel = args.wheel
    elif args.download_dir:
        existing = sorted(args.download_dir.glob(f"onnx-{ONNX_VERSION}-*.whl"))
        wheel = existing[0] if existing else download_wheel(args.download_dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="attnrt-onnx-wheel-")
        wheel = download_wheel(Path(tmp.name))
    names = extract_cases(wheel, args.dest)
    if not names:
        raise SystemExit(f"{wheel} has no {PREFIX}test_attention_* cases")
    described = [convert_case(args.dest / n) for n in names]
    (args.dest / "cases.json").write_text(json.dumps(described, indent=1) + "\n")
    if args.json:
        print(json.dumps(described, indent=1))
    else:
        print(table([c for c in described if not c["expanded"]]))
        n_exp = sum(c["expanded"] for c in described)
        print(f"\n{len(described)} cases ({len(described) - n_exp} with the Attention op, "
              f"{n_exp} _expanded) in {args.dest}; details in {args.dest / 'cases.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
