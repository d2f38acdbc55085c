#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a developer's: sets up the Python side the tests
# use (the ONNX checker and ONNX Runtime for emitted models, the onnx 1.22.0 Attention
# conformance cases, maturin and pytest), runs every Rust test of the workspace and the Rust
# API's examples, then builds the Python package (crates/attnrt-python) with maturin and runs
# its tests (tests/python/test_attnrt_package.py) against onnxruntime and this build's CLI, and
# the operator checks' cases against onnxruntime (tests/python/test_op_check_ort.py).
# Last, a short seeded run of the mutation fuzzer (scripts/fuzz.py) over this build's CLI.
#
#   scripts/test.sh            # what CI runs (.ci/run)
#
# Needs python3 with venv and pip, and the Rust toolchain; reaches PyPI (pip) and crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh

"$ATTNRT_PYTHON" tests/python/test_ort_check.py
# Every build below (the workspace's tests, the examples, the wheel) sees one feature set, so
# tract is compiled once (crates/attnrt-unify pins it; this fails when a selection differs).
python3 scripts/check_features.py
# No import cycle between a crate's files, no function over 120 lines (outside SIMD bodies).
python3 scripts/check_structure.py
# A one-off build gains nothing from incremental compilation and would keep ≈ 0.3 GB of its state.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo test --workspace --locked
# The Rust API's examples, run as a user would (each exits non-zero on a wrong result). Built
# with the whole workspace's features, so nothing is compiled again.
cargo build --workspace --examples --locked -q
target/debug/examples/fuse_and_run models/bert_eager.ts.onnx \
  models/bert_eager.inputs.npz models/bert_eager.outputs.npz
target/debug/examples/explain models/gpt2_cache_eager.ts.onnx >/dev/null
# The API documentation builds without a warning (broken or private intra-doc links).
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked -q
# The Python package: an abi3 wheel (dev profile: it reuses the build above), installed into the
# test venv, tested with pytest.
"$ATTNRT_PYTHON" -m maturin build -q --locked --profile dev -m crates/attnrt-python/Cargo.toml \
  -o target/wheels
"$ATTNRT_PYTHON" -m pip install -q --force-reinstall --no-deps target/wheels/attnrt-*-abi3-*.whl
ATTNRT_BIN="$PWD/target/debug/attnrt" "$ATTNRT_PYTHON" -m pytest -q tests/python/test_attnrt_package.py \
  tests/python/test_op_check_ort.py tests/python/test_generation.py

# The mutation fuzzer, a short seeded run (issue 28; scripts/fuzz.py runs long campaigns by
# hand): shipped models changed through the onnx API and on their bytes, given to this build's
# `attnrt run --no-diff` and `attnrt fuse` under a time and memory limit. A hang, a kill, an
# internal error, a panic or an unclean exit fails the suite; its reproducer is saved under
# target/fuzz-findings/. First the fuzzer's own tests.
"$ATTNRT_PYTHON" -m pytest -q tests/python/test_fuzz.py
"$ATTNRT_PYTHON" scripts/fuzz.py --attnrt target/debug/attnrt --seed 1 --cases 1500 --jobs 2
