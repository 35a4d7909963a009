"""The event queue of the simulator: one explicit order, ``(time_s, priority, seq)``.

Events at the same time run in priority order, then in the order they were scheduled
(``seq`` comes from a per-queue counter, never a global one). The priorities, in one place:

* ``DISPATCH`` (0): a task arrives or a task's next step sends its calls. Arrivals at a
  time are seen by an engine step that starts at the same time.
* ``BOUNDARY`` (1): a replica's step (or run of decode steps) ends and the next starts.

Timeline samples rank after both at the same time; they change nothing and are not
queued: ``Simulator.run`` merges them in, as it does the arrivals.
"""

from __future__ import annotations

import heapq
from typing import Final

DISPATCH: Final = 0
BOUNDARY: Final = 1

Event = tuple[float, int, int, int, int, int]
"""``(time_s, priority, seq, kind, a, b)``: ``kind`` and the two integer arguments say what
happens (the simulator defines them); plain tuples keep the hot loop allocation-light."""


class EventQueue:
    """A heap of events ordered by ``(time_s, priority, seq)``."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    def push(self, time_s: float, priority: int, kind: int, a: int = 0, b: int = 0) -> None:
        """Schedule an event."""
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._heap, (time_s, priority, seq, kind, a, b))

    def pop(self) -> Event:
        """Remove and return the earliest event."""
        return heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._heap)
