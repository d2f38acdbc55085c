#!/usr/bin/env bash
# Fuzz attnrt's model loading + validation + static allocation check + fusion (issue 5).
#
#   scripts/fuzz.sh [SECONDS]        (default 300)
#
# Two fuzzers share one body (tests/src/hostile_fuzz.rs):
#
# 1. The cargo-fuzz / libFuzzer target fuzz/fuzz_targets/load_validate_fuse.rs, coverage-guided.
#    cargo-fuzz wants nightly; on the one stable toolchain of this project it runs with
#    RUSTC_BOOTSTRAP=1 (to accept -Z flags) and `--sanitizer none` (the ASan runtime is not
#    needed for attnrt's safe Rust). Its corpus lives in fuzz/corpus/load_validate_fuse
#    (seeded from models/*.onnx, untracked), crashes in fuzz/artifacts/.
#    Needs: `cargo install cargo-fuzz` and a C++ compiler (libfuzzer-sys builds libFuzzer).
# 2. The stable harness tests/tests/hostile_fuzz.rs: seeded byte- and structure-level
#    mutations of the shipped models and the hostile corpus, for the same time. Always runs.
#
# Any crash becomes a regression test: copy the input into fuzz/regressions/ (the test
# `fuzz_regressions_stay_fixed` runs every file there), then fix the root cause.
#
# Environment: ATTNRT_FUZZ_SEED (stable harness seed, default: the current time),
# FUZZ_JOBS (libFuzzer workers, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-300}"
seed="${ATTNRT_FUZZ_SEED:-$(date +%s)}"
status=0

if cargo fuzz --version >/dev/null 2>&1; then
    corpus=fuzz/corpus/load_validate_fuse
    mkdir -p "$corpus" fuzz/artifacts/load_validate_fuse
    # Seed with the shipped models (small ones: libFuzzer caps input size below).
    for m in models/*.onnx; do
        if [ "$(stat -c %s "$m")" -lt 400000 ]; then cp -n "$m" "$corpus/" || true; fi
    done
    echo "== libFuzzer: load_validate_fuse for ${secs}s"
    (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none load_validate_fuse \
        "corpus/load_validate_fuse" -- \
        -max_total_time="$secs" -max_len=400000 -rss_limit_mb=4096 -timeout=20 \
        -jobs="${FUZZ_JOBS:-1}" -workers="${FUZZ_JOBS:-1}" -print_final_stats=1) || status=$?
    if ls fuzz/artifacts/load_validate_fuse/crash-* >/dev/null 2>&1; then
        echo "libFuzzer found crashes:"; ls -l fuzz/artifacts/load_validate_fuse/
        status=1
    fi
else
    echo "cargo-fuzz is not installed (cargo install cargo-fuzz); running the stable harness only"
fi

echo "== stable harness: seed $seed for ${secs}s"
ATTNRT_FUZZ_SECS="$secs" ATTNRT_FUZZ_SEED="$seed" \
    cargo test -p attnrt-tests --test hostile_fuzz -- --nocapture mutated_models_never_panic || status=$?
exit "$status"
