#!/usr/bin/env python3
"""Fails when a build selection would compile a shared dependency with other features than the
whole workspace does (issue 29: tract compiled once per CI run).

Cargo resolves features per build: one crate's tests (`cargo test -p X`), one crate's build
(`cargo build -p X`, maturin's build of the Python extension) or the whole workspace each see
their own subset of dependency edges. Where a package gets fewer features in a subset, it and
everything that depends on it (tract, often) is compiled again for that build. The crate
crates/attnrt-unify pins the union; this script lists every package whose features still differ,
with the selections where they do, and exits 1 if there is any.

    python3 scripts/check_features.py
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

# What crates/attnrt-unify leaves out on purpose (see its Cargo.toml).
ALLOWED = {"mimalloc", "libmimalloc-sys"}


def features(args: list[str]) -> dict[tuple[str, str], set[str]]:
    """(package, version) → features, for `cargo tree` with `args`."""
    out = subprocess.run(
        ["cargo", "tree", *args, "-f", "{p}|{f}", "--prefix", "none", "--no-dedupe"],
        capture_output=True, text=True, check=True).stdout
    found: dict[tuple[str, str], set[str]] = {}
    for line in out.splitlines():
        if "|" not in line:
            continue
        package, feats = line.rsplit("|", 1)
        name, version = package.split()[:2]
        found.setdefault((name, version), set()).update(f for f in feats.split(",") if f)
    return found


def members() -> list[str]:
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        capture_output=True, text=True, check=True).stdout)
    return [p["name"] for p in meta["packages"]]


def main() -> int:
    union = features(["--workspace", "-e", "normal,build,dev"])
    differs: dict[tuple[str, str], list[str]] = defaultdict(list)
    for member in members():
        for edges, what in (("normal,build", "build"), ("normal,build,dev", "test")):
            for package, feats in features(["-p", member, "-e", edges]).items():
                if package[0] not in ALLOWED and feats != union.get(package, set()):
                    differs[package].append(f"{what} -p {member}")
    for (name, version), where in sorted(differs.items()):
        print(f"{name} {version}: features {sorted(union[(name, version)])} in the workspace, "
              f"fewer in: {', '.join(where)}")
    if differs:
        print("check_features: pin these in crates/attnrt-unify/Cargo.toml ([dependencies] and "
              "[build-dependencies])", file=sys.stderr)
        return 1
    print(f"check_features: every build selection of {len(members())} crates sees the "
          "workspace's features")
    return 0


if __name__ == "__main__":
    sys.exit(main())
