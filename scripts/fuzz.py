#!/usr/bin/env python3
"""Fuzz the `attnrt` binary with mutated models (issue 28), and the in-process fuzzers.

Each case is a shipped model changed one to three times, through the onnx API (dims,
element types, attributes such as perm/axis/axes, names, op types, nodes deleted, duplicated
or moved, initializer dims or types without their data, small integer constants, the
opset) or on its bytes (flips, truncation, insertion). It is given to
`attnrt run --no-diff --threads 1` and `attnrt fuse -o ...`, each under a time limit and an
address-space limit. Failures (hangs, kills, internal errors, panics, unclean exits: see
tests/python/fuzz/execute.py) are saved as reproducers under --findings, and the run exits 1
when there is any. The code is in tests/python/fuzz/.

    scripts/fuzz.py --seed 1 --cases 200                 # a fixed, reproducible set
    scripts/fuzz.py --minutes 30 --jobs 2                 # a campaign (release binary first)
    scripts/fuzz.py --minutes 30 --libfuzzer-seconds 600 --harness-seconds 300
    scripts/fuzz.py --cases 0 --libfuzzer-seconds 300     # only the cargo-fuzz target

Needs onnx and numpy (tests/python/requirements.txt). The cargo-fuzz target runs only where
cargo-fuzz is installed (see tests/python/fuzz/rust_fuzzers.py), else it is skipped.
"""
from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "python"))

from fuzz import campaign, execute, rust_fuzzers  # noqa: E402  (after the path above)


def default_attnrt() -> Path:
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "attnrt"
        if p.exists():
            return p
    return REPO / "target" / "release" / "attnrt"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnrt", type=Path, default=default_attnrt(),
                    help="the binary (default: target/release/attnrt, else target/debug/attnrt)")
    ap.add_argument("--seed", type=int, default=None, help="default: the current time")
    ap.add_argument("--cases", type=int, default=None, help="stop after N cases")
    ap.add_argument("--minutes", type=float, default=None, help="stop after M minutes")
    ap.add_argument("--models", action="append", default=[],
                    help="glob of source models, repeatable (default: models/*.onnx)")
    ap.add_argument("--max-source-kb", type=int, default=400,
                    help="skip sources larger than this (default 400: big models are slow "
                         "and cover nothing new)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per command (20)")
    ap.add_argument("--memory-mb", type=int, default=4096,
                    help="address-space limit per command, MiB (4096)")
    ap.add_argument("--commands", default="run,fuse", help="of run,fuse (default both)")
    ap.add_argument("--findings", type=Path, default=REPO / "target" / "fuzz-findings")
    ap.add_argument("--libfuzzer-seconds", type=int, default=0,
                    help="then run the cargo-fuzz target this long, where it can be built")
    ap.add_argument("--harness-seconds", type=int, default=0,
                    help="then run the stable harness tests/tests/hostile_fuzz.rs this long")
    args = ap.parse_args()
    if args.cases is None and args.minutes is None:
        args.cases = 200
    args.seed = int(time.time()) if args.seed is None else args.seed
    return args


def sources(patterns: list[str], max_kb: int) -> list[Path]:
    found = sorted({Path(p) for pat in (patterns or [str(REPO / "models" / "*.onnx")])
                    for p in glob.glob(pat)})
    return [p for p in found if p.stat().st_size <= max_kb * 1024]


def mutation_campaign(args: argparse.Namespace) -> int:
    """The number of failed commands."""
    srcs = sources(args.models, args.max_source_kb)
    if not srcs:
        sys.exit(f"fuzz: no source model matches {args.models or 'models/*.onnx'}")
    if not args.attnrt.exists():
        sys.exit(f"fuzz: {args.attnrt} does not exist (cargo build --release -p attnrt-cli)")
    settings = campaign.Settings(
        attnrt=args.attnrt, sources=srcs, seed=args.seed, cases=args.cases,
        seconds=None if args.minutes is None else args.minutes * 60, jobs=args.jobs,
        limits=execute.Limits(args.timeout, args.memory_mb << 20),
        commands=args.commands.split(","), findings=args.findings)
    print(f"fuzz: seed {args.seed}, {len(srcs)} source models, {args.attnrt}, "
          f"{args.jobs} job(s), limits {args.timeout:g} s / {args.memory_mb} MiB", flush=True)
    start = time.monotonic()
    tally = campaign.run(settings)
    for line in tally.report():
        print(line)
    print(f"{tally.line()} in {time.monotonic() - start:.0f} s", flush=True)
    if tally.failed():
        print(f"fuzz: reproducers in {args.findings}/ (the .json beside each says how to run it)")
    return tally.failed()


def main() -> int:
    args = parse_args()
    failed = mutation_campaign(args) if args.cases != 0 else 0
    if args.libfuzzer_seconds:
        failed += rust_fuzzers.run_libfuzzer(REPO, args.libfuzzer_seconds, args.jobs)
    if args.harness_seconds:
        failed += rust_fuzzers.run_stable_harness(REPO, args.harness_seconds, args.seed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
