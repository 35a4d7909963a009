"""Routing: which replica gets a request.

Every router is a pure policy: :meth:`Router.route` takes ``now``, the request's
:class:`RouteRequest` and one :class:`ReplicaLoad` per replica, and returns the index of
the chosen replica (or ``None`` when no replica may take it). Routers never see a clock
or a socket; the simulator and the gateway build the loads from their own state.

Policies (``RouterKind``):

* ``round_robin``: the next eligible replica in turn.
* ``least_outstanding_requests``: fewest requests running or waiting (ties: lowest index).
* ``least_outstanding_tokens``: fewest tokens still to compute (prefill + decode).
* ``kv_aware``: most free KV blocks after placing the request's projected blocks, then
  fewest waiting.
* ``prefix_affinity``: the replica that served the request's prefix group last, while its
  load is within ``affinity_slack`` requests of the least loaded one; else least loaded.

Revision constraints apply to all: a request pinned to a model revision is only routed to
replicas serving that revision; draining and unready replicas are never chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

RouterKind = Literal[
    "round_robin",
    "least_outstanding_requests",
    "least_outstanding_tokens",
    "kv_aware",
    "prefix_affinity",
]
ROUTER_KINDS: tuple[RouterKind, ...] = (
    "round_robin",
    "least_outstanding_requests",
    "least_outstanding_tokens",
    "kv_aware",
    "prefix_affinity",
)


class LoadView(Protocol):
    """What a router reads about one replica (:class:`ReplicaLoad` is the plain value;
    a driver may pass its own live objects with these attributes to avoid copies)."""

    @property
    def outstanding_requests(self) -> int: ...
    @property
    def outstanding_tokens(self) -> int: ...
    @property
    def free_kv_blocks(self) -> int: ...
    @property
    def waiting_requests(self) -> int: ...
    @property
    def revision(self) -> str | None: ...
    @property
    def ready(self) -> bool: ...


@dataclass(slots=True, init=False, unsafe_hash=True)  # a value: see BatchShape
class ReplicaLoad:
    """What a router knows about one replica."""

    outstanding_requests: int
    """Requests running or waiting on the replica."""

    outstanding_tokens: int
    """Tokens still to compute: remaining prompt plus remaining output (estimated)."""

    free_kv_blocks: int
    """KV blocks not held by a request."""

    waiting_requests: int
    """Requests waiting for admission."""

    revision: str | None
    """The model revision the replica serves."""

    ready: bool
    """False while warming up, draining or failed: never routed to."""

    def __init__(
        self,
        *,
        outstanding_requests: int,
        outstanding_tokens: int = 0,
        free_kv_blocks: int = 0,
        waiting_requests: int = 0,
        revision: str | None = None,
        ready: bool = True,
    ) -> None:
        self.outstanding_requests = outstanding_requests
        self.outstanding_tokens = outstanding_tokens
        self.free_kv_blocks = free_kv_blocks
        self.waiting_requests = waiting_requests
        self.revision = revision
        self.ready = ready


@dataclass(slots=True, init=False, unsafe_hash=True)  # a value: see BatchShape
class RouteRequest:
    """What a router knows about the request it places."""

    prompt_tokens: int
    """Prompt length."""

    expected_output_tokens: int
    """Output length the router should plan for (``max_tokens`` or a class estimate)."""

    projected_kv_blocks: int
    """KV blocks the request will hold at its end."""

    revision: str | None
    """Pinned model revision (None: any)."""

    prefix_group: int | None
    """Requests with the same group share a prompt prefix (session, document)."""

    def __init__(
        self,
        *,
        prompt_tokens: int,
        expected_output_tokens: int,
        projected_kv_blocks: int = 0,
        revision: str | None = None,
        prefix_group: int | None = None,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.expected_output_tokens = expected_output_tokens
        self.projected_kv_blocks = projected_kv_blocks
        self.revision = revision
        self.prefix_group = prefix_group


@dataclass(slots=True)
class Router:
    """A routing policy with its small memory (turn counter, prefix placements)."""

    kind: RouterKind = "least_outstanding_requests"
    affinity_slack: int = 4
    """``prefix_affinity``: stay on the prefix's replica while it has at most this many
    more outstanding requests than the least loaded eligible replica."""

    _turn: int = 0
    _affinity: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ROUTER_KINDS:
            raise ValueError(
                f"router kind {self.kind!r} is not known; use one of {', '.join(ROUTER_KINDS)}"
            )
        if self.affinity_slack < 0:
            raise ValueError(f"affinity_slack must be >= 0 (got {self.affinity_slack})")

    def route_all_eligible(self, outstanding_requests: Sequence[int]) -> int:
        """``least_outstanding_requests`` when every replica is eligible, from the counts.

        The same choice as :meth:`route` (fewest outstanding, lowest index on ties), for
        drivers that keep a list of counts and know that no replica is unready or pinned
        to another revision: one C-level ``min`` instead of a scan of load objects.

        Raises:
            ValueError: for any other router kind.
        """
        if self.kind != "least_outstanding_requests":
            raise ValueError(
                f"route_all_eligible is for least_outstanding_requests, not {self.kind}"
            )
        return outstanding_requests.index(min(outstanding_requests))

    def route(self, now: float, request: RouteRequest, loads: Sequence[LoadView]) -> int | None:
        """The index of the chosen replica, or None when none is eligible."""
        del now  # routing is state-based; `now` is part of the policy contract
        eligible = [
            i
            for i, load in enumerate(loads)
            if load.ready and (request.revision is None or load.revision == request.revision)
        ]
        if not eligible:
            return None
        if self.kind == "round_robin":
            n = len(loads)
            for step in range(n):
                i = (self._turn + step) % n
                if i in eligible:
                    self._turn = i + 1
                    return i
        if self.kind == "least_outstanding_tokens":
            return min(eligible, key=lambda i: (loads[i].outstanding_tokens, i))
        if self.kind == "kv_aware":
            return min(
                eligible,
                key=lambda i: (
                    -(loads[i].free_kv_blocks - request.projected_kv_blocks),
                    loads[i].waiting_requests,
                    i,
                ),
            )
        least = min(eligible, key=lambda i: (loads[i].outstanding_requests, i))
        if self.kind == "prefix_affinity" and request.prefix_group is not None:
            home = self._affinity.get(request.prefix_group)
            if (
                home is not None
                and home in eligible
                and loads[home].outstanding_requests
                <= loads[least].outstanding_requests + self.affinity_slack
            ):
                return home
            self._affinity[request.prefix_group] = least
        return least
