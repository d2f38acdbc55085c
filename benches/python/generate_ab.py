"""Time to first token of two attnrt builds, A/B: fresh processes of ``attnrt generate``, the two
binaries alternating within each round (the order reversed every other round), so both see the
same machine state::

    python benches/python/generate_ab.py --old ../main/target/release/attnrt \
        --new target/release/attnrt --model ../genai-bench/llama_gqa_cache_eager.ts.onnx \
        --prompts 128,1024 --rounds 6

Per prompt length: each build's median time to first token and planning during it, the median
(and range) of the per-round old / new ratio, the median decode step, whether the greedy tokens
agree, and the 1-minute load average seen over the run.
"""

import argparse
import json
import os
import statistics
import subprocess


def run(binary: str, args, length: int) -> dict:
    cmd = [binary, "generate", args.model, "--prompt-len", str(length), "--max-new-tokens",
           str(args.new_tokens), "--threads", str(args.threads), "--json"]
    report = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["report"]
    steps = report["steps"]
    return {"ttft": steps[0]["ms"], "planning": steps[0]["planning_ms"],
            "step": statistics.median(s["ms"] for s in steps[1:]), "tokens": report["tokens"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", default="128,1024")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    lengths = [int(x) for x in args.prompts.split(",")]
    builds = {"old": args.old, "new": args.new}
    runs = {(b, n): [] for b in builds for n in lengths}
    loads = []
    for rnd in range(args.rounds):
        for n in lengths:
            for b in (list(builds) if rnd % 2 == 0 else list(builds)[::-1]):
                loads.append(os.getloadavg()[0])
                runs[(b, n)].append(run(builds[b], args, n))
    for n in lengths:
        old, new = runs[("old", n)], runs[("new", n)]
        ratios = [a["ttft"] / b["ttft"] for a, b in zip(old, new)]
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        print(f"prompt {n}: time to first token old {med(old, 'ttft'):.0f} ms (planning "
              f"{med(old, 'planning'):.0f}), new {med(new, 'ttft'):.0f} ms (planning "
              f"{med(new, 'planning'):.0f}); old / new per round {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}); decode step old {med(old, 'step'):.1f} ms, "
              f"new {med(new, 'step'):.1f} ms; tokens identical "
              f"{all(a['tokens'] == b['tokens'] for a, b in zip(old, new))}")
    print(f"load average (1 min) over the run: {min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
