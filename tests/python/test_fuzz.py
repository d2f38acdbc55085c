"""The mutation fuzzer's own parts (tests/python/fuzz/): cases are reproducible from their
seed, mutations change what they say, and outcomes are sorted by attnrt's exit contract,
with the time and memory limits really applied to the child.

    python -m pytest -q tests/python/test_fuzz.py
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import onnx
import pytest
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz import execute, findings, mutate_model  # noqa: E402
from fuzz.cases import Source, make_case  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL = [REPO / "models" / "mha_seed.ts.onnx", REPO / "models" / "sdpa.dynamo.onnx"]
LIMITS = execute.Limits(timeout_s=10.0, memory_bytes=1 << 30)


def tiny_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 2])
    node = helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[1, 0])
    return helper.make_model(helper.make_graph([node], "g", [x], [y]))


def test_a_case_is_the_same_bytes_for_the_same_seed_and_index():
    sources = [Source.load(p) for p in SMALL]
    a, b = make_case(sources, 7, 3), make_case(sources, 7, 3)
    assert (a.data, a.mutations, a.source.path) == (b.data, b.mutations, b.source.path)
    others = {make_case(sources, 7, i).data for i in range(10)}
    assert len(others) > 5, "different indices must give different cases"
    assert all(a.data != s.read_bytes() for s in SMALL)


def test_structural_mutations_change_the_model_as_described():
    for seed in range(20):
        m = tiny_model()
        done = mutate_model.mutate_ints_attr(m, random.Random(seed))
        assert done.startswith(f"attribute t.perm = {list(m.graph.node[0].attribute[0].ints)} (")
    m = tiny_model()
    assert mutate_model.delete_node(m, random.Random(0)) == "node t deleted"
    assert len(m.graph.node) == 0
    m = tiny_model()
    before = m.SerializeToString()
    assert mutate_model.mutate_dim(m, random.Random(1)).startswith("dim ")
    assert m.SerializeToString() != before


@pytest.mark.parametrize("code, stderr, kind", [
    (0, "", "ok"),
    (1, "error: m.onnx: node 'a' (Reshape): bad shape\n", "error"),
    (2, "error: unexpected argument '--x' found\n\nUsage: attnrt run\n", "error"),
    (1, "", "unclean"),
    (1, "error: one\nerror: two\n", "unclean"),
    (4, "error: x\n", "unclean"),
    (70, "error: internal error: boom at src/a.rs:1:2 (this is a bug in attnrt)\n", "internal"),
    (101, "thread 'main' panicked at src/a.rs:1:2:\nboom\n", "panic"),
    (1, "error: m.onnx: run failed: node 'g' (Gather): tract panicked: index out of bounds\n",
     "panic"),
    (-6, "memory allocation of 8589934592 bytes failed\n", "kill"),
    (-11, "", "kill"),
])
def test_outcomes_follow_the_exit_contract(code, stderr, kind):
    assert execute.classify(code, stderr, None)[0] == kind


def test_fuse_must_leave_no_output_after_an_error_and_one_after_success(tmp_path):
    out = tmp_path / "fused.onnx"
    assert execute.classify(0, "", out)[0] == "unclean"
    out.write_bytes(b"partial")
    assert execute.classify(1, "error: x\n", out) == ("unclean", "partial output file after error: x")
    assert execute.classify(0, "", out)[0] == "ok"


def test_the_limits_apply_to_the_child():
    hang = execute.run([sys.executable, "-c", "import time; time.sleep(30)"],
                       execute.Limits(timeout_s=0.5, memory_bytes=1 << 30))
    assert hang.kind == "hang"
    # 2 GiB in one allocation, under a 1 GiB address space: Python fails it (MemoryError,
    # exit 1 without an `error:` line); what matters is that the limit is in force.
    big = execute.run([sys.executable, "-c", "b = bytearray(2 << 30)"], LIMITS)
    assert big.exit == 1 and "MemoryError" in big.stderr


def test_a_failure_is_saved_with_what_reproduces_it(tmp_path):
    argv = ["attnrt", "run", "{model}", "--no-diff"]
    outcome = execute.Outcome("hang", None, 20.0, "still running after 20 s", "")
    result = findings.CaseResult(1, 2, str(SMALL[0]), [], ["dim x[0] = 0"],
                                 [("run", argv, outcome.to_json())], data=b"model bytes")
    saved = findings.save(result, tmp_path)
    assert saved.name == "hang-mha_seed.ts-s1-c2.onnx" and saved.read_bytes() == b"model bytes"
    doc = saved.with_suffix(".json").read_text()
    assert f"attnrt run {saved} --no-diff" in doc and "dim x[0] = 0" in doc
    tally = findings.Tally()
    tally.add(result, saved)
    assert tally.failed() == 1 and "1 hangs" in tally.line()
