"""A request inside one replica, and the waiting queues that order requests.

:class:`EngineRequest` is the engine-side entity (vLLM ``vllm/v1/request.py``); the
scheduler in :mod:`headway.core.engine.scheduler` is the only code that changes it, and
the underscore fields are shared with that module only. The queues follow vLLM's
``request_queue.py``: FCFS (arrival order, preempted requests back at the front) and
priority (``(priority, arrival_s, add order)``, lower priority value first).
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Final, TypeAlias

__all__ = [
    "TERMINAL_STATUSES",
    "DecodeClock",
    "EngineRequest",
    "FcfsRequestQueue",
    "PriorityRequestQueue",
    "RequestId",
    "RequestQueue",
    "RequestStatus",
    "create_request_queue",
]


RequestId: TypeAlias = str | int
"""A request's id, unique within a replica: any string, or an integer (the simulator uses
the call's row number, which saves converting ids back and forth on every step)."""


class RequestStatus(enum.Enum):
    """Where a request is inside one replica."""

    WAITING = "waiting"
    """In the waiting queue, never admitted."""
    RUNNING = "running"
    """In the running set: holds KV blocks and is scheduled every step it fits."""
    PREEMPTED = "preempted"
    """Back in the waiting queue after preemption; its KV was freed and is recomputed."""
    FINISHED = "finished"
    """Generated ``max_output_tokens`` tokens."""
    ABORTED = "aborted"
    """Cancelled by the caller; its blocks were freed at once."""


TERMINAL_STATUSES: Final = frozenset({RequestStatus.FINISHED, RequestStatus.ABORTED})
"""Statuses a request never leaves."""

_UNQUEUED: Final = 0


