"""Generation with a decoder exported with its key/value cache, shaped after onnxruntime-genai::

    import attnrt
    model = attnrt.Model("decoder.onnx")                  # fuses attention, opens a session
    params = attnrt.GeneratorParams(model)
    params.set_search_options(max_length=64, do_sample=True, top_k=40, temperature=0.8)
    generator = attnrt.Generator(model, params)
    generator.append_tokens([[5, 9, 2], [7, 1, 4, 4]])    # one row per prompt (or one list)
    while not generator.is_done():
        generator.generate_next_token()                   # the GIL is released while it runs
        print(generator.get_next_tokens())                # one token per row (None: finished)
    print(generator.get_sequence(0))                      # prompt + generated tokens

or in one call: ``attnrt.generate(model, [5, 9, 2], max_new_tokens=16)``.

An encoder–decoder pair (optimum's Whisper, BART, T5 exports) takes its encoder, and its
encoder's inputs by name (one row per prompt); the prompts are then the decoder's start ids::

    model = attnrt.Model("decoder_model_merged.onnx", encoder="encoder_model.onnx")
    tokens = attnrt.generate(model, [50258, 50259, 50359], max_new_tokens=32,
                             encoder_inputs={"input_features": features})

(or ``params.set_encoder_inputs({...})`` before making the ``Generator``). The encoder runs
once, in ``append_tokens``. A decoder with past only (optimum's ``decoder_with_past_model.onnx``)
takes the decoder that makes its first step too: ``attnrt.Model(with_past, encoder=...,
first_step="decoder_model.onnx")``. The search options
follow transformers' logits processors (repetition penalty, temperature, top-k, top-p, min-p,
in that order); the same ``random_seed`` gives the same tokens on any thread count. Prompts of
different lengths run as one batch, padded on the left; each row's greedy tokens are those of
its prompt alone.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from ._attnrt import AttnrtError, DecoderModel as _DecoderModel, Generation as _Generation

ModelSource = Union[str, "os.PathLike[str]", bytes]

#: The search options attnrt takes (onnxruntime-genai's names, plus max_new_tokens and
#: eos_token_id).
SEARCH_OPTIONS = (
    "max_length",
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "random_seed",
    "eos_token_id",
    "kv_cache",
)


def _source(model: Optional[ModelSource]) -> Union[str, bytes, None]:
    return model if model is None or isinstance(model, bytes) else os.fspath(model)


class Model:
    """A decoder with a KV cache, fused unless ``fuse=False``; ``threads`` and ``max_memory``
    as for :class:`attnrt.InferenceSession`. For an encoder–decoder pair, ``encoder`` is the
    encoder (fused too), and ``first_step`` the decoder that makes the first step when
    ``model`` is a decoder with past only."""

    def __init__(
        self,
        model: ModelSource,
        *,
        encoder: Optional[ModelSource] = None,
        first_step: Optional[ModelSource] = None,
        fuse: bool = True,
        threads: Optional[int] = None,
        max_memory: Union[int, str, None] = None,
    ):
        budget = None if max_memory is None else str(max_memory)
        self._core = _DecoderModel(
            _source(model), fuse, threads, budget, _source(encoder), _source(first_step)
        )

    @property
    def context_length(self) -> Optional[int]:
        """The positions the model has (its position table's rows), when its graph shows them."""
        return self._core.context_length()

    @property
    def vocab_size(self) -> Optional[int]:
        return self._core.vocab_size()

    def fusion_report(self, part: str = "decoder") -> Optional[Dict[str, Any]]:
        """The fusion report of ``part``: ``"decoder"``, ``"encoder"`` or ``"first_step"``
        (``None`` with ``fuse=False`` or without that part)."""
        report = self._core.fusion_report(part)
        return json.loads(report) if report else None


class GeneratorParams:
    """The search options of a :class:`Generator` (onnxruntime-genai's ``GeneratorParams``)."""

    def __init__(self, model: Model):
        self.model = model
        self.search_options: Dict[str, Any] = {}
        self.encoder_inputs: Optional[Dict[str, Any]] = None

    def set_search_options(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(SEARCH_OPTIONS))
        if unknown:
            raise AttnrtError(
                f"unknown search option(s) {', '.join(unknown)} (attnrt takes: {', '.join(SEARCH_OPTIONS)})"
            )
        self.search_options.update(options)

    def set_encoder_inputs(self, inputs: Mapping[str, Any]) -> None:
        """An encoder–decoder's encoder inputs: input name → numpy array, one row per prompt
        (a dict, or ``np.load`` of an ``.npz``)."""
        self.encoder_inputs = dict(inputs)


def _rows(tokens: Any) -> Tuple[List[List[int]], bool]:
    """The rows of one prompt (a list of ids, a 1-D array) or of a batch (a list of lists, a
    2-D array), and whether it was one prompt."""
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    tokens = list(tokens)
    if all(hasattr(t, "__index__") for t in tokens):
        return [[int(t) for t in tokens]], True
    return [[int(t) for t in row] for row in tokens], False


class Generator:
    """One generation on ``model`` with ``params``' search options (onnxruntime-genai's
    ``Generator``): ``append_tokens`` gives the prompts, then each ``generate_next_token`` runs
    one step until ``is_done``. Iterating yields each step's tokens (one per row)."""

    def __init__(self, model: Model, params: GeneratorParams):
        options = dict(params.search_options)
        self._core = _Generation(model._core, **options)
        if params.encoder_inputs is not None:
            self.set_encoder_inputs(params.encoder_inputs)

    def set_encoder_inputs(self, inputs: Mapping[str, Any]) -> None:
        """As :meth:`GeneratorParams.set_encoder_inputs`, before ``append_tokens``
        (onnxruntime-genai's ``set_inputs``)."""
        self._core.set_encoder_inputs(dict(inputs))

    def append_tokens(self, tokens: Any) -> None:
        self._core.append_tokens(_rows(tokens)[0])

    def is_done(self) -> bool:
        return self._core.is_done()

    def generate_next_token(self) -> None:
        self._core.generate_next_token()

    def get_next_tokens(self) -> List[Optional[int]]:
        return self._core.get_next_tokens()

    def get_sequence(self, index: int) -> List[int]:
        return self._core.get_sequence(index)

    def report(self) -> Optional[Dict[str, Any]]:
        """What ``attnrt generate --json`` prints under ``report``: per-row tokens, steps and
        their times, why it stopped."""
        report = self._core.report()
        return json.loads(report) if report else None

    def __iter__(self) -> Iterator[List[Optional[int]]]:
        while not self.is_done():
            if not self._core.generate_next_token():
                break
            yield self.get_next_tokens()


def generate(
    model: Model,
    prompt: Any,
    *,
    encoder_inputs: Optional[Mapping[str, Any]] = None,
    **search_options: Any,
) -> Union[List[int], List[List[int]]]:
    """The tokens generated for ``prompt`` (one list of ids: a list back; a batch: one list per
    row), with ``search_options`` as for :meth:`GeneratorParams.set_search_options`; an
    encoder–decoder's ``encoder_inputs`` as for :meth:`GeneratorParams.set_encoder_inputs`
    (``prompt`` is then the decoder's start ids)."""
    params = GeneratorParams(model)
    params.set_search_options(**search_options)
    if encoder_inputs is not None:
        params.set_encoder_inputs(encoder_inputs)
    generator = Generator(model, params)
    rows, single = _rows(prompt)
    generator.append_tokens(rows)
    for _ in generator:
        pass
    made = [generator.get_sequence(i)[len(r):] for i, r in enumerate(rows)]
    return made[0] if single else made
