#!/usr/bin/env python3
"""Fails on an import cycle between the source files of a crate, or on a function longer than
MAX_LINES lines, in crates/ (issue 29).

Imports: every `crate::a::b` and `super::...` path in a file (in `use` items and inline) is
resolved to the file that defines the module; an arrow from a file to a module file it sits in
(its lib.rs or a mod.rs above it) is how a module reads its parent's items and does not count
toward a cycle. Functions: from the line of `fn name` to its closing brace (rustfmt puts it at
the same indentation); bodies inside `macro_rules!` (the per-ISA SIMD kernels) and functions
marked `#[target_feature]` are left out.

    python3 scripts/check_structure.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 120

# Known and owned: reported, not failed on. Remove an entry when its cause is gone; nothing new
# goes here. (Empty since the KernelSet step of issue 29 split the last two.)
KNOWN: set[str] = set()

FN = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?((const|async|unsafe|extern\s+\"C\")\s+)*fn\s+(\w+)")
PATH = re.compile(r"\b(crate|super)((?:::\w+)+)")


def modules(src: Path) -> dict[tuple[str, ...], Path]:
    """Module path (from the crate root) → the file that defines it."""
    found = {}
    for f in src.rglob("*.rs"):
        parts = f.relative_to(src).with_suffix("").parts
        if parts in (("lib",), ("main",)):
            parts = ()
        elif parts[-1] == "mod":
            parts = parts[:-1]
        found[tuple(parts)] = f
    return found


def module_of(path: Path, src: Path) -> tuple[str, ...]:
    parts = path.relative_to(src).with_suffix("").parts
    if parts in (("lib",), ("main",)):
        return ()
    return parts[:-1] if parts[-1] == "mod" else parts


def strip_comments(text: str) -> str:
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def imports(f: Path, src: Path, mods: dict) -> set[Path]:
    here = module_of(f, src)
    targets = set()
    text = strip_comments(f.read_text())
    # `use super::{a, b::c}` and `use crate::{x, y}` groups: expand one level of braces.
    for m in re.finditer(r"\b(crate|super(?:::super)*)((?:::\w+)*)::\{([^}]*)\}", text):
        for item in m.group(3).split(","):
            item = item.strip().split(" as ")[0].split("::{")[0]
            if item and item != "self":
                text += f"\n{m.group(1)}{m.group(2)}::{item}"
    for m in PATH.finditer(text):
        head, rest = m.group(1), [p for p in m.group(2).split("::") if p]
        if head == "crate":
            base: tuple[str, ...] = ()
        else:
            base = here[:-1]  # `super` of a/b.rs and of a/b/mod.rs is a
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        path = base + tuple(rest)
        while path and path not in mods:
            path = path[:-1]
        target = mods.get(path)
        if target is not None and target != f and not is_ancestor(path, here):
            targets.add(target)
    return targets


def is_ancestor(module: tuple[str, ...], of: tuple[str, ...]) -> bool:
    return len(module) < len(of) and of[: len(module)] == module


def cycles(edges: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: Path) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def long_functions(f: Path) -> list[tuple[str, int, int]]:
    lines = f.read_text().splitlines()
    found, in_macro, macro_indent = [], False, ""
    for i, line in enumerate(lines):
        if in_macro:
            if line == macro_indent + "}":
                in_macro = False
            continue
        if re.match(r"^\s*(#\[macro_export\]\s*)?macro_rules!", line):
            in_macro, macro_indent = True, re.match(r"^(\s*)", line).group(1)
            continue
        m = FN.match(line)
        if not m or line.rstrip().endswith(";"):
            continue
        attrs = lines[max(0, i - 4):i]
        if any("target_feature" in a for a in attrs):
            continue
        indent = m.group(1)
        for j in range(i, len(lines)):
            if lines[j] == indent + "}" or (j == i and line.rstrip().endswith("}")):
                length = j - i + 1
                if length > MAX_LINES:
                    found.append((m.group(6), i + 1, length))
                break
    return found


def key(failure: str) -> str:
    """A failure without its line numbers and lengths, as KNOWN lists it."""
    return re.sub(r":\d+: (fn \w+) is \d+ lines.*", r": \1", failure)


def main() -> int:
    failures = []
    for crate in sorted((REPO / "crates").iterdir()):
        src = crate / "src"
        if not src.is_dir():
            continue
        mods = modules(src)
        edges = {f: imports(f, src, mods) for f in mods.values()}
        for comp in cycles(edges):
            names = ", ".join(str(p.relative_to(REPO)) for p in comp)
            failures.append(f"import cycle: {names}")
        for f in sorted(crate.rglob("*.rs")):
            if "target" in f.parts:
                continue
            for name, line, length in long_functions(f):
                failures.append(f"{f.relative_to(REPO)}:{line}: fn {name} is {length} lines "
                                f"(at most {MAX_LINES})")
    known = [f for f in failures if key(f) in KNOWN]
    failures = [f for f in failures if key(f) not in KNOWN]
    for line in known:
        print(f"known (issue 29): {line}")
    for failure in failures:
        print(failure)
    if failures:
        return 1
    print(f"check_structure: no import cycle, no function over {MAX_LINES} lines in crates/"
          + (f" beyond the {len(known)} known above" if known else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