class EngineRequest:
    """One request inside a replica: an entity the scheduler mutates.

    The caller constructs it and hands it to ``add_request``; from then on every field is
    the engine's to change (read them, do not write them)::

        num_tokens = num_prompt_tokens + num_output_tokens
        0 <= num_computed_tokens <= num_tokens
        len(block_ids) == cdiv(num_computed_tokens, block_size)   between steps

    ``block_hashes`` are the chained hashes of the request's full blocks at the engine's
    block size (``kv.chain_block_hashes`` / ``kv.expand_block_hashes``); the caller may
    give those of a prefix of the prompt and the scheduler extends the list with
    request-unique hashes for the rest, as blocks fill (vLLM ``Request.block_hashes``).
    """

    __slots__ = (
        "_cached",
        "_clock",
        "_computed",
        "_num_eager_hashes",
        "_output",
        "_queue_token",
        "_salt",
        "_seq",
        "arrival_s",
        "block_hashes",
        "block_ids",
        "max_output_tokens",
        "num_cached_prompt_tokens",
        "num_external_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "priority",
        "request_id",
        "status",
    )

    def __init__(
        self,
        request_id: RequestId,
        *,
        num_prompt_tokens: int,
        max_output_tokens: int,
        priority: int = 0,
        block_hashes: Sequence[int] = (),
        num_external_computed_tokens: int = 0,
    ) -> None:
        """Describe a request.

        Args:
            request_id: unique within the replica (a string or an integer).
            num_prompt_tokens: prompt length, >= 1.
            max_output_tokens: tokens the request generates before it stops, >= 1 (the
                simulator passes the true output length: end-of-sequence is folded in).
            priority: lower is more important (vLLM); used by the ``priority`` policy.
            block_hashes: chained hashes of the first full prompt blocks, optional.
            num_external_computed_tokens: leading prompt tokens whose KV arrives from
                elsewhere (vLLM's KV connector, e.g. a prefill instance of a
                disaggregated cluster): at its first admission the scheduler allocates
                their blocks and counts them computed without computing them. In
                ``0..num_prompt_tokens - 1`` (the last prompt token is always computed,
                for its logits). A preempted request recomputes them (see
                ``docs/engine-model.md``).

        Raises:
            ValueError: if a length is not positive, or the external tokens are out of
                range.
        """
        if num_prompt_tokens < 1:
            raise ValueError(
                f"request {request_id!r}: num_prompt_tokens must be >= 1 "
                f"(got {num_prompt_tokens}); an empty prompt has nothing to condition on"
            )
        if max_output_tokens < 1:
            raise ValueError(
                f"request {request_id!r}: max_output_tokens must be >= 1 "
                f"(got {max_output_tokens}); a request generates at least one token"
            )
        if not 0 <= num_external_computed_tokens < num_prompt_tokens:
            raise ValueError(
                f"request {request_id!r}: num_external_computed_tokens must be in "
                f"0..{num_prompt_tokens - 1} (got {num_external_computed_tokens}); at least "
                "the last prompt token is computed locally, for its logits"
            )
        self.request_id: Final = request_id
        self.num_prompt_tokens: Final = num_prompt_tokens
        self.max_output_tokens: Final = max_output_tokens
        self.priority: Final = priority
        self.num_external_computed_tokens: Final = num_external_computed_tokens
        self.block_hashes: list[int] = list(block_hashes)
        self.arrival_s = float("nan")
        """Time the replica received the request (set by ``add_request``)."""
        self.status = RequestStatus.WAITING
        self._clock: DecodeClock | None = None
        """The scheduler's clock while the request decodes lazily (see :class:`DecodeClock`):
        then ``_computed`` and ``_output`` are offsets from its counters."""
        self._computed = 0
        self._output = 0
        self.num_preemptions = 0
        self.num_cached_prompt_tokens = -1
        """Tokens found in the prefix cache at first admission (-1 before it)."""
        self.block_ids: list[int] = []
        self._cached = 0
        self._num_eager_hashes = len(self.block_hashes)
        """Blocks whose hashes are registered as soon as they fill: the caller's (shareable)
        ones, and request-unique ones that a preemption registered (so that the request
        can find them again). Other request-unique blocks are registered only if the
        request is preempted: nobody else could ever hit them."""
        self._queue_token = _UNQUEUED
        self._seq = -1
        self._salt = 0

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache."""
        clock = self._clock
        return self._computed if clock is None else self._computed + clock.computed

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        if self._clock is not None:
            raise RuntimeError(f"{self!r} decodes lazily: its counters follow the clock")
        self._computed = value

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        clock = self._clock
        return self._output if clock is None else self._output + clock.output

    @num_output_tokens.setter
    def num_output_tokens(self, value: int) -> None:
        if self._clock is not None:
            raise RuntimeError(f"{self!r} decodes lazily: its counters follow the clock")
        self._output = value

    @property
    def _num_cached_blocks(self) -> int:
        """Leading blocks registered in the prefix cache (or counted as such: see
        ``_num_eager_hashes``). A lazily decoding request registers no hashes: its count
        follows its computed tokens' full blocks."""
        clock = self._clock
        if clock is None or not clock.caching:
            return self._cached
        full = (self._computed + clock.computed) // clock.block_size
        return full if full > self._cached else self._cached

    @_num_cached_blocks.setter
    def _num_cached_blocks(self, value: int) -> None:
        if self._clock is not None:
            raise RuntimeError(f"{self!r} decodes lazily: its counters follow the clock")
        self._cached = value

    @property
    def num_tokens(self) -> int:
        """Tokens known: prompt plus generated."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_remaining_output_tokens(self) -> int:
        """Tokens still to generate."""
        return self.max_output_tokens - self.num_output_tokens

    @property
    def is_decoding(self) -> bool:
        """True when the next step computes exactly its last generated token."""
        return self.num_output_tokens > 0 and self.num_computed_tokens == self.num_tokens - 1

    def __repr__(self) -> str:
        return (
            f"EngineRequest({self.request_id!r}, {self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens}, "
            f"output={self.num_output_tokens}/{self.max_output_tokens})"
        )


class DecodeClock:
    """Counters shared by the requests of one scheduler that decode lazily.

    While every running request decodes, each step adds one computed token and then one
    output token to every one of them: the scheduler counts those steps here instead of
    visiting each request. A request that decodes lazily (``_clock`` set) stores its
    counters as offsets from ``computed`` and ``output``; its properties add them back.
    """

    __slots__ = ("block_size", "caching", "computed", "output")

    def __init__(self, block_size: int, caching: bool) -> None:
        self.block_size: Final = block_size
        self.caching: Final = caching
        self.computed = 0
        """Computed tokens added to every lazily decoding request so far."""
        self.output = 0
        """Output tokens added to every lazily decoding request so far."""


# ----------------------------------------------------------------------------- queues


class RequestQueue:
    """The waiting queue as the scheduler uses it (FCFS or by priority, below).

    A base class rather than a protocol: compiled, a call through it is a native call.
    """

    __slots__ = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def push(self, req: EngineRequest) -> None:
        """Add a request at its place (FCFS: the back)."""
        raise NotImplementedError

    def push_front(self, req: EngineRequest) -> None:
        """Put a preempted or skipped request back (FCFS: the front)."""
        raise NotImplementedError

    def peek(self) -> EngineRequest | None:
        """The next request to admit, or ``None``."""
        raise NotImplementedError

    def pop(self) -> EngineRequest:
        """Remove and return the next request to admit."""
        raise NotImplementedError

    def discard(self, req: EngineRequest) -> None:
        """Remove a queued request (abort), in O(1)."""
        raise NotImplementedError

    def ordered(self) -> Iterator[EngineRequest]:
        """Queued requests in admission order."""
        raise NotImplementedError


class FcfsRequestQueue(RequestQueue):
    """Waiting requests in arrival order; preempted ones go back to the front.

    Removal (abort) is lazy: an entry is live while its token equals the request's
    ``_queue_token``, so ``discard`` is O(1) and stale entries are dropped at the head.
    """

    __slots__ = ("_entries", "_size", "_tokens")

    def __init__(self) -> None:
        self._entries: deque[tuple[int, EngineRequest]] = deque()
        self._tokens = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, req: EngineRequest) -> None:
        self._tokens = token = self._tokens + 1
        req._queue_token = token
        self._entries.append((token, req))
        self._size += 1

    def push_front(self, req: EngineRequest) -> None:
        self._tokens = token = self._tokens + 1
        req._queue_token = token
        self._entries.appendleft((token, req))
        self._size += 1

    def peek(self) -> EngineRequest | None:
        entries = self._entries
        while entries and entries[0][0] != entries[0][1]._queue_token:
            entries.popleft()
        return entries[0][1] if entries else None

    def pop(self) -> EngineRequest:
        req = self.peek()
        if req is None:
            raise RuntimeError("pop() from an empty waiting queue")
        self._entries.popleft()
        self.discard(req)
        return req

    def discard(self, req: EngineRequest) -> None:
        req._queue_token = _UNQUEUED
        self._size -= 1

    def ordered(self) -> Iterator[EngineRequest]:
        return (req for token, req in self._entries if token == req._queue_token)


class PriorityRequestQueue(RequestQueue):
    """Waiting requests by ``(priority, arrival_s, seq)``: a heap with lazy removal."""

    __slots__ = ("_heap", "_size", "_tokens")

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, int, EngineRequest]] = []
        self._tokens = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, req: EngineRequest) -> None:
        self._tokens = token = self._tokens + 1
        req._queue_token = token
        heapq.heappush(self._heap, (req.priority, req.arrival_s, req._seq, token, req))
        self._size += 1

    def push_front(self, req: EngineRequest) -> None:
        """A preempted request goes back to its place by key (vLLM), as :meth:`push`."""
        self.push(req)

    def peek(self) -> EngineRequest | None:
        heap = self._heap
        while heap and heap[0][3] != heap[0][4]._queue_token:
            heapq.heappop(heap)
        return heap[0][4] if heap else None

    def pop(self) -> EngineRequest:
        req = self.peek()
        if req is None:
            raise RuntimeError("pop() from an empty waiting queue")
        heapq.heappop(self._heap)
        self.discard(req)
        return req

    def discard(self, req: EngineRequest) -> None:
        req._queue_token = _UNQUEUED
        self._size -= 1

    def ordered(self) -> Iterator[EngineRequest]:
        live = sorted(entry for entry in self._heap if entry[3] == entry[4]._queue_token)
        return (entry[4] for entry in live)


def create_request_queue(policy: str) -> RequestQueue:
    """The waiting queue for a scheduling policy (``fcfs`` or ``priority``).

    Raises:
        ValueError: for any other policy.
    """
    if policy == "fcfs":
        return FcfsRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}; use 'fcfs' or 'priority'")
