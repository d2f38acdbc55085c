"""Runs one `attnrt` command on a case under a time and memory limit, and sorts the outcome.

attnrt's contract (crates/attnrt-cli/src/main.rs, README "Exit codes"): 0 success; 1 error,
2 usage, 3 a diff over tolerance, each with one `error:` line; 70 an internal error (its
panic hook turns a panic into exit 70). Against that, an outcome is:

    ok         exit 0 (and, for `fuse`, the output file written)
    error      exit 1, 2 or 3 with exactly one `error:` line, and no output file left behind
    hang       still running at the time limit (killed)
    kill       ended by a signal: out of memory under the address-space limit (Rust aborts
               on a failed allocation), a stack overflow, a segfault...
    internal   exit 70
    panic      a panic that bypassed the hook (exit 101, or the RUST_BACKTRACE hint on
               stderr), or one the runtime caught around a tract call and reported as an
               error (`tract panicked: ...`, exit 1): the input reached tract unvalidated
    unclean    anything else: another exit code, an error on more or fewer than one line,
               a partial output file after an error, exit 0 without the output

The last five are failures. The limits are set in the child before it runs
(``resource.setrlimit``): a runaway allocation becomes a kill of that process only.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

FAILURES = ("hang", "kill", "internal", "panic", "unclean")
KINDS = ("ok", "error") + FAILURES
_STDERR_KEPT = 4000


@dataclass
class Outcome:
    kind: str
    exit: int | None
    seconds: float
    detail: str
    stderr: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "exit": self.exit, "seconds": round(self.seconds, 3),
                "detail": self.detail, "stderr": self.stderr}


@dataclass
class Limits:
    timeout_s: float
    memory_bytes: int


def _limit_child(memory_bytes: int) -> None:
    """Runs in the child between fork and exec (the workers are single-threaded)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # A fused model is at most a few times its source; a runaway writer stops at 1 GiB.
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RUST_BACKTRACE", "RUST_LOG")}
    env["RAYON_NUM_THREADS"] = "1"
    return env


def run(argv: list[str], limits: Limits, output: Path | None = None) -> Outcome:
    """Runs `argv`; `output` is the file a `fuse -o` writes (checked after the run)."""
    start = time.monotonic()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=limits.timeout_s, env=_environment(),
                           preexec_fn=lambda: _limit_child(limits.memory_bytes))
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"").decode("utf-8", "replace")[-_STDERR_KEPT:]
        return Outcome("hang", None, time.monotonic() - start,
                       f"still running after {limits.timeout_s:g} s", err)
    seconds = time.monotonic() - start
    stderr = p.stderr.decode("utf-8", "replace")
    kind, detail = classify(p.returncode, stderr, output)
    return Outcome(kind, p.returncode, seconds, detail, stderr[-_STDERR_KEPT:])


def classify(code: int, stderr: str, output: Path | None) -> tuple[str, str]:
    """(kind, detail) of an ended process; see the module's doc for the kinds."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    first = errors[0] if errors else (stderr.strip().splitlines() or [""])[-1]
    if code < 0:
        return "kill", _signal_detail(-code, stderr)
    if code == 70:
        return "internal", first
    if code == 101 or "panicked" in stderr or "RUST_BACKTRACE" in stderr:
        return "panic", first
    written = output is not None and output.exists()
    if code == 0:
        if output is not None and not written:
            return "unclean", "exit 0 but no output file"
        return "ok", ""
    if code not in (1, 2, 3):
        return "unclean", f"exit {code}: {first}"
    if len(errors) != 1:
        return "unclean", f"exit {code} with {len(errors)} `error:` lines: {first}"
    if written:
        return "unclean", f"partial output file after {first}"
    return "error", first


def _signal_detail(sig: int, stderr: str) -> str:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    if "memory allocation of" in stderr or "out of memory" in stderr.lower():
        return f"{name}: out of memory (address-space limit)"
    if "overflowed its stack" in stderr:
        return f"{name}: stack overflow"
    return name
