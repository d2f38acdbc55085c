"""attnrt's operator checks (crates/attnrt-onnx/src/op_check) refuse only what ONNX Runtime
refuses too: each invalid model below, one per rule, is refused by onnxruntime (at load, or
at its first run for the rules its load does not check: those runs fail whatever the
inputs), and by the attnrt package with one line naming the node and the attribute or input.
The valid neighbour of each model runs in both.

    target/py/bin/python -m pytest -q tests/python/test_op_check_ort.py

scripts/test.sh runs it after installing the package; without the package, only the
onnxruntime half runs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

try:
    import attnrt
except ImportError:  # the onnxruntime half needs only onnx and onnxruntime
    attnrt = None


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def ints(name, values, dims=None):
    a = np.array(values, dtype=np.int64)
    return numpy_helper.from_array(a.reshape(dims) if dims is not None else a, name)


def build(node, inputs, inits=(), opset=17, outputs=("y",)):
    g = helper.make_graph([node], "g", inputs, [vi(o, None) for o in outputs], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


X4 = [vi("x", [2, 3, 4, 5])]
X2 = [vi("x", [3, 4])]


def transpose(perm):
    return build(helper.make_node("Transpose", ["x"], ["y"], name="t", perm=perm), X4)


def reshape(target, x=(2, 3, 4, 5)):
    return build(helper.make_node("Reshape", ["x", "s"], ["y"], name="r"), [vi("x", list(x))], [ints("s", target)])


def split(sizes, opset=13):
    node = helper.make_node("Split", ["x", "s"], ["a", "b"], name="sp", axis=1)
    return build(node, X2, [ints("s", sizes)], opset, outputs=("a", "b"))


def slice_(starts, ends, axes, steps):
    node = helper.make_node("Slice", ["x", "b", "e", "a", "st"], ["y"], name="s")
    inits = [ints("b", starts), ints("e", ends), ints("a", axes), ints("st", steps)]
    return build(node, X2, inits)


def gather(indices):
    return build(helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=1), X2, [ints("i", indices)])


def unsqueeze(axes):
    return build(helper.make_node("Unsqueeze", ["x", "a"], ["y"], name="u"), X2, [ints("a", axes)])


def layernorm(axis):
    scale = numpy_helper.from_array(np.ones(5, np.float32), "w")
    node = helper.make_node("LayerNormalization", ["x", "w"], ["y"], name="ln", axis=axis)
    return build(node, X4, [scale])


def matmul(b_shape):
    node = helper.make_node("MatMul", ["x", "b"], ["y"], name="mm")
    return build(node, [vi("x", [3, 4]), vi("b", b_shape)])


def tile(repeats):
    return build(helper.make_node("Tile", ["x", "n"], ["y"], name="tl"), X2, [ints("n", repeats)])


def softmax(axis):
    return build(helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=axis), X4)


def concat(b_shape):
    node = helper.make_node("Concat", ["x", "b"], ["y"], name="c", axis=0)
    return build(node, [vi("x", [3, 4]), vi("b", b_shape)])


# (id, invalid model, valid neighbour, whether ORT's load refuses it, words attnrt's line holds)
CASES = [
    ("perm-repeats", transpose([0, 1, 1, 3]), transpose([0, 2, 1, 3]), True,
     ["'t' (Transpose)", "attribute perm [0, 1, 1, 3] repeats axis 1"]),
    ("perm-repeats-2", transpose([0, 2, 0, 3]), transpose([3, 2, 1, 0]), True, ["'t'", "repeats axis 0"]),
    ("perm-short", transpose([1, 0]), transpose([1, 0, 2, 3]), False, ["'t'", "perm [1, 0]", "rank 4"]),
    ("matmul-one-input", build(helper.make_node("MatMul", ["x"], ["y"], name="mm"), X2), matmul([4, 2]), True,
     ["'mm'", "1 input(s)"]),
    ("matmul-inner", matmul([5, 2]), matmul([4, 2]), True, ["'mm'", "contracted"]),
    ("layernorm-axis", layernorm(4), layernorm(-1), True, ["'ln'", "attribute axis 4 is outside"]),
    ("softmax-axis", softmax(-5), softmax(-4), True, ["'sm'", "axis -5"]),
    ("reshape-count", reshape([7, -1]), reshape([6, -1]), True, ["'r'", "input 1 's' [7, -1]", "has 120"]),
    ("reshape-count-fixed", reshape([7, 8]), reshape([12, 10]), False, ["'r'", "56 elements"]),
    ("reshape-two-minus-one", reshape([-1, -1]), reshape([-1, 5]), True, ["'r'", "more than one -1"]),
    ("split-sum", split([1, 2]), split([1, 3]), True, ["'sp'", "sums to 3"]),
    ("split-negative", split([-1, 5]), split([0, 4]), False, ["'sp'", "holds -1"]),
    ("slice-step-zero", slice_([0], [1], [0], [0]), slice_([0], [1], [0], [1]), True, ["'s'", "step of 0"]),
    ("slice-axis-twice", slice_([0, 0], [1, 1], [0, -2], [1, 1]), slice_([0, 0], [1, 1], [0, -1], [1, 1]), True,
     ["'s'", "repeats axis -2"]),
    ("gather-index", gather([0, 7]), gather([0, -4]), False, ["'g'", "index 7"]),
    ("unsqueeze-twice", unsqueeze([0, 0]), unsqueeze([0, 1]), True, ["'u'", "repeats axis 0"]),
    ("tile-length", tile([2]), tile([2, 1]), True, ["'tl'", "one per axis"]),
    ("tile-negative", tile([2, -1]), tile([2, 0]), False, ["'tl'", "holds -1"]),
    ("concat-ranks", concat([3]), concat([2, 4]), True, ["'c'", "rank 1"]),
]
IDS = [c[0] for c in CASES]


def feeds(model: onnx.ModelProto) -> dict:
    """Ones of each declared input's shape."""
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        out[i.name] = np.ones(shape, np.float32)
    return out


def ort_outcome(model: onnx.ModelProto) -> str:
    """'load' or 'run' where onnxruntime refuses the model, 'ok' when it runs."""
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime raises its own exception types per failure
        return "load"
    try:
        sess.run(None, feeds(model))
    except Exception:
        return "run"
    return "ok"


@pytest.mark.parametrize("name,bad,good,at_load,words", CASES, ids=IDS)
def test_onnxruntime_refuses_each_case_and_runs_its_neighbour(name, bad, good, at_load, words):
    assert ort_outcome(bad) == ("load" if at_load else "run")
    assert ort_outcome(good) == "ok"


@pytest.mark.skipif(attnrt is None, reason="the attnrt package is not installed")
@pytest.mark.parametrize("name,bad,good,at_load,words", CASES, ids=IDS)
def test_attnrt_refuses_each_case_naming_node_and_operand(name, bad, good, at_load, words):
    for call in (attnrt.InferenceSession, attnrt.fuse):
        with pytest.raises(attnrt.AttnrtError) as e:
            call(bad.SerializeToString())
        line = str(e.value)
        assert "\n" not in line
        for w in words:
            assert w in line, line
    attnrt.InferenceSession(good.SerializeToString()).run(None, feeds(good))
