"""Structure-aware mutations of an ONNX model, through the onnx API.

Each mutator takes the model (changed in place) and a ``random.Random`` and returns a
one-line description of what it changed, or None when the model has nothing it applies to.
They make models that are well-formed protobuf but wrong as ONNX in the ways an exporter,
an editor or an attacker would: a dim, an element type, an attribute value, a name, an op
type, a node deleted or duplicated or out of order, an initializer whose dims or type no
longer match its data.
"""
from __future__ import annotations

import math
import random
from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

# Values at the edges of what the code does arithmetic with: negative, zero, one, the i32 and
# u32 limits, sizes whose products overflow.
INTERESTING_INTS = [-(2**63), -(2**31), -65, -3, -2, -1, 0, 1, 2, 3, 4, 5, 7, 8, 16, 64, 255,
                    2**16, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1]
INTERESTING_DIMS = [0, 1, 2, 3, 5, 7, 64, 1000, 2**31, 2**40, 2**62, -1, -7]
INTERESTING_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e30, 1e-30, -0.0]
# Element types: every TensorProto.DataType (0 = UNDEFINED) and two that are none.
ELEM_TYPES = list(range(0, 24)) + [99, -1]
OPSET_VERSIONS = [1, 6, 11, 13, 17, 18, 20, 21, 23, 24, 99]
# op_type swaps among ops that take similar inputs, so the graph stays plausible.
OP_FAMILIES = [
    ["MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less"],
    ["Softmax", "LogSoftmax", "Relu", "Tanh", "Sigmoid", "Erf", "Sqrt", "Neg", "Identity",
     "Exp", "Not", "Cast", "Gelu"],
    ["Reshape", "Expand", "Tile", "Unsqueeze", "Squeeze", "Transpose", "Flatten"],
    ["Concat", "Split", "Slice", "Gather", "GatherElements", "Where", "Range", "Trilu"],
    ["ReduceMean", "ReduceSum", "ReduceMax", "LayerNormalization", "Softmax", "Shape",
     "ConstantOfShape", "Size"],
    ["Attention", "MatMul", "Softmax", "Concat"],
]
_TENSOR_ATTR = onnx.AttributeProto.TENSOR


