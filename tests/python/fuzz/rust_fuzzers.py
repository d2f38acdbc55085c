"""The in-process fuzzers of loading, validation and fusion (issue 5), run for a bounded time.

1. The cargo-fuzz / libFuzzer target ``fuzz/fuzz_targets/load_validate_fuse.rs``,
   coverage-guided. cargo-fuzz wants nightly; on this project's stable toolchain it builds
   and runs with ``RUSTC_BOOTSTRAP=1`` (to accept its -Z flags) and ``--sanitizer none`` (the
   ASan runtime is not needed for attnrt's safe Rust). Needs ``cargo install cargo-fuzz``
   and a C++ compiler (libfuzzer-sys builds libFuzzer); skipped, with the reason, otherwise.
   Corpus: ``fuzz/corpus/load_validate_fuse`` (seeded from the small models, untracked);
   findings: ``fuzz/artifacts/load_validate_fuse/``.
2. The stable harness ``tests/tests/hostile_fuzz.rs`` (same body, seeded mutations), which
   runs anywhere cargo does.

A finding becomes a regression test: copy the input into ``fuzz/regressions/`` (the test
``fuzz_regressions_stay_fixed`` runs every file there), then fix the root cause.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

TARGET = "load_validate_fuse"
# libFuzzer's inputs stay below this size (and so do the corpus seeds).
MAX_LEN = 400_000


def cargo_fuzz_missing() -> str | None:
    """Why cargo-fuzz cannot run here, or None."""
    try:
        p = subprocess.run(["cargo", "fuzz", "--version"], capture_output=True, text=True)
    except FileNotFoundError:
        return "cargo is not on PATH"
    if p.returncode != 0:
        return "cargo-fuzz is not installed (`cargo install cargo-fuzz`)"
    return None


def _seed_corpus(repo: Path, corpus: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    for m in sorted((repo / "models").glob("*.onnx")):
        if m.stat().st_size < MAX_LEN and not (corpus / m.name).exists():
            shutil.copyfile(m, corpus / m.name)


def run_libfuzzer(repo: Path, seconds: int, jobs: int) -> int:
    """Builds and runs the cargo-fuzz target; the number of findings (0 when skipped)."""
    why = cargo_fuzz_missing()
    if why:
        print(f"libfuzzer: skipped: {why}", flush=True)
        return 0
    fuzz = repo / "fuzz"
    corpus, artifacts = fuzz / "corpus" / TARGET, fuzz / "artifacts" / TARGET
    _seed_corpus(repo, corpus)
    artifacts.mkdir(parents=True, exist_ok=True)
    before = set(artifacts.iterdir())
    env = {**os.environ, "RUSTC_BOOTSTRAP": "1"}
    argv = ["cargo", "fuzz", "run", "--sanitizer", "none", TARGET, str(corpus), "--",
            f"-max_total_time={seconds}", f"-max_len={MAX_LEN}", "-rss_limit_mb=4096",
            "-timeout=20", "-print_final_stats=1"]
    if jobs > 1:
        # libFuzzer then writes each worker's log to fuzz/fuzz-<n>.log (ignored by git).
        argv += [f"-jobs={jobs}", f"-workers={jobs}"]
    print(f"libfuzzer: {TARGET} for {seconds} s ({' '.join(argv)})", flush=True)
    code = subprocess.run(argv, cwd=fuzz, env=env).returncode
    new = sorted(set(artifacts.iterdir()) - before)
    for f in new:
        print(f"libfuzzer: finding {f}", flush=True)
    if code != 0 and not new:
        print(f"libfuzzer: cargo fuzz exited {code} without a finding (a build failure?)")
        return 1
    return len(new)


def run_stable_harness(repo: Path, seconds: int, seed: int) -> int:
    """Runs tests/tests/hostile_fuzz.rs for `seconds`; 1 when it failed, else 0."""
    env = {**os.environ, "ATTNRT_FUZZ_SECS": str(seconds), "ATTNRT_FUZZ_SEED": str(seed)}
    argv = ["cargo", "test", "-p", "attnrt-tests", "--test", "hostile_fuzz", "--",
            "--nocapture", "mutated_models_never_panic"]
    print(f"stable harness: seed {seed} for {seconds} s", flush=True)
    return int(subprocess.run(argv, cwd=repo, env=env).returncode != 0)
