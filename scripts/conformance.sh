#!/usr/bin/env bash
# ONNX Attention conformance through the attnrt command: fetches the onnx 1.22.0 wheel with pip,
# extracts its 128 test_attention_* cases, builds attnrt (release) and runs every case with
# `attnrt run CASE/model.onnx --input-npz ... --expect ...`, printing one line per case.
#
#   scripts/conformance.sh [--json report.json]
#
# Exit 0 when every case passes (tests/python/run_onnx_conformance.py says what passing means);
# the test suite runs the same script on its own build (crates/attnrt-cli/tests/onnx_conformance.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
cargo build --release --locked -p attnrt-cli
exec "$ATTNRT_PYTHON" tests/python/run_onnx_conformance.py \
  --attnrt target/release/attnrt --cases "$ATTNRT_ONNX_CASES" "$@"
