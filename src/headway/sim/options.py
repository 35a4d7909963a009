"""The knobs of one simulation run, :class:`SimOptions`.

Apart from :mod:`headway.sim.simulator` because that module is compiled (``pyproject.toml``,
``[tool.hatch.build.hooks.custom]``) and the options travel to worker processes by pickle,
which a compiled frozen dataclass does not survive.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SimOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    """Knobs of one simulation run."""

    skip_decode: bool = True
    """Jump over runs of identical decode steps (results are identical either way)."""

    sample_points: int = 1000
    """How many timeline samples (KV occupancy, running, waiting) to take."""

    check_invariants: bool = False
    """Check every replica's invariants after every step (slow; for tests)."""

    prefix_block_tokens: int | None = None
    """Token size of the workload's prefix blocks, when calls carry prefix hash ids."""
