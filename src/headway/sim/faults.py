"""Faults injected into a simulation: the cluster file's ``faults:`` list.

Each fault is an event on the virtual clock that the simulator applies to its replicas:

* ``replica_lost``: ``replicas`` replicas fail at ``at_s``. Their unfinished calls fail
  (``failed``; clients with retries send them again) and the router stops choosing them.
  ``phase`` picks the moment: ``any`` at ``at_s`` exactly; ``prefill``/``decode`` at the
  first step boundary at or after ``at_s`` where the victim is running a step with
  prefill work / a decode-only step, so a loss can be aimed at either phase.
* ``cache_flush``: every replica's prefix cache is emptied at ``at_s`` (a deploy that
  restarts the engines with cold caches); blocks in use are kept.
* ``slowdown``: steps take ``factor`` times longer from ``at_s`` to ``until_s`` (a noisy
  neighbour, thermal throttling, a degraded interconnect).

Faults are data; scenario builders (:mod:`headway.sim.baddays`) compose them.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

__all__ = ["CacheFlush", "Fault", "ReplicaLost", "Slowdown"]


class _Fault(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="kind"
):
    at_s: float
    """When it happens, seconds of virtual time from the start of the run."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.at_s) and self.at_s >= 0):
            raise ValueError(f"`at_s` must be a time >= 0 (got {self.at_s})")


class ReplicaLost(_Fault, frozen=True, kw_only=True, tag="replica_lost"):
    """Replicas fail; their unfinished calls fail with them."""

    replicas: int = 1
    """How many replicas fail (the highest-numbered live ones)."""

    phase: Literal["any", "prefill", "decode"] = "any"
    """Fail at ``at_s`` (``any``), or at the first step at or after it that has prefill
    work (``prefill``) or is decode-only (``decode``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.replicas < 1:
            raise ValueError(f"`replicas` must be >= 1 (got {self.replicas})")


class CacheFlush(_Fault, frozen=True, kw_only=True, tag="cache_flush"):
    """Every replica's prefix cache is emptied (cold after a deploy)."""


class Slowdown(_Fault, frozen=True, kw_only=True, tag="slowdown"):
    """Every step takes ``factor`` times longer between ``at_s`` and ``until_s``."""

    until_s: float
    """When the slowdown ends."""

    factor: float = 2.0
    """How many times longer each step takes (> 1 slows down)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.until_s) and self.until_s > self.at_s):
            raise ValueError(f"`until_s` must be after `at_s` (got {self.until_s})")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"`factor` must be > 0 (got {self.factor})")


Fault = ReplicaLost | CacheFlush | Slowdown
"""One injected fault."""
