# Sourced by scripts/test.sh and scripts/conformance.sh (from the repository's root): installs
# tests/python/requirements.txt into a venv, fetches the onnx 1.22.0 wheel's Attention
# conformance cases, and exports ATTNRT_PYTHON and ATTNRT_ONNX_CASES for what runs next.
# Needs python3 with venv and pip; reaches PyPI.
venv=${ATTNRT_VENV:-$PWD/target/py}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
export ATTNRT_PYTHON="$venv/bin/python"

cases=${ATTNRT_ONNX_CASES:-$PWD/target/onnx-attention-cases}
if [ ! -f "$cases/cases.json" ]; then
  "$ATTNRT_PYTHON" tests/python/fetch_onnx_attention_cases.py "$cases" \
    --download-dir "$PWD/target/onnx-wheel" >/dev/null
fi
export ATTNRT_ONNX_CASES="$cases"