def graphs(m: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph and every subgraph in node attributes, depth first."""
    stack = [m.graph]
    while stack:
        g = stack.pop()
        yield g
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    stack.append(a.g)
                stack.extend(a.graphs)


def _nodes(m: onnx.ModelProto) -> list[tuple[onnx.GraphProto, onnx.NodeProto]]:
    return [(g, n) for g in graphs(m) for n in g.node]


def _value_infos(m: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    return [v for g in graphs(m) for v in [*g.input, *g.output, *g.value_info]
            if v.type.HasField("tensor_type")]


def _attributes(m: onnx.ModelProto, kind: int) -> list[tuple[onnx.NodeProto, onnx.AttributeProto]]:
    return [(n, a) for _, n in _nodes(m) for a in n.attribute if a.type == kind]


def _value_names(g: onnx.GraphProto) -> list[str]:
    names = [v.name for v in g.input] + [t.name for t in g.initializer]
    return names + [o for n in g.node for o in n.output if o]


def _int_tensors(m: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Small integer tensors (initializers and Constant values): shapes, axes, indices."""
    found = [t for g in graphs(m) for t in g.initializer]
    found += [a.t for _, a in _attributes(m, _TENSOR_ATTR)]
    ints = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    return [t for t in found if t.data_type in ints and 0 < math.prod(t.dims) <= 64]


def mutate_dim(m: onnx.ModelProto, rng: random.Random) -> str | None:
    vis = [v for v in _value_infos(m) if v.type.tensor_type.shape.dim]
    if not vis:
        return None
    v = rng.choice(vis)
    dims = v.type.tensor_type.shape.dim
    k = rng.randrange(len(dims))
    roll = rng.random()
    if roll < 0.7:
        dims[k].dim_value = rng.choice(INTERESTING_DIMS)
        return f"dim {v.name}[{k}] = {dims[k].dim_value}"
    if roll < 0.85:
        dims[k].dim_param = rng.choice(["batch", "sequence", "fz"])
        return f"dim {v.name}[{k}] = {dims[k].dim_param!r}"
    if roll < 0.93:
        del dims[k]
        return f"dim {v.name}[{k}] removed"
    dims.add().dim_value = rng.choice(INTERESTING_DIMS)
    return f"dim {v.name} gets a dim {dims[-1].dim_value}"


def mutate_elem_type(m: onnx.ModelProto, rng: random.Random) -> str | None:
    vis = _value_infos(m)
    if not vis:
        return None
    v = rng.choice(vis)
    v.type.tensor_type.elem_type = rng.choice(ELEM_TYPES)
    return f"elem_type {v.name} = {v.type.tensor_type.elem_type}"


def mutate_int_attr(m: onnx.ModelProto, rng: random.Random) -> str | None:
    found = _attributes(m, onnx.AttributeProto.INT)
    if not found:
        return None
    n, a = rng.choice(found)
    a.i = rng.choice(INTERESTING_INTS + [a.i + 1, a.i - 1, -a.i])
    return f"attribute {n.name}.{a.name} = {a.i}"


def mutate_ints_attr(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """perm, axes, pads, shapes...: one element changed, swapped, dropped, added or all cleared."""
    found = _attributes(m, onnx.AttributeProto.INTS)
    if not found:
        return None
    n, a = rng.choice(found)
    v = list(a.ints)
    how = rng.choice(["set", "swap", "drop", "append", "clear", "reverse"])
    if how == "set" and v:
        v[rng.randrange(len(v))] = rng.choice(INTERESTING_INTS)
    elif how == "swap" and len(v) > 1:
        i, j = rng.sample(range(len(v)), 2)
        v[i], v[j] = v[j], v[i]
    elif how == "drop" and v:
        del v[rng.randrange(len(v))]
    elif how == "append":
        v.append(rng.choice(INTERESTING_INTS[3:14] + v))
    elif how == "clear":
        v = []
    else:
        v.reverse()
    del a.ints[:]
    a.ints.extend(v)
    return f"attribute {n.name}.{a.name} = {v} ({how})"


def mutate_float_attr(m: onnx.ModelProto, rng: random.Random) -> str | None:
    found = _attributes(m, onnx.AttributeProto.FLOAT)
    if not found:
        return None
    n, a = rng.choice(found)
    a.f = rng.choice(INTERESTING_FLOATS)
    return f"attribute {n.name}.{a.name} = {a.f}"


def mutate_attr_type(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """An attribute declares another type than the value it holds."""
    found = [(n, a) for _, n in _nodes(m) for a in n.attribute]
    if not found:
        return None
    n, a = rng.choice(found)
    a.type = rng.choice([t for t in range(0, 15) if t != a.type])
    return f"attribute {n.name}.{a.name} declared as type {a.type}"


def mutate_int_tensor(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """One element of a small integer constant (a Reshape target, axes, indices)."""
    found = _int_tensors(m)
    if not found:
        return None
    t = rng.choice(found)
    values = numpy_helper.to_array(t).copy()
    flat = values.reshape(-1)
    k = rng.randrange(flat.size)
    info = np.iinfo(flat.dtype)
    flat[k] = min(max(rng.choice(INTERESTING_INTS), info.min), info.max)
    t.CopyFrom(numpy_helper.from_array(values, t.name))
    return f"tensor {t.name!r} element {k} = {flat[k]}"


def mutate_input_name(m: onnx.ModelProto, rng: random.Random) -> str | None:
    found = [(g, n) for g, n in _nodes(m) if n.input]
    if not found:
        return None
    g, n = rng.choice(found)
    k = rng.randrange(len(n.input))
    n.input[k] = rng.choice(_value_names(g) + ["", "fz_missing"])
    return f"node {n.name} input {k} = {n.input[k]!r}"


def mutate_output_name(m: onnx.ModelProto, rng: random.Random) -> str | None:
    found = [(g, n) for g, n in _nodes(m) if n.output]
    if not found:
        return None
    g, n = rng.choice(found)
    k = rng.randrange(len(n.output))
    n.output[k] = rng.choice(_value_names(g) + [o.name for o in g.output] + ["", "fz_new"])
    return f"node {n.name} output {k} = {n.output[k]!r}"


def mutate_op_type(m: onnx.ModelProto, rng: random.Random) -> str | None:
    found = _nodes(m)
    if not found:
        return None
    _, n = rng.choice(found)
    family = next((f for f in OP_FAMILIES if n.op_type in f), rng.choice(OP_FAMILIES))
    old, n.op_type = n.op_type, rng.choice(family)
    return f"node {n.name} op_type {old} -> {n.op_type}"


def delete_node(m: onnx.ModelProto, rng: random.Random) -> str | None:
    found = [g for g in graphs(m) if g.node]
    if not found:
        return None
    g = rng.choice(found)
    k = rng.randrange(len(g.node))
    name = g.node[k].name
    del g.node[k]
    return f"node {name} deleted"


def duplicate_node(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """A copy of a node somewhere else: same outputs (two producers), or renamed ones."""
    found = [g for g in graphs(m) if g.node]
    if not found:
        return None
    g = rng.choice(found)
    copy = onnx.NodeProto()
    copy.CopyFrom(rng.choice(g.node))
    renamed = rng.random() < 0.5
    if renamed:
        copy.output[:] = [f"{o}_fz" for o in copy.output]
    at = rng.randrange(len(g.node) + 1)
    g.node.insert(at, copy)
    return f"node {copy.name} duplicated at {at}" + (" (outputs renamed)" if renamed else "")


def move_node(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """A node moved before the ones it reads from (the graph is no longer sorted)."""
    found = [g for g in graphs(m) if len(g.node) > 1]
    if not found:
        return None
    g = rng.choice(found)
    k = rng.randrange(1, len(g.node))
    node = onnx.NodeProto()
    node.CopyFrom(g.node[k])
    del g.node[k]
    at = rng.randrange(k)
    g.node.insert(at, node)
    return f"node {node.name} moved from {k} to {at}"


def mutate_initializer_dims(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """An initializer's dims changed, its data left as it was."""
    found = [t for g in graphs(m) for t in g.initializer]
    if not found:
        return None
    t = rng.choice(found)
    dims = list(t.dims)
    how = rng.choice(["set", "add", "drop", "swap"])
    if how == "set" and dims:
        dims[rng.randrange(len(dims))] = rng.choice(INTERESTING_DIMS)
    elif how == "drop" and dims:
        del dims[rng.randrange(len(dims))]
    elif how == "swap" and len(dims) > 1:
        i, j = rng.sample(range(len(dims)), 2)
        dims[i], dims[j] = dims[j] + 1, dims[i]
    else:
        dims.insert(rng.randrange(len(dims) + 1), rng.choice(INTERESTING_DIMS))
    del t.dims[:]
    t.dims.extend(dims)
    return f"initializer {t.name} dims = {dims} ({how})"


def mutate_initializer_type(m: onnx.ModelProto, rng: random.Random) -> str | None:
    found = [t for g in graphs(m) for t in g.initializer]
    if not found:
        return None
    t = rng.choice(found)
    t.data_type = rng.choice(ELEM_TYPES)
    return f"initializer {t.name} data_type = {t.data_type}"


def mutate_opset(m: onnx.ModelProto, rng: random.Random) -> str | None:
    found = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
    if not found:
        return None
    found[0].version = rng.choice(OPSET_VERSIONS)
    return f"opset = {found[0].version}"


def delete_graph_entry(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """A graph input, output, value_info or initializer removed."""
    lists = [(name, getattr(m.graph, name)) for name in
             ("input", "output", "value_info", "initializer") if len(getattr(m.graph, name))]
    if not lists:
        return None
    what, entries = rng.choice(lists)
    k = rng.randrange(len(entries))
    name = entries[k].name
    del entries[k]
    return f"graph {what} {name} deleted"


Mutator = Callable[[onnx.ModelProto, random.Random], "str | None"]

# Weighted toward what reaches shape and attribute logic; raw bytes are in mutate_bytes.
MUTATORS: list[tuple[Mutator, int]] = [
    (mutate_dim, 4), (mutate_elem_type, 2), (mutate_int_attr, 4), (mutate_ints_attr, 4),
    (mutate_float_attr, 1), (mutate_attr_type, 1), (mutate_int_tensor, 4),
    (mutate_input_name, 3), (mutate_output_name, 2), (mutate_op_type, 3), (delete_node, 2),
    (duplicate_node, 2), (move_node, 1), (mutate_initializer_dims, 3),
    (mutate_initializer_type, 1), (mutate_opset, 1), (delete_graph_entry, 1),
]


def mutate(m: onnx.ModelProto, rng: random.Random) -> str:
    """Applies one mutator that fits the model; returns its description."""
    fns, weights = zip(*MUTATORS)
    for _ in range(20):
        fn = rng.choices(fns, weights)[0]
        try:
            done = fn(m, rng)
        except (ValueError, TypeError, OverflowError):
            # A tensor an earlier mutation left inconsistent (dims without their data) cannot
            # be decoded by numpy_helper: try another mutator.
            continue
        if done is not None:
            return done
    return "no structural mutation applied"
