"""What a drill is: a stack, a load, faults on a timeline and the expected outcomes.

Drills are data so that ``docs/drills.md``, the report and the runner read the same
thing: the runner knows how to carry out each :class:`Fault` action and how to measure
each figure an :class:`Expect` names; a drill only combines them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any, Literal, get_args

import msgspec

__all__ = ["ACTIONS", "Action", "Drill", "Expect", "Fault", "LoadSpec", "StackSpec"]

Op = Literal["<", "<=", ">", ">=", "=="]
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
    "==": lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9),
}


Action = Literal[
    "engine_faults",
    "clear_engine_faults",
    "kill_engine",
    "restart_engine",
    "rolling_restart",
    "redeploy_engine",
    "kill_redis",
    "start_redis",
    "reload_config",
    "cancel_in_flight",
]
ACTIONS: tuple[str, ...] = get_args(Action)
"""The fault actions (see :class:`Fault`)."""


class StackSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The local stack a drill starts when no ``--target`` is given."""

    upstreams: int = 3
    """Emulated engines behind the gateway."""

    max_num_seqs: int = 4
    """Each engine's ``max_num_seqs`` (and the gateway's slots per upstream)."""

    speedup: float = 1.0
    """Engine seconds per wall second (1: real H100 speeds for Llama-3-8B)."""

    gateways: int = 1
    """Gateway instances (two share budgets through Redis)."""

    redis: bool = False
    """Start a ``redis-server`` and pass ``--redis`` to the gateways."""

    pool: bool = True
    """Readiness probes with fingerprints (``pool:``) in the gateway config."""

    gateway: dict[str, Any] = msgspec.field(default_factory=dict)
    """Gateway config keys set for this drill (over the stack's defaults)."""

    num_kv_blocks: int | None = None
    """Each engine's KV pool (None: from the GPU's memory)."""

    revisions: list[str] = msgspec.field(default_factory=list)
    """Each engine's revision, in order (missing ones: ``r1``): a release in progress,
    such as a canary of ``r2`` beside ``r1``."""

    def revision(self, engine: int) -> str:
        """Engine ``engine``'s revision."""
        return self.revisions[engine] if engine < len(self.revisions) else "r1"


class LoadSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The clients: an open-loop Poisson stream of chat requests."""

    rate_per_s: float
    """Arrivals per second, all tenants together."""

    duration_s: float
    """How long arrivals go on."""

    tenants: dict[str, float] = msgspec.field(default_factory=lambda: {"sk-drill-a": 1.0})
    """API key → share of the arrivals."""

    stream_fraction: float = 0.5
    """Share of requests that stream."""

    prompt_words: int = 40
    """Words in each prompt (about 1.3 tokens each)."""

    max_tokens: int = 48
    """``max_tokens`` of each request."""

    deadline_ms: int | None = None
    """``x-headway-deadline-ms`` of each request; every attempt sends at most what is left
    of ``timeout_s`` less 2 s (None: that alone)."""

    retry: Literal["none", "obey", "storm"] = "obey"
    """After a 429/503: ``none`` gives up; ``obey`` waits the Retry-After and retries with
    the ticket (a budget's 429 without one: its own jittered backoff; at most
    ``max_attempts``; it gives up when the wait would not leave time to be served within
    ``timeout_s``); ``storm`` retries at once, ignoring both."""

    max_attempts: int = 3
    """Attempts per call, the first included."""

    cancel_fraction: float = 0.0
    """Share of calls the client abandons ``cancel_after_s`` after sending."""

    cancel_after_s: float = 0.3
    """When abandoned calls are abandoned."""

    slow_reader_fraction: float = 0.0
    """Share of streaming calls read slowly (``slow_read_pause_s`` between reads)."""

    slow_read_pause_s: float = 0.2
    """A slow reader's pause between reads."""

    timeout_s: float = 30.0
    """A call not ended this long after it started counts as hung."""


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    """One action at ``at_s`` seconds after the load starts."""

    at_s: float
    action: Action
    """``engine_faults``: POST ``params`` to the engine's ``/admin/faults``;
    ``kill_engine``: SIGKILL it; ``restart_engine``: start it again on its port;
    ``rolling_restart``: drain, restart and undrain each engine in turn;
    ``redeploy_engine``: restart it with ``params`` (e.g. another revision: a bad deploy
    or its rollback); ``kill_redis``/``start_redis``; ``reload_config``: merge ``params``
    into the gateway config and POST ``/admin/reload``; ``cancel_in_flight``: the client
    abandons ``params.fraction`` of its calls in flight."""

    engine: int = 0
    """Which engine (index) the action is about."""

    params: dict[str, Any] = msgspec.field(default_factory=dict)


class Expect(msgspec.Struct, frozen=True, kw_only=True):
    """An outcome: ``figure op value``, and why the design promises it."""

    figure: str
    op: Op
    value: float
    why: str

    def holds(self, observed: float | None) -> bool:
        """Whether ``observed`` meets it (a figure that was not measured fails)."""
        if observed is None or not math.isfinite(observed):
            return False
        return _OPS[self.op](observed, self.value)


class Drill(msgspec.Struct, frozen=True, kw_only=True):
    """One drill."""

    name: str
    title: str
    seed_text: str
    """What seed 003 (or the issue) asks the drill to show."""

    designed: str
    """The designed behaviour: reject, retry, drain or rollback, and where."""

    load: LoadSpec
    faults: list[Fault] = msgspec.field(default_factory=list)
    expect: list[Expect] = msgspec.field(default_factory=list)
    stack: StackSpec = StackSpec()
    settle_s: float = 3.0
    """After the load ends: how long to wait for calls to end before judging."""
