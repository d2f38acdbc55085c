#!/usr/bin/env python3
"""Run every ONNX `Attention` conformance case through the `attnrt run` command.

    python tests/python/run_onnx_conformance.py --attnrt target/release/attnrt \\
        --cases target/onnx-attention-cases [--threads 2] [--json REPORT.json]

The cases are the 128 ``test_attention_*`` node tests of the onnx 1.22.0 wheel, converted by
``fetch_onnx_attention_cases.py`` (run here first when ``--cases`` has no ``cases.json``).
Each case is one call of

    attnrt run CASE/model.onnx --input-npz CASE/inputs.npz --expect CASE/outputs.npz --json

and must pass as follows:

- the 64 op cases hold the ``Attention`` node itself: it must run on attnrt's kernel (the
  ``ops`` report counts one attention op) and every output must match the expected data;
- the 64 ``_expanded`` cases hold the same computation decomposed into plain ops: attnrt must
  fuse it back into one ``Attention`` node, run it on the kernel, and both the fused and the
  unfused (tract) outputs must match the expected data and each other.

A case listed in ``UNSUPPORTED`` must instead be refused: exit code 1 and one ``error:`` line
(none is listed: every case passes). Anything else -- a wrong answer (exit 3), an unexpected
refusal, a crash, a missing fusion -- is a failure; the script prints a table and exits 1.

Tolerance: attnrt's own defaults, which follow each output's element type (float32 1e-4 absolute
and relative, float16 2e-3): every case is run with default flags, as a user would run it. The
expected data is the onnx float64 reference implementation's, rounded to the case's type.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# Cases attnrt refuses on purpose, with the reason. Empty: attnrt does all 128.
UNSUPPORTED: dict[str, str] = {}

OP_CASES = 64
EXPANDED_CASES = 64


def worst(diffs) -> float:
    return max((d["max_abs"] for d in diffs or []), default=0.0)


def failed(diffs, what: str) -> list[str]:
    out = []
    for d in diffs or []:
        if not d["ok"]:
            why = d["problem"] or f"max_abs {d['max_abs']:.3e}, {d['mismatches']} element(s) out of tolerance"
            out.append(f"{d['name']} {what}: {why}")
    return out


def check_case(attnrt: str, case_dir: Path, case: dict, threads: int) -> tuple[bool, str]:
    """Runs one case; returns (passed, what happened)."""
    cmd = [attnrt, "run", str(case_dir / "model.onnx"),
           "--input-npz", str(case_dir / "inputs.npz"),
           "--expect", str(case_dir / "outputs.npz"),
           "--threads", str(threads), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    name = case["case"]
    if name in UNSUPPORTED:
        if proc.returncode == 1 and len(errors) == 1:
            return True, f"refused as documented ({UNSUPPORTED[name]}): {errors[0]}"
        return False, f"listed as unsupported, but exit {proc.returncode}: {proc.stderr.strip()[:300]}"
    if proc.returncode == 1:
        return False, f"REFUSED: {' | '.join(errors) or proc.stderr.strip()[:300]}"
    if proc.returncode not in (0, 3):
        return False, f"CRASH (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        return False, f"exit {proc.returncode} with no JSON report ({e})"

    problems = []
    blocks = len(report["fusion"]["blocks"]) if report["fusion"] else 0
    expect = report["expect"] or {}
    # An expansion must be fused into one Attention node, which runs on the kernel, and run on
    # both paths; an op case already holds the node: nothing to fuse, its one path runs the node.
    ran = ["fused", "unfused"] if case["expanded"] else ["unfused"]
    path, want_blocks = ran[0], len(ran) - 1
    if blocks != want_blocks:
        problems.append(f"fused {blocks} attention block(s), expected {want_blocks}")
    ops = report["ops"][path]
    if not ops or ops["attention"] != 1:
        problems.append(f"the {path} graph ran {ops and ops['attention']} op(s) on attnrt's kernel, expected 1")
    if sorted(expect) != ran:
        problems.append(f"expected runs of {ran}, got {report['ran']}")
    for p in ran:
        problems += failed(expect.get(p), f"{p} vs expected")
    problems += failed([o["diff_vs_unfused"] for o in report["outputs"] if o["diff_vs_unfused"]],
                       "fused vs unfused")
    worst_of = ", ".join(f"{worst(expect.get(p)):.1e} {p}" for p in ran)
    shown = (f"{'fused 1 block' if case['expanded'] else 'Attention op'} on the kernel "
             f"({report['ops']['kernel_isa']}); max abs vs expected {worst_of}")
    if proc.returncode == 3 and not problems:
        problems.append(f"exit 3 with every diff within tolerance: {' | '.join(errors)}")
    if problems:
        return False, "WRONG: " + "; ".join(problems)
    return True, shown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attnrt", required=True, help="the attnrt binary")
    ap.add_argument("--cases", type=Path, required=True,
                    help="folder of converted cases (fetched there when it has no cases.json)")
    ap.add_argument("--threads", type=int, default=2, help="--threads of each attnrt run")
    ap.add_argument("--json", type=Path, help="also write the per-case results to this file")
    args = ap.parse_args()

    if not (args.cases / "cases.json").is_file():
        fetch = Path(__file__).with_name("fetch_onnx_attention_cases.py")
        subprocess.run([sys.executable, str(fetch), str(args.cases)], check=True,
                       stdout=subprocess.DEVNULL)
    cases = json.loads((args.cases / "cases.json").read_text())
    n_op = sum(not c["expanded"] for c in cases)
    n_exp = sum(c["expanded"] for c in cases)
    if (n_op, n_exp) != (OP_CASES, EXPANDED_CASES):
        print(f"error: {args.cases}/cases.json has {n_op} op and {n_exp} expanded cases, "
              f"the onnx 1.22.0 wheel has {OP_CASES} and {EXPANDED_CASES}", file=sys.stderr)
        return 1

    results = []
    print("| case | outcome |\n|---|---|")
    for c in cases:
        ok, shown = check_case(args.attnrt, args.cases / c["case"], c, args.threads)
        results.append({"case": c["case"], "expanded": c["expanded"], "ok": ok, "outcome": shown})
        print(f"| {c['case']} | {shown} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")

    bad = [r for r in results if not r["ok"]]
    op_ok = sum(r["ok"] and not r["expanded"] for r in results)
    exp_ok = sum(r["ok"] and r["expanded"] for r in results)
    print(f"\nattnrt run over the onnx 1.22.0 Attention cases: {op_ok}/{n_op} op cases on the kernel, "
          f"{exp_ok}/{n_exp} expansions fused and matching on both paths")
    if bad:
        print(f"{len(bad)} case(s) failed:", file=sys.stderr)
        for r in bad:
            print(f"  {r['case']}: {r['outcome']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
