#!/usr/bin/env python3
"""Self-test of ort_check.py on tiny graphs built with onnx.helper (no torch, no files from
models/): it must pass equal models, and fail (exit 1) on a wrong output, an invalid fused
model and mismatched inputs, and exit 2 on a missing file.

    python tests/python/test_ort_check.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SCRIPT = Path(__file__).resolve().parent / "ort_check.py"


def softmax_model(scale: float, *, bad_axis: bool = False) -> onnx.ModelProto:
    """y = Softmax(x * scale) on a [B, L] input; ``bad_axis`` makes an invalid model (the
    checker rejects an axis out of range)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])
    s = numpy_helper.from_array(np.array(scale, dtype=np.float32), "s")
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]),
             helper.make_node("Softmax", ["t"], ["y"], axis=5 if bad_axis else -1)]
    g = helper.make_graph(nodes, "g", [x], [y], initializer=[s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


class OrtCheckTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.inputs = self.dir / "in.npz"
        np.savez(self.inputs, x=np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))

    def tearDown(self):
        self.tmp.cleanup()

    def save(self, name: str, model: onnx.ModelProto) -> Path:
        p = self.dir / name
        onnx.save(model, str(p))
        return p

    def run_check(self, *args: str | Path) -> tuple[int, dict]:
        proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                              capture_output=True, text=True)
        lines = [l for l in proc.stdout.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, f"expected one JSON line, got {proc.stdout!r} {proc.stderr!r}")
        return proc.returncode, json.loads(lines[0])

    def test_equal_models_pass(self):
        a = self.save("a.onnx", softmax_model(0.5))
        b = self.save("b.onnx", softmax_model(0.5))
        rc, out = self.run_check(a, b, self.inputs)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out["checker"], "ok")
        self.assertEqual(out["max_abs"], 0.0)
        self.assertTrue(out["outputs"]["y"]["ok"])

    def test_different_outputs_fail(self):
        a = self.save("a.onnx", softmax_model(0.5))
        b = self.save("b.onnx", softmax_model(2.0))
        rc, out = self.run_check(a, b, self.inputs, "--atol", "1e-5")
        self.assertEqual(rc, 1, out)
        self.assertGreater(out["max_abs"], 1e-3)
        self.assertFalse(out["ok"])

    def test_tolerance_decides(self):
        a = self.save("a.onnx", softmax_model(0.5))
        b = self.save("b.onnx", softmax_model(0.5001))
        rc, _ = self.run_check(a, b, self.inputs, "--atol", "1e-2", "--rtol", "0")
        self.assertEqual(rc, 0)
        rc, _ = self.run_check(a, b, self.inputs, "--atol", "1e-9", "--rtol", "0")
        self.assertEqual(rc, 1)

    def test_checker_failure_fails(self):
        a = self.save("a.onnx", softmax_model(0.5))
        b = self.save("b.onnx", softmax_model(0.5, bad_axis=True))
        rc, out = self.run_check(a, b, self.inputs)
        self.assertEqual(rc, 1, out)
        self.assertNotEqual(out["checker"], "ok")

    def test_unknown_input_name_fails(self):
        a = self.save("a.onnx", softmax_model(0.5))
        bad = self.dir / "bad.npz"
        np.savez(bad, x=np.zeros((2, 4), np.float32), other=np.zeros(1, np.float32))
        rc, out = self.run_check(a, a, bad)
        self.assertEqual(rc, 1, out)
        self.assertIn("other", out["error"])

    def test_missing_file_is_usage_error(self):
        a = self.save("a.onnx", softmax_model(0.5))
        rc, out = self.run_check(a, self.dir / "missing.onnx", self.inputs)
        self.assertEqual(rc, 2, out)
        self.assertIn("missing.onnx", out["error"])


if __name__ == "__main__":
    unittest.main()
