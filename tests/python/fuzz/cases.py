"""One fuzz case: a source model and one to three mutations, all drawn from (seed, index).

The same seed, index and list of sources give the same bytes on any machine and with any
number of workers, so a case can be made again from its reproducer's JSON alone.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from . import mutate_bytes, mutate_model

# A share of the mutations work on the serialized bytes; the rest go through the onnx API,
# which reaches validation, shape logic and fusion (raw damage mostly stops at decoding).
RAW_SHARE = 0.2


@dataclass
class Source:
    """A model to mutate, decoded once (without its external data: the files it names are
    copied next to each case instead)."""
    path: Path
    model: onnx.ModelProto
    external_files: list[str] = field(default_factory=list)

    @staticmethod
    def load(path: Path) -> "Source":
        m = onnx.load_model(str(path), load_external_data=False)
        files = sorted({e.value for g in mutate_model.graphs(m) for t in g.initializer
                        for e in t.external_data if e.key == "location"})
        return Source(path, m, files)


@dataclass
class Case:
    seed: int
    index: int
    source: Source
    mutations: list[str]
    data: bytes


def case_rng(seed: int, index: int) -> random.Random:
    """The case's own generator (a string seed is hashed the same everywhere)."""
    return random.Random(f"attnrt-fuzz:{seed}:{index}")


def make_case(sources: list[Source], seed: int, index: int) -> Case:
    rng = case_rng(seed, index)
    source = rng.choice(sources)
    kinds = ["raw" if rng.random() < RAW_SHARE else "model" for _ in range(rng.randint(1, 3))]
    model = onnx.ModelProto()
    model.CopyFrom(source.model)
    # Structural first: raw damage would make the bytes undecodable for the onnx API.
    mutations = [mutate_model.mutate(model, rng) for k in kinds if k == "model"]
    data = bytearray(model.SerializeToString())
    mutations += [mutate_bytes.mutate(data, rng) for k in kinds if k == "raw"]
    return Case(seed, index, source, mutations, bytes(data))
