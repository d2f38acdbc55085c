#!/usr/bin/env python3
"""Strip machine paths from the metadata of ONNX models (issue 28, item 5).

The dynamo exporter records a Python stack trace per node (``pkg.torch.onnx.stack_trace``)
whose frames name absolute files: the checkout the export ran in and the venv's
site-packages.  They say nothing about the model, change with the machine, and leak its
folder layout.  ``scrub_model`` rewrites every absolute path found in a doc string or a
``metadata_props`` value (model, graph, node, attribute, value info, tensor, function) to a
relative one and keeps everything else:

* inside a ``site-packages`` / ``dist-packages`` folder: from the package on
  (``torch/nn/modules/linear.py``), which is how the exporter already prints some frames;
* anywhere else: the file's folder and name (``models/export.py``), enough to find the line.

``models/export.py`` and ``models/export_large.py`` call it before saving.  Run as a script
on files already written (only onnx is needed, no torch); a file is rewritten only when a
path was found, and its ``manifest.json`` entry (``size_bytes``, ``sha256``) follows::

    python models/metadata_paths.py                  # every models/*.onnx
    python models/metadata_paths.py --check a.onnx   # list the paths, change nothing

The model is read without its external data and written back without touching it: the
references stay as they are, and so does the side file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterator

import onnx

MODELS_DIR = Path(__file__).resolve().parent

# An absolute POSIX path of two components or more, not inside a word, a relative path or a
# URL (`https://host/a/b` is preceded by `:` or `/`); or a Windows drive path.  The same
# rule as the test crates/attnrt-onnx/tests/no_machine_paths.rs.
_POSIX = r"(?<![\w.+@~:/-])(?:/[\w.+@-]+){2,}"
_WINDOWS = r"(?<![\w])[A-Za-z]:\\[\w.+@-][\w.+@\\-]*"
ABSOLUTE_PATH = re.compile(f"{_POSIX}|{_WINDOWS}")

_PACKAGE_ROOTS = ("site-packages", "dist-packages")


def relative_path(path: str) -> str:
    """The relative form of one absolute path (see the module's doc)."""
    parts = [p for p in re.split(r"[/\\]", path) if p]
    roots = [i for i, p in enumerate(parts) if p in _PACKAGE_ROOTS]
    kept = parts[roots[-1] + 1:] if roots and roots[-1] + 1 < len(parts) else parts[-2:]
    return "/".join(kept)


def scrub_text(text: str) -> str:
    """``text`` with every absolute path made relative."""
    return ABSOLUTE_PATH.sub(lambda m: relative_path(m.group(0)), text)


def _graphs_of_node(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for a in node.attribute:
        if a.HasField("g"):
            yield a.g
        yield from a.graphs


def _tensors_of_node(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for a in node.attribute:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors


def _described_in_graph(g: onnx.GraphProto) -> Iterator:
    """Every message of a graph (itself included) with a doc string or metadata."""
    yield g
    yield from g.initializer
    yield from (s.values for s in g.sparse_initializer)
    yield from g.input
    yield from g.output
    yield from g.value_info
    for n in g.node:
        yield from _described_in_node(n)


def _described_in_node(n: onnx.NodeProto) -> Iterator:
    yield n
    yield from n.attribute
    yield from _tensors_of_node(n)
    for sub in _graphs_of_node(n):
        yield from _described_in_graph(sub)


def described(m: onnx.ModelProto) -> Iterator:
    """Every message of a model with a ``doc_string`` (and, most, ``metadata_props``)."""
    yield m
    yield from _described_in_graph(m.graph)
    for f in m.functions:
        yield f
        yield from f.value_info
        for n in f.node:
            yield from _described_in_node(n)


def scrub_model(m: onnx.ModelProto) -> int:
    """Makes every absolute path in the model's doc strings and metadata values relative, in
    place; returns how many strings changed."""
    changed = 0
    for msg in described(m):
        clean = scrub_text(msg.doc_string)
        if clean != msg.doc_string:
            msg.doc_string, changed = clean, changed + 1
        for p in getattr(msg, "metadata_props", ()):
            clean = scrub_text(p.value)
            if clean != p.value:
                p.value, changed = clean, changed + 1
    return changed


def found_paths(m: onnx.ModelProto) -> list[str]:
    """The absolute paths the model's doc strings and metadata values name."""
    texts = []
    for msg in described(m):
        texts.append(msg.doc_string)
        texts.extend(p.value for p in getattr(msg, "metadata_props", ()))
    return sorted({x.group(0) for t in texts for x in ABSOLUTE_PATH.finditer(t)})


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rewrite(path: Path, m: onnx.ModelProto) -> None:
    """Writes the model atomically (a temporary file renamed over the old one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(m.SerializeToString())
    os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)


def update_manifest(rewritten: list[Path]) -> None:
    """Refreshes size and hash of the rewritten files listed in their folder's manifest.json."""
    for folder in sorted({p.parent for p in rewritten}):
        manifest = folder / "manifest.json"
        if not manifest.exists():
            continue
        doc = json.loads(manifest.read_text())
        names = {p.name for p in rewritten if p.parent == folder}
        for e in doc.get("models", []):
            if e.get("file") in names:
                e["size_bytes"] = (folder / e["file"]).stat().st_size
                e["sha256"] = sha256(folder / e["file"])
        manifest.write_text(json.dumps(doc, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, help="default: models/*.onnx")
    ap.add_argument("--check", action="store_true", help="list the paths found, write nothing")
    args = ap.parse_args()
    files = args.files or sorted(MODELS_DIR.glob("*.onnx"))
    rewritten, dirty = [], 0
    for f in files:
        m = onnx.load_model(str(f), load_external_data=False)
        if args.check:
            paths = found_paths(m)
            dirty += bool(paths)
            for p in paths:
                print(f"{f}: {p}")
        elif (n := scrub_model(m)):
            rewrite(f, m)
            rewritten.append(f)
            print(f"{f}: {n} strings made path-free")
    if args.check:
        print(f"{dirty} of {len(files)} files name an absolute path")
        return 1 if dirty else 0
    update_manifest(rewritten)
    print(f"{len(rewritten)} of {len(files)} files rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
