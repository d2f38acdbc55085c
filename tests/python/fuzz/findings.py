"""Failures on disk (one reproducer each) and the campaign's tally.

A reproducer is ``<kind>-<source>-s<seed>-c<index>.onnx`` (the mutated model, with copies of
the external data files its source names) and a ``.json`` beside it: seed, case index,
source, mutations, and per command its argv (to run again as it is), outcome and stderr.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .execute import FAILURES, KINDS


@dataclass
class CaseResult:
    """What one case did, sent back from a worker: `data` only when something failed."""
    seed: int
    index: int
    source: str
    external_files: list[str]
    mutations: list[str]
    # (command name, argv with the case file as "{model}", outcome as JSON)
    runs: list[tuple[str, list[str], dict]]
    data: bytes | None = None

    def failures(self) -> list[tuple[str, list[str], dict]]:
        return [r for r in self.runs if r[2]["kind"] in FAILURES]


def reproducer_argv(argv: list[str], model: Path) -> list[str]:
    """The command line of a run on the saved reproducer (`fuse` writes beside it)."""
    fill = {"{model}": str(model), "{output}": str(model.with_suffix(".fused.onnx"))}
    return [fill.get(a, a) for a in argv]


def _signature(kind: str, command: str, detail: str) -> str:
    """The detail without its numbers and names, so one bug counts as one class."""
    detail = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "'…'", detail)
    detail = re.sub(r"\d+", "N", detail)
    return f"{kind} {command}: {detail[:160]}"


def save(result: CaseResult, folder: Path) -> Path:
    """Writes the case's reproducer; returns the .onnx path."""
    folder.mkdir(parents=True, exist_ok=True)
    kind = result.failures()[0][2]["kind"]
    stem = f"{kind}-{Path(result.source).name.removesuffix('.onnx')}-s{result.seed}-c{result.index}"
    model = folder / f"{stem}.onnx"
    model.write_bytes(result.data or b"")
    for name in result.external_files:
        src = Path(result.source).parent / name
        if src.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, folder / name)
    runs = []
    for command, argv, outcome in result.runs:
        real = reproducer_argv(argv, model)
        runs.append({"command": command, "argv": real, "reproduce": shlex.join(real), **outcome})
    doc = {"seed": result.seed, "case": result.index, "source": result.source,
           "mutations": result.mutations, "runs": runs}
    model.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    return model


@dataclass
class Tally:
    """Counts per outcome kind (over commands) and per failure class, with one example each."""
    cases: int = 0
    kinds: Counter = field(default_factory=Counter)
    classes: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, result: CaseResult, reproducer: Path | None) -> None:
        self.cases += 1
        for command, argv, outcome in result.runs:
            self.kinds[outcome["kind"]] += 1
            if outcome["kind"] in FAILURES:
                sig = _signature(outcome["kind"], command, outcome["detail"])
                self.classes[sig] += 1
                real = reproducer_argv(argv, reproducer or Path("?"))
                self.examples.setdefault(sig, shlex.join(real))

    def failed(self) -> int:
        return sum(self.kinds[k] for k in FAILURES)

    def line(self) -> str:
        k = self.kinds
        return (f"fuzz: {self.cases} cases, {k['hang']} hangs, {k['kill']} kills, "
                f"{k['internal']} internal errors, {k['panic']} panics, {k['unclean']} unclean "
                f"exits ({k['ok']} ok, {k['error']} clean errors; over "
                f"{sum(k[x] for x in KINDS)} commands)")

    def report(self) -> list[str]:
        """One line per failure class, the most frequent first, with a command to reproduce."""
        lines = []
        for sig, n in self.classes.most_common():
            lines += [f"  {n:5d}  {sig}", f"         {self.examples[sig]}"]
        return lines
