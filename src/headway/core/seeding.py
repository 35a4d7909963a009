"""One run seed, many independent named random streams.

Every random draw in headway comes from a ``numpy.random.Generator`` obtained here, keyed
by the run seed and a stream name (``"arrivals/users"``, ``"lengths/knowledge"``, ...).
Streams with different names are statistically independent, the same (seed, name) always
gives the same stream, and adding a new stream never perturbs an existing one: the name
is hashed into the seed sequence instead of depending on the order of creation.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _name_key(name: str) -> list[int]:
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=16).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


def stream(seed: int, name: str) -> np.random.Generator:
    """Return the generator for stream ``name`` of run ``seed``."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0 (got {seed})")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *_name_key(name)])))
