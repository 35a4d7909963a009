"""A request's lifecycle, one table for every driver.

A request is *offered*; admission admits it (``DISPATCHED``: it holds a slot, an engine
serves it), queues it (``QUEUED``) or sheds it (``SHED``, terminal). From there it ends in
exactly one terminal state::

    OFFERED --admit--> DISPATCHED --finish--> COMPLETED
       |                  |  |  |---cancel--> CANCELLED   (its client went away)
       |                  |  |-----deadline-> TIMED_OUT   (its deadline passed in flight)
       |                  |--------fail-----> FAILED      (the engine or the run failed it)
       |--enqueue--> QUEUED --dispatch--> DISPATCHED      (a slot freed)
       |               |  ^---requeue--- DISPATCHED       (its engine failed before a byte)
       |               |--expire--> TIMED_OUT   --cancel--> CANCELLED   --fail--> FAILED
       |--shed--> SHED

:func:`advance` is the only way from one state to the next: a move the table does not
hold raises :class:`~headway.core.errors.InvalidTransition` naming the request, its
state and the event (a bug in a driver, never an overload outcome). :class:`Accounting`
is the one balance every driver fills (the simulator's records, the gateway's
``/metrics``, bench's records, the drills' clients), with one mapping from each driver's
own words (:data:`SIM_WORDS`, :data:`DRILL_WORDS`, :data:`BENCH_WORDS`,
:data:`GATEWAY_SHED_WORDS`)::

    offered  = admitted + shed
    admitted = completed + cancelled + timed_out + failed + in_flight

``in_flight`` is what is queued or dispatched when the balance is taken (0 once a run is
over). A queued request whose deadline passes is ``TIMED_OUT``: it was admitted to the
line and its deadline ended it, whatever the driver calls it (the live gateway answers it
503 ``expired`` with a Retry-After, the simulator records ``timed_out``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from headway.core.errors import InvalidTransition

__all__ = [
    "BENCH_WORDS",
    "DRILL_WORDS",
    "GATEWAY_SHED_WORDS",
    "SIM_WORDS",
    "TERMINAL",
    "TRANSITIONS",
    "Accounting",
    "Event",
    "State",
    "advance",
    "tally",
]


class State(enum.StrEnum):
    """Where a request is."""

    OFFERED = "offered"
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    COMPLETED = "completed"
    SHED = "shed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    FAILED = "failed"


class Event(enum.StrEnum):
    """What happens to a request."""

    ADMIT = "admit"
    ENQUEUE = "enqueue"
    SHED = "shed"
    DISPATCH = "dispatch"
    REQUEUE = "requeue"
    EXPIRE = "expire"
    FINISH = "finish"
    CANCEL = "cancel"
    DEADLINE = "deadline"
    FAIL = "fail"


S, E = State, Event
TRANSITIONS: Final[Mapping[tuple[State, Event], State]] = {
    (S.OFFERED, E.ADMIT): S.DISPATCHED,
    (S.OFFERED, E.ENQUEUE): S.QUEUED,
    (S.OFFERED, E.SHED): S.SHED,
    (S.QUEUED, E.DISPATCH): S.DISPATCHED,
    (S.QUEUED, E.EXPIRE): S.TIMED_OUT,
    (S.QUEUED, E.CANCEL): S.CANCELLED,
    (S.QUEUED, E.FAIL): S.FAILED,
    (S.DISPATCHED, E.FINISH): S.COMPLETED,
    (S.DISPATCHED, E.CANCEL): S.CANCELLED,
    (S.DISPATCHED, E.DEADLINE): S.TIMED_OUT,
    (S.DISPATCHED, E.FAIL): S.FAILED,
    (S.DISPATCHED, E.REQUEUE): S.QUEUED,
}
"""Every move a request may make; anything else is :class:`InvalidTransition`."""
del S, E

TERMINAL: Final = frozenset(
    {State.COMPLETED, State.SHED, State.CANCELLED, State.TIMED_OUT, State.FAILED}
)
"""The states a request ends in: exactly one each."""


def advance(request: object, state: State, event: Event) -> State:
    """The state ``request`` moves to from ``state`` on ``event``; raises
    :class:`~headway.core.errors.InvalidTransition` naming all three when the table has
    no such move."""
    after = TRANSITIONS.get((state, event))
    if after is None:
        allowed = sorted(e.value for (s, e) in TRANSITIONS if s is state)
        raise InvalidTransition(
            f"request {request!r}: {event.value!r} is not a move from {state.value!r} "
            f"(from {state.value!r}: {', '.join(allowed) or 'none, it is terminal'})"
        )
    return after


class Accounting(msgspec.Struct, frozen=True, kw_only=True):
    """The one balance of a driver's requests (see the module docstring)."""

    offered: int
    admitted: int
    shed: int
    completed: int
    cancelled: int
    timed_out: int
    failed: int
    in_flight: int = 0
    """Queued or dispatched when the balance was taken (0 once a run is over)."""

    @property
    def balanced(self) -> bool:
        """``offered = admitted + shed`` and ``admitted = completed + cancelled +
        timed_out + failed + in_flight``."""
        ended = self.completed + self.cancelled + self.timed_out + self.failed
        return self.offered == self.admitted + self.shed and self.admitted == ended + self.in_flight


def tally(states: Iterable[State]) -> Accounting:
    """The balance of requests in these states (one per request, offered or later)."""
    counts = dict.fromkeys(State, 0)
    for state in states:
        counts[state] += 1
    in_flight = counts[State.QUEUED] + counts[State.DISPATCHED] + counts[State.OFFERED]
    admitted = sum(counts[s] for s in TERMINAL if s is not State.SHED) + in_flight
    return Accounting(
        offered=admitted + counts[State.SHED],
        admitted=admitted,
        shed=counts[State.SHED],
        completed=counts[State.COMPLETED],
        cancelled=counts[State.CANCELLED],
        timed_out=counts[State.TIMED_OUT],
        failed=counts[State.FAILED],
        in_flight=in_flight,
    )


SIM_WORDS: Final[Mapping[str, State | None]] = {
    "not_offered": None,  # a call of a task that failed before it: never offered
    "in_flight": State.DISPATCHED,
    "completed": State.COMPLETED,
    "shed": State.SHED,
    "cancelled": State.CANCELLED,
    "timed_out": State.TIMED_OUT,
    "failed": State.FAILED,
}
"""The simulator's ``OUTCOMES``."""

DRILL_WORDS: Final[Mapping[str, State | None]] = {
    "ok": State.COMPLETED,
    "shed": State.SHED,
    "timed_out": State.TIMED_OUT,
    "cut": State.FAILED,
    "client_error": None,  # refused as invalid before admission: never offered
    "server_error": State.FAILED,
    "conn_error": State.FAILED,
    "cancelled": State.CANCELLED,
    "hung": State.DISPATCHED,
}
"""The drills' client ``STATES``."""

BENCH_WORDS: Final[Mapping[str, State | None]] = {
    "ok": State.COMPLETED,
    "connect": State.FAILED,
    "timeout": State.TIMED_OUT,
    "status": State.FAILED,  # a non-2xx answer (bench has no gateway reason to read)
    "stream_error": State.FAILED,
    "protocol": State.FAILED,
    "abandoned": State.CANCELLED,
    "unsent": None,  # the run ended before its time came
}
"""bench's ``ERRORS`` codes."""

GATEWAY_SHED_WORDS: Final[Mapping[str, State]] = {"expired": State.TIMED_OUT}
"""Shed reasons of the live gateway that the lifecycle counts otherwise: a queued request
whose deadline passed (every other reason is ``SHED``)."""
