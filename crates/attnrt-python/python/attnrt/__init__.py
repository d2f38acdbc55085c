"""attnrt: run ONNX models exported from PyTorch on CPUs, with their attention fused.

Shaped like onnxruntime, so swapping ``onnxruntime.InferenceSession`` for
``attnrt.InferenceSession`` works for the models attnrt supports::

    import attnrt
    sess = attnrt.InferenceSession("model.onnx")          # fuses attention, then plans
    print([i.name for i in sess.get_inputs()])
    (y,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})

    fused_bytes, report = attnrt.fuse("model.onnx")       # or fuse(..., output="fused.onnx")
    print(report.summary())                               # blocks fused, near misses and why

    model = attnrt.Model("decoder.onnx")                  # generation, like onnxruntime-genai
    tokens = attnrt.generate(model, [5, 9, 2], max_new_tokens=16)   # see attnrt.generation
    pair = attnrt.Model("decoder_model_merged.onnx", encoder="encoder_model.onnx")
    tokens = attnrt.generate(pair, [1, 5, 7], max_new_tokens=16,      # decoder start ids
                             encoder_inputs={"input_features": features})

Errors are raised as :class:`AttnrtError` with attnrt's one-line message (the file, node or
tensor named). A session serves any input shape it is given, and may be used from several
threads at once: the GIL is released while a model runs.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ._attnrt import AttnrtError, Session as _Session, __version__, fuse_model as _fuse_model
from ._attnrt import write_atomic as _write_atomic

from .generation import Generator, GeneratorParams, Model, generate

__all__ = [
    "AttnrtError",
    "FusionReport",
    "Generator",
    "GeneratorParams",
    "InferenceSession",
    "Model",
    "NodeArg",
    "fuse",
    "generate",
    "__version__",
]

ModelSource = Union[str, "os.PathLike[str]", bytes]


class NodeArg:
    """An input or output of a model, as onnxruntime's ``NodeArg``: ``name``, ``shape`` (ints
    for fixed axes, strings for symbolic ones, ``None`` for unknown ones) and ``type``
    (e.g. ``"tensor(float)"``)."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name: str, shape: Optional[List[Union[int, str, None]]], type: str):
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class FusionReport:
    """What fusion did: the blocks fused and every near miss with the check that failed.

    ``as_dict()`` is exactly the ``report`` object that ``attnrt fuse --json`` prints."""

    def __init__(self, report_json: str):
        self._report: Dict[str, Any] = json.loads(report_json)

    @property
    def blocks(self) -> List[Dict[str, Any]]:
        """One entry per fused block."""
        return self._report.get("blocks", [])

    @property
    def activations(self) -> List[Dict[str, Any]]:
        """One entry per fused activation (GELU → ``Gelu``)."""
        return self._report.get("activations", [])

    @property
    def near_misses(self) -> List[Dict[str, Any]]:
        """One entry per candidate that was not fused, naming the node and the failed check."""
        return self._report.get("near_misses", [])

    def as_dict(self) -> Dict[str, Any]:
        return self._report

    def summary(self) -> str:
        """One line per fused block and near miss."""
        lines = [f"{len(self.blocks)} block(s) fused, {len(self.near_misses)} not fused, "
                 f"{len(self.activations)} GELU(s) fused"]
        lines += [f"fused: {b.get('node')}" for b in self.blocks]
        lines += [f"fused: {a.get('node')} ({a.get('rule')})" for a in self.activations]
        lines += [
            f"not fused: {m.get('softmax')} (rule {m.get('rule')}): at {m.get('node')} "
            f"[{m.get('check')}]: {m.get('reason')}"
            for m in self.near_misses
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"FusionReport(blocks={len(self.blocks)}, activations={len(self.activations)}, "
                f"near_misses={len(self.near_misses)})")


def _source(model: ModelSource) -> Union[str, bytes]:
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    return os.fspath(model)


def fuse(
    model: ModelSource,
    output: Optional[Union[str, "os.PathLike[str]"]] = None,
    explain: bool = False,
    strict: bool = False,
    gelu: bool = True,
) -> Tuple[Union[bytes, str], FusionReport]:
    """Fuses every attention block of ``model`` (a path or the bytes of an ONNX file), and its
    GELU activations unless ``gelu=False``.

    Returns ``(fused, report)``: ``fused`` is the fused model's bytes, or ``output`` (the path
    it was written to, atomically) when given. With ``explain=True`` the report's summary (every
    near miss and why) is also printed, as ``attnrt fuse --explain`` does."""
    data, report_json = _fuse_model(_source(model), strict, gelu)
    report = FusionReport(report_json)
    if explain:
        print(report.summary())
    if output is not None:
        path = os.fspath(output)
        _write_atomic(path, data)
        return path, report
    return data, report


class InferenceSession:
    """A model ready to run, shaped like ``onnxruntime.InferenceSession``.

    ``path_or_bytes``: the model; ``fuse``: fuse its attention first (default); ``threads``:
    threads for the matmuls and the attention kernel (default: all cores); ``max_memory``: the
    most memory a run's inputs and intermediates may need at once, in bytes or as a size such as
    ``"8G"`` or ``"512M"`` (default: 75% of the memory available); a run over it raises
    ``AttnrtError`` naming the tensor and the size before it starts. Extra keyword
    arguments onnxruntime takes (``providers``, ``sess_options``) are accepted and ignored:
    attnrt runs on the CPU."""

    def __init__(
        self,
        path_or_bytes: ModelSource,
        sess_options: Any = None,
        providers: Optional[Sequence[Any]] = None,
        *,
        fuse: bool = True,
        threads: Optional[int] = None,
        max_memory: Union[int, str, None] = None,
        **_ignored: Any,
    ):
        budget = None if max_memory is None else str(max_memory)
        self._session = _Session(_source(path_or_bytes), fuse, threads, budget)
        self._inputs = [NodeArg(*a) for a in self._session.inputs()]
        self._outputs = [NodeArg(*a) for a in self._session.outputs()]
        report = self._session.fusion_report()
        self.fusion_report: Optional[FusionReport] = FusionReport(report) if report else None

    def get_inputs(self) -> List[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> List[str]:
        return ["CPUExecutionProvider"]

    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Dict[str, Any],
        run_options: Any = None,
    ) -> List[Any]:
        """Runs the model; returns the outputs named in ``output_names`` (all when ``None``), in
        that order, as numpy arrays."""
        if not isinstance(input_feed, dict):
            raise AttnrtError(f"input_feed must be a dict of name -> numpy array, got {type(input_feed).__name__}")
        results = dict(self._session.run(input_feed))
        if output_names is None:
            return [results[o.name] for o in self._outputs if o.name in results]
        missing = [n for n in output_names if n not in results]
        if missing:
            raise AttnrtError(
                f"output(s) {', '.join(missing)} are not outputs of the model "
                f"(outputs: {', '.join(o.name for o in self._outputs)})"
            )
        return [results[n] for n in output_names]
