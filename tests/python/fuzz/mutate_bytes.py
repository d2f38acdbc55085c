"""Raw mutations of a serialized model: what a damaged download or a hand-made file looks like
to the protobuf decoder (lengths that run past the end, varints that never end, wrong wire
types), and what survives decoding with fields shifted.

Each mutator changes the ``bytearray`` in place and returns a one-line description.
"""
from __future__ import annotations

import random
from typing import Callable


def _offset(data: bytearray, rng: random.Random) -> int:
    return rng.randrange(len(data) + 1)


def flip_bytes(data: bytearray, rng: random.Random) -> str:
    """1 to 8 bytes: one bit flipped, or set to 0x00, 0xff or a random value."""
    if not data:
        return "flip: empty file"
    at = []
    for _ in range(rng.randint(1, 8)):
        k = rng.randrange(len(data))
        how = rng.choice(["bit", "zero", "ff", "random"])
        data[k] = {"bit": data[k] ^ (1 << rng.randrange(8)), "zero": 0, "ff": 0xFF,
                   "random": rng.randrange(256)}[how]
        at.append(f"{k}:{how}")
    return "flip " + " ".join(at)


def truncate(data: bytearray, rng: random.Random) -> str:
    k = _offset(data, rng)
    del data[k:]
    return f"truncate at {k}"


def insert_bytes(data: bytearray, rng: random.Random) -> str:
    """Random bytes, or a copy of a chunk of the file itself (a field repeated)."""
    k = _offset(data, rng)
    if data and rng.random() < 0.5:
        start = rng.randrange(len(data))
        chunk = data[start:start + rng.randint(1, 256)]
        what = f"a copy of {len(chunk)} bytes from {start}"
    else:
        chunk = bytearray(rng.randbytes(rng.randint(1, 16)))
        what = f"{len(chunk)} random bytes"
    data[k:k] = chunk
    return f"insert {what} at {k}"


def overlong_varint(data: bytearray, rng: random.Random) -> str:
    """A varint of ten 0xff-ish bytes: a length or a value of 2^63 and more."""
    k = _offset(data, rng)
    data[k:k + 10] = b"\xff" * 9 + b"\x01"
    return f"overlong varint at {k}"


MUTATORS: list[Callable[[bytearray, random.Random], str]] = [
    flip_bytes, flip_bytes, truncate, insert_bytes, overlong_varint,
]


def mutate(data: bytearray, rng: random.Random) -> str:
    """Applies one raw mutator; returns its description."""
    return rng.choice(MUTATORS)(data, rng)
