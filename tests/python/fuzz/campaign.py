"""A campaign: cases run on worker processes, failures saved as they come, a tally at the end.

Cases are numbered 0, 1, 2... and made in the workers from (seed, index), so a run with N
cases gives the same cases whatever the number of workers. Each worker runs its commands
one at a time (a single-threaded process: the limits are set between fork and exec).
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from . import execute, findings
from .cases import Source, make_case

# What is run on each case; "{model}" and "{output}" are filled in per case.
COMMANDS = {
    "run": ["run", "{model}", "--no-diff", "--threads", "1"],
    "fuse": ["fuse", "{model}", "-o", "{output}"],
}


@dataclass
class Settings:
    attnrt: Path
    sources: list[Path]
    seed: int
    cases: int | None
    seconds: float | None
    jobs: int
    limits: execute.Limits
    commands: list[str]
    findings: Path
    progress_s: float = 60.0


_WORKER: dict = {}


def _start_worker(settings: Settings, scratch: Path) -> None:
    _WORKER["settings"] = settings
    _WORKER["scratch"] = scratch
    _WORKER["sources"] = [Source.load(p) for p in settings.sources]


def _run_case(index: int) -> findings.CaseResult:
    s: Settings = _WORKER["settings"]
    case = make_case(_WORKER["sources"], s.seed, index)
    folder = Path(tempfile.mkdtemp(dir=_WORKER["scratch"]))
    try:
        for name in case.source.external_files:
            src = case.source.path.parent / name
            if src.is_file():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, folder / name)
        model, output = folder / "case.onnx", folder / "fused.onnx"
        model.write_bytes(case.data)
        runs = []
        for command in s.commands:
            argv = [str(s.attnrt)] + COMMANDS[command]
            real = [str(model) if a == "{model}" else str(output) if a == "{output}" else a
                    for a in argv]
            outcome = execute.run(real, s.limits, output if "{output}" in argv else None)
            output.unlink(missing_ok=True)
            # Messages name the file as `case.onnx`, the same for every case of a class.
            outcome.detail = outcome.detail.replace(f"{folder}/", "")
            outcome.stderr = outcome.stderr.replace(f"{folder}/", "")
            runs.append((command, argv, outcome.to_json()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = findings.CaseResult(s.seed, index, str(case.source.path),
                                 case.source.external_files, case.mutations, runs)
    if result.failures():
        result.data = case.data
    return result


def run(settings: Settings) -> findings.Tally:
    """Runs the campaign until `cases` are done or `seconds` have passed (whichever first)."""
    tally = findings.Tally()
    start = time.monotonic()
    last_note = start
    with tempfile.TemporaryDirectory(prefix="attnrt-fuzz-") as scratch, ProcessPoolExecutor(
            settings.jobs, initializer=_start_worker, initargs=(settings, Path(scratch))) as pool:
        pending: set[Future] = set()
        next_index = 0

        def more() -> bool:
            if settings.cases is not None and next_index >= settings.cases:
                return False
            return settings.seconds is None or time.monotonic() - start < settings.seconds

        while True:
            while more() and len(pending) < 2 * settings.jobs:
                pending.add(pool.submit(_run_case, next_index))
                next_index += 1
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                _record(f.result(), settings.findings, tally)
            if time.monotonic() - last_note >= settings.progress_s:
                last_note = time.monotonic()
                print(f"  {last_note - start:6.0f} s  {tally.line()}", file=sys.stderr, flush=True)
    return tally


def _record(result: findings.CaseResult, folder: Path, tally: findings.Tally) -> None:
    reproducer = findings.save(result, folder) if result.failures() else None
    tally.add(result, reproducer)
