"""The batch scheduler of one engine replica, modelled on vLLM v1's ``Scheduler``.

There is no prefill phase and no decode phase. Each request knows ``num_tokens`` (its
prompt plus the tokens it has generated) and has ``num_computed_tokens`` of them in the KV
cache; every step assigns tokens to requests so that computed tokens catch up with known
tokens, under a token budget (``max_num_batched_tokens``) and a sequence limit
(``max_num_seqs``). That one rule covers chunked prefill, mixed prefill/decode batches,
prefix caching and recompute after preemption (``docs/engine-model.md`` has the details,
the vLLM release followed, and what is simplified)::

    one request's tokens (prompt P, generated G, block_size 4 in the drawing)
    | p p p p | p p p p | p p g g | g       <- num_tokens = P + G = 13
    |<----- computed ----->|                <- num_computed_tokens = 10
                           |< new >|        <- tokens this step may compute: 3
    | blk 0   | blk 1   | blk 2   | blk 3   <- blocks held: cdiv(computed + new, 4)

A step, as the driver sees it (the :class:`~headway.core.engine.replica.ReplicaModel`
does this)::

    plan = scheduler.schedule()              # allocate blocks, preempt, admit
    ... the engine computes plan.num_scheduled_tokens (duration from plan.batch) ...
    outputs = scheduler.update_after_step(plan)   # sample tokens, finish requests

``schedule()`` follows vLLM: (1) RUNNING requests in running order, each given
``min(num_tokens - num_computed, long_prefill_token_threshold, budget)`` tokens; if its
blocks do not fit, the lowest-priority newest running request is preempted (FCFS: the
last of the running list; priority: the largest ``(priority, arrival)``) and its blocks
freed, until the allocation fits or the request preempted itself. (2) Only if nobody was
preempted: WAITING requests in queue order while the budget lasts and fewer than
``max_num_seqs`` run; each takes its prefix-cache hits, then enters only if its blocks
fit; the first one that does not fit stops admission (head-of-line, no preemption).
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from headway.core.engine.config import SchedulerConfig
from headway.core.engine.kv import BlockPool, unique_block_hash
from headway.core.engine.request import (
    TERMINAL_STATUSES,
    DecodeClock,
    EngineRequest,
    RequestId,
    RequestStatus,
    create_request_queue,
)
from headway.core.engine.steptime import BatchShape, prefill_pairs
from headway.core.errors import ConfigError

__all__ = [
    "TERMINAL_STATUSES",
    "BlockSteps",
    "DecodeStepsOutcome",
    "EngineRequest",
    "RequestId",
    "RequestStatus",
    "SchedulePlan",
    "Scheduler",
    "SchedulerConfig",
    "StepOutputs",
]


# ----------------------------------------------------------------------------- values

BlockSteps: TypeAlias = tuple[tuple[int, tuple[RequestId, ...]], ...]
"""The KV blocks a run of ``n`` identical decode steps gave, as ``(k, ids)`` pairs (``k``
rising from 1 to at most ``block_size``): each request of ``ids`` took one block at the
start of step ``k`` and of every ``block_size``-th step after it up to ``n`` (a decoding
request takes a block when its next computed token starts one)."""


@dataclass(slots=True, init=False, unsafe_hash=True)  # a value: see BatchShape
class SchedulePlan:
    """What one step computes: the output of :meth:`Scheduler.schedule`.

    Essentially ``{request_id: num_tokens}`` (vLLM ``SchedulerOutput``), running requests
    first, then those admitted this step, plus the batch sums the step-time model needs.
    """

    num_scheduled_tokens: Mapping[RequestId, int]
    """Tokens each scheduled request computes this step (>= 1 each)."""

    preempted_ids: tuple[RequestId, ...]
    """Requests preempted while building this step (their KV is freed, recompute later)."""

    admitted_ids: tuple[RequestId, ...]
    """Requests that left the waiting queue this step (new or resumed after preemption)."""

    batch: BatchShape
    """Sums over the batch that determine the step's duration."""

    admitted_cached_tokens: tuple[int, ...] = field(compare=False, hash=False, repr=False)
    """Per request of ``admitted_ids``: its prompt tokens found in the prefix cache at its
    first admission (read here: a request admitted and finished in one step is gone by
    the time the caller could ask the scheduler; empty for a plan built elsewhere)."""

    requests: tuple[EngineRequest, ...] = field(compare=False, hash=False, repr=False)
    """The scheduled requests themselves, in the order of ``num_scheduled_tokens``, so
    that :meth:`Scheduler.update_after_step` need not look them up by id (empty for a
    plan built elsewhere: then it does)."""

    allocated: Mapping[RequestId, int] = field(hash=False, repr=False)
    """The requests given KV blocks in this step (a prefill chunk, the prefix hits and
    external tokens of an admission, a decode token that starts a block), each with the
    blocks it holds now: ``cdiv(num_computed_tokens, block_size)`` (empty for a plan built
    elsewhere). With :attr:`preempted_ids` (blocks all freed), what a record of each
    request's blocks over time needs, step by step."""

    def __init__(
        self,
        *,
        num_scheduled_tokens: Mapping[RequestId, int],
        preempted_ids: tuple[RequestId, ...],
        admitted_ids: tuple[RequestId, ...],
        batch: BatchShape,
        requests: tuple[EngineRequest, ...] = (),
        admitted_cached_tokens: tuple[int, ...] = (),
        allocated: Mapping[RequestId, int] | None = None,
    ) -> None:
        self.num_scheduled_tokens = num_scheduled_tokens
        self.preempted_ids = preempted_ids
        self.admitted_ids = admitted_ids
        self.batch = batch
        self.requests = requests
        self.admitted_cached_tokens = admitted_cached_tokens
        self.allocated = {} if allocated is None else allocated

    @property
    def total_num_scheduled_tokens(self) -> int:
        """Tokens computed this step: never more than ``max_num_batched_tokens``."""
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        """True when the step computes nothing."""
        return not self.num_scheduled_tokens


@dataclass(slots=True, init=False, unsafe_hash=True)  # a value: see BatchShape
class StepOutputs:
    """What one step produced: the output of :meth:`Scheduler.update_after_step`."""

    tokens: Mapping[RequestId, int]
    """Tokens emitted per request (1 for a decode or a completed prefill; absent for a
    prefill chunk that did not reach the end of the known tokens)."""

    finished_ids: tuple[RequestId, ...]
    """Requests that generated their last token this step (their blocks are freed)."""

    def __init__(
        self, *, tokens: Mapping[RequestId, int], finished_ids: tuple[RequestId, ...]
    ) -> None:
        self.tokens = tokens
        self.finished_ids = finished_ids


@dataclass(slots=True, init=False, unsafe_hash=True)  # a value: see BatchShape
class DecodeStepsOutcome:
    """The effect of :meth:`Scheduler.apply_decode_steps`: ``num_steps`` identical
    decode-only steps in which every running request emitted one token per step."""

    num_steps: int
    """Steps applied."""

    request_ids: tuple[RequestId, ...]
    """The requests that decoded, in running order (each emitted ``num_steps`` tokens)."""

    kv_tokens_first_step: int
    """KV tokens read by the first step; each later step reads ``num_seqs`` more."""

    finished_ids: tuple[RequestId, ...]
    """Requests that emitted their last token in the last step."""

    block_steps: BlockSteps
    """The requests given KV blocks in the run: see :data:`BlockSteps`."""

    def __init__(
        self,
        *,
        num_steps: int,
        request_ids: tuple[RequestId, ...],
        kv_tokens_first_step: int,
        finished_ids: tuple[RequestId, ...],
        block_steps: BlockSteps = (),
    ) -> None:
        self.num_steps = num_steps
        self.request_ids = request_ids
        self.kv_tokens_first_step = kv_tokens_first_step
        self.finished_ids = finished_ids
        self.block_steps = block_steps

    @property
    def num_seqs(self) -> int:
        """Requests in each step's batch."""
        return len(self.request_ids)


class _StepBuilder:
    """Mutable state of one ``schedule()`` call.

    The first ``num_decoded`` running requests are those that
    :meth:`Scheduler._schedule_decoding` already gave their one decode token (the whole
    running set before admission; their computed tokens already advanced, their KV tokens
    summed in ``decode_kv``; ``lazy`` when they decode lazily); ``scheduled`` are the
    others, advanced by ``_build_plan``.
    """

    __slots__ = (
        "admitted",
        "allocated",
        "budget",
        "decode_kv",
        "lazy",
        "num_decoded",
        "preempted",
        "scheduled",
    )

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.num_decoded = 0
        self.decode_kv = 0
        self.lazy = False
        self.scheduled: dict[EngineRequest, int] = {}
        self.preempted: list[EngineRequest] = []
        self.admitted: list[EngineRequest] = []
        self.allocated: dict[RequestId, int] = {}


_MIN_LAZY: Final = 8
"""Running requests from which decoding starts lazily (see :meth:`Scheduler._attach`); once
it has started, requests join whatever their number."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -------------------------------------------------------------------------- scheduler


class Scheduler:
    """The running set, the waiting queue and the KV block pool of one replica.

    Contract (vLLM ``SchedulerInterface``): :meth:`add_request` enqueues;
    :meth:`schedule` decides one step and applies its bookkeeping (blocks allocated,
    preemptions, admissions, ``num_computed_tokens`` advanced); the caller then runs the
    step and calls :meth:`update_after_step` with the same plan, which samples one token
    for every request whose computed tokens caught up with its known tokens and finishes
    those that reached ``max_output_tokens``. :meth:`abort` may be called between steps.
    :meth:`check_invariants` holds between steps.
    """

    def __init__(self, config: SchedulerConfig, num_blocks: int) -> None:
        """Create an empty scheduler over a pool of ``num_blocks`` blocks.

        Raises:
            ValueError: if ``num_blocks`` is not positive.
        """
        self.config: Final = config
        self.pool: Final = BlockPool(
            num_blocks, config.block_size, enable_caching=config.enable_prefix_caching
        )
        self._requests: dict[RequestId, EngineRequest] = {}
        self._running: list[EngineRequest] = []
        self._running_ids: dict[RequestId, int] = {}
        """The ids of ``_running``, in the same order, each mapped to 1 (kept in step with
        it): a step in which every running request decodes schedules one token each, and
        its plan's map is a copy of this one (cheaper than building it)."""
        self._waiting = create_request_queue(config.policy)
        self._seq = itertools.count()
        self._watermark_blocks = int(config.watermark * num_blocks)
        self._block_size = config.block_size
        self._caching = config.enable_prefix_caching
        # The settings the steps read, as plain attributes (compiled, reading a field of
        # the config struct is a dictionary lookup; these are native).
        self._max_tokens = config.max_num_batched_tokens
        self._max_seqs = config.max_num_seqs
        self._chunked = config.enable_chunked_prefill
        self._long_prefill = config.long_prefill_token_threshold
        self._reserve_full = config.reserve_full_isl
        self._fcfs = config.policy == "fcfs"
        self._run_cache: tuple[int, int] | None = None
        """``(decode_run_limit(), KV tokens of the running set)`` while the state they
        were computed from lasts: every method that changes requests, queues or blocks
        resets it to ``None`` (``check_invariants`` recomputes and compares)."""
        self._sums_cache: tuple[int, int] | None = None
        """What :meth:`_decoding_sums` returns, while the running set and its tokens stay
        as they are: set by the steps that already visit every running request
        (:meth:`update_after_step`, :meth:`apply_decode_steps`), reset to ``None`` by
        anything else that changes the running set (``check_invariants`` compares)."""
        self._clock = DecodeClock(config.block_size, config.enable_prefix_caching)
        """Counts the steps of lazily decoding requests (see :meth:`_attach`)."""
        self._num_lazy = 0
        """The first ``_num_lazy`` running requests decode lazily; the others do not."""
        self._min_lazy = _MIN_LAZY
        """Running requests from which decoding starts lazily (tests lower it)."""
        self.lazy_decoding = True
        """False: every decoding request is visited each step, never lazily (the
        reference that tests compare lazy decoding with). Set it before the first step."""
        self.decoding_pass = True
        """False: every step is scheduled by the general loop, never by the all-decoding
        pass (:meth:`_schedule_decoding`; the reference for tests)."""
        self._block_due: list[list[EngineRequest]] = [[] for _ in range(config.block_size)]
        """Lazily decoding requests by ``_computed % block_size``, each list in running
        order: those in ``_block_due[(-clock.computed) % block_size]`` need a new block
        for their next computed token."""
        self._finish_due: dict[int, list[EngineRequest]] = {}
        """Lazily decoding requests by the ``clock.output`` at which they emit their last
        token (``max_output_tokens - _output``), each list in running order."""
        self._finish_keys: list[int] = []
        """A heap over ``_finish_due``'s keys (keys no longer there are dropped lazily)."""
        self._allocated: dict[RequestId, int] = {}
        """The blocks given in the step :meth:`schedule` is building (its plan's
        ``allocated``), where :meth:`_allocate_running` adds to them."""
        self._pending: tuple[SchedulePlan, int, int] | None = None
        """``(plan, requests decoded, their KV tokens)`` of the last
        :meth:`schedule` when it decoded every running request lazily: its
        :meth:`update_after_step` then counts their tokens on the clock."""
        self.num_preemptions = 0
        """Preemptions so far (a request preempted twice counts twice)."""
        self.num_finished = 0
        """Requests finished so far."""
        self.num_aborted = 0
        """Requests aborted so far."""
        self.num_prefix_queried_tokens = 0
        """Known tokens of requests at their first admission, summed (vLLM's
        ``vllm:prefix_cache_queries``: a preempted request's re-admission counts apart,
        ``PrefixCacheStats.record(preempted=True)``)."""
        self.num_prefix_hit_tokens = 0
        """Of those, tokens found in the prefix cache (``vllm:prefix_cache_hits``)."""
        self.num_preempted_queried_tokens = 0
        """Known tokens of preempted requests at their re-admission, summed."""
        self.num_preempted_hit_tokens = 0
        """Of those, tokens found in the prefix cache (their own blocks, not yet evicted)."""

    # ----------------------------------------------------------------- queries

    @property
    def running(self) -> Sequence[EngineRequest]:
        """The running set in running order (read-only view; oldest admission first)."""
        return tuple(self._running)

    @property
    def num_running(self) -> int:
        """Requests in the running set."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue, preempted ones included."""
        return len(self._waiting)

    @property
    def has_unfinished_requests(self) -> bool:
        """True while any request is running or waiting."""
        return bool(self._requests)

    def waiting(self) -> Iterator[EngineRequest]:
        """Waiting requests in the order they would be admitted."""
        return self._waiting.ordered()

    def get_request(self, request_id: RequestId) -> EngineRequest | None:
        """The live (running or waiting) request with this id, or ``None``."""
        return self._requests.get(request_id)

    # ----------------------------------------------------------------- requests

    def add_request(self, req: EngineRequest, arrival_s: float) -> None:
        """Put a new request at the back of the waiting queue (its place by key under
        the priority policy).

        Raises:
            ValueError: if the id is in use, the request was added before, its block
                hashes describe more blocks than its prompt has, or it could never run
                (its prompt and output need more blocks than the pool has, or, without
                chunked prefill, more tokens than one step's budget).
        """
        rid = req.request_id
        self._run_cache = None
        if not math.isfinite(arrival_s):
            raise ValueError(f"request {rid!r}: arrival_s must be finite (got {arrival_s})")
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already in this replica; use unique ids")
        if req._seq >= 0 or req.status is not RequestStatus.WAITING:
            raise ValueError(f"request {rid!r} was already added to a replica; make a new one")
        bs = self._block_size
        if len(req.block_hashes) > req.num_prompt_tokens // bs:
            raise ValueError(
                f"request {rid!r} carries {len(req.block_hashes)} block hashes but its "
                f"{req.num_prompt_tokens}-token prompt has {req.num_prompt_tokens // bs} full "
                f"blocks of {bs} tokens; give hashes at the engine's block size "
                "(kv.expand_block_hashes)"
            )
        max_slots = req.num_prompt_tokens + req.max_output_tokens - 1
        if _cdiv(max_slots, bs) > self.pool.num_blocks:
            # A cluster that cannot hold the workload's requests: the user's to fix.
            raise ConfigError(
                f"request {rid!r} needs {_cdiv(max_slots, bs)} KV blocks for its "
                f"{max_slots} tokens but the replica has {self.pool.num_blocks}; give the "
                "replica more KV memory (the cluster's num_kv_blocks, gpu_memory_utilization "
                "or tensor_parallel) or shorten the workload's requests (vLLM would not start "
                "with a pool that cannot hold max_model_len)",
                path="num_kv_blocks",
            )
        if not self._chunked and max_slots > (self._max_tokens):
            raise ValueError(
                f"request {rid!r} may need to recompute {max_slots} tokens in one step but "
                f"max_num_batched_tokens is {self._max_tokens} and chunked "
                "prefill is off; enable chunked prefill or raise the budget"
            )
        req.arrival_s = arrival_s
        req._seq = next(self._seq)
        # Request-unique block hashes are salted by the add order, not by the id, so that
        # a reused id never shares blocks with its namesake.
        req._salt = req._seq
        self._requests[rid] = req
        self._waiting.push(req)

    def abort(self, request_id: RequestId) -> bool:
        """Cancel a live request and free its blocks now; False if it is not live."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return False
        self._run_cache = None
        self._pending = None
        if req.status is RequestStatus.RUNNING:
            self._sums_cache = None
            index = self._running.index(req)
            del self._running[index], self._running_ids[request_id]
            if req._clock is not None:
                self._detach(req)
            self._release(req)
        else:
            self._waiting.discard(req)
        req.status = RequestStatus.ABORTED
        self.num_aborted += 1
        return True

    # ----------------------------------------------------------------- one step

    def schedule(self) -> SchedulePlan:
        """Decide the next step and apply its bookkeeping (see the module docstring)."""
        step = _StepBuilder(self._max_tokens)
        self._allocated = step.allocated
        self._pending = None
        if not (self.decoding_pass and self._schedule_decoding(step)):
            self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        plan = self._build_plan(step)
        if step.lazy:
            self._pending = (plan, step.num_decoded, step.decode_kv)
        return plan

    def _schedule_decoding(self, step: _StepBuilder) -> bool:
        """:meth:`_schedule_running` for a running set that only decodes, when its blocks
        fit: every request gets its one token, block for block as the general loop would
        give them (the same closed form as :meth:`apply_decode_steps` for one step).

        Returns False, having changed nothing but resetting the caches, when some running
        request is not decoding or the step's new blocks do not fit (someone would be
        preempted); the general loop then schedules the running set. The requests decode
        lazily when they can (``step.lazy``: the step is one tick of the clock, and only
        those that need a block are visited); otherwise each is visited.
        """
        kv_tokens = self._decoding_sums()[1]
        self._run_cache = self._sums_cache = None
        if kv_tokens < 0:
            return False
        running = self._running
        pool = self.pool
        if len(running) > pool.num_free and self._blocks_for_steps(1) > pool.num_free:
            return False
        step.decode_kv = kv_tokens
        step.budget -= len(running)
        if self._attach():
            clock = self._clock
            due = self._block_due[-clock.computed % self._block_size]
            clock.computed += 1
            if due:
                allocated = step.allocated
                for r, block in zip(due, pool.take(len(due)), strict=True):
                    blocks = r.block_ids
                    blocks.append(block)
                    allocated[r.request_id] = len(blocks)
            step.num_decoded = len(running)
            step.lazy = True
            return True
        bs = self._block_size
        caching = self._caching
        needs_block: list[EngineRequest] = []
        to_cache: list[EngineRequest] = []
        for r in running:  # none decodes lazily: their own counters, read directly
            computed = r._computed
            if computed % bs == 0:
                needs_block.append(r)
            computed += 1
            r._computed = computed
            if caching and computed // bs > r._cached:
                if r._cached < r._num_eager_hashes:
                    to_cache.append(r)  # registers a hash: once its block is taken
                else:
                    r._cached = computed // bs
        if needs_block:
            allocated = step.allocated
            for r, block in zip(needs_block, pool.take(len(needs_block)), strict=True):
                blocks = r.block_ids
                blocks.append(block)
                allocated[r.request_id] = len(blocks)
        for r in to_cache:
            self._cache_full_blocks(r, r.num_computed_tokens)
        step.num_decoded = len(running)
        return True

    def _schedule_running(self, step: _StepBuilder) -> None:
        """Give each running request its next tokens; preempt when blocks run out."""
        self._detach_all()
        running = self._running
        threshold = self._long_prefill
        i = 0
        while i < len(running) and step.budget > 0:
            req = running[i]  # not lazy (detached above): its counters, read directly
            num_new = req.num_prompt_tokens + req._output - req._computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > step.budget:
                num_new = step.budget
            while not self._allocate_running(req, num_new):
                victim_index = self._victim_index()
                victim = running.pop(victim_index)
                del self._running_ids[victim.request_id]
                if victim in step.scheduled:  # priority policy only: undo its tokens
                    step.budget += step.scheduled.pop(victim)
                    step.allocated.pop(victim.request_id, None)
                if victim_index < i:
                    i -= 1
                self._preempt(victim)
                step.preempted.append(victim)
                if victim is req:
                    return  # nothing left to preempt: stop scheduling running requests
            step.scheduled[req] = num_new
            step.budget -= num_new
            i += 1

    def _victim_index(self) -> int:
        """Index in the running list of the request to preempt.

        FCFS: the last one (the newest admission). Priority: the largest
        ``(priority, arrival_s, seq)``, i.e. the least important, newest request.
        """
        running = self._running
        if self._fcfs:
            return len(running) - 1
        keys = [(r.priority, r.arrival_s, r._seq) for r in running]
        return keys.index(max(keys))

    def _preempt(self, req: EngineRequest) -> None:
        """Free a running request's KV (recompute later) and put it back in the queue."""
        self._register_unique_blocks(req)
        self._release(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.push_front(req)

    def _schedule_waiting(self, step: _StepBuilder) -> None:
        """Admit waiting requests, in queue order, while their blocks fit."""
        if not self._waiting:
            return
        bs = self._block_size
        max_seqs = self._max_seqs
        waiting = self._waiting
        skipped: list[EngineRequest] = []
        while step.budget > 0 and len(self._running) < max_seqs:
            req = waiting.peek()
            if req is None:
                break
            hits = self._prefix_hits(req)
            num_computed = self._admission_computed(req, hits)
            num_new = self._first_chunk(req, num_computed, step.budget)
            if num_new == 0:  # chunked prefill off and the rest does not fit the budget
                skipped.append(waiting.pop())
                continue
            watermark = self._watermark_blocks if self._running else 0
            if not self._allocate_slots(
                req, num_new, hits, watermark, from_waiting=True, num_computed=num_computed
            ):
                break
            waiting.pop()
            self._running.append(req)
            self._running_ids[req.request_id] = 1
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_computed
            if req.num_cached_prompt_tokens < 0:
                req.num_cached_prompt_tokens = len(hits) * bs
            if req.num_preemptions:
                self.num_preempted_queried_tokens += req.num_tokens
                self.num_preempted_hit_tokens += len(hits) * bs
            else:
                self.num_prefix_queried_tokens += req.num_tokens
                self.num_prefix_hit_tokens += len(hits) * bs
            step.allocated[req.request_id] = len(req.block_ids)
            step.scheduled[req] = num_new
            step.admitted.append(req)
            step.budget -= num_new
        for req in reversed(skipped):  # back at the head, in their original order
            waiting.push_front(req)

    def _admission_computed(self, req: EngineRequest, hits: list[int]) -> int:
        """Tokens a waiting request counts as computed once admitted: its prefix-cache
        hits, or, at its first admission only, its external tokens when they are more
        (vLLM: local hits, then what the KV connector supplies beyond them). A preempted
        request recomputes its external tokens: their KV was freed with its blocks."""
        num_computed = len(hits) * self._block_size
        external = req.num_external_computed_tokens
        if external > num_computed and req.num_cached_prompt_tokens < 0:
            return external
        return num_computed

    def _first_chunk(self, req: EngineRequest, num_computed: int, budget: int) -> int:
        """Tokens a waiting request would compute if admitted now; 0 if it must be skipped."""
        num_new = req.num_tokens - num_computed
        threshold = self._long_prefill
        if 0 < threshold < num_new:
            num_new = threshold
        if not self._chunked and num_new > budget:
            return 0
        return min(num_new, budget)

    def _build_plan(self, step: _StepBuilder) -> SchedulePlan:
        """Advance computed tokens and sum the batch for the step-time model."""
        prefill_tokens = pairs = prefill_seqs = 0
        decode_seqs, decode_kv = step.num_decoded, step.decode_kv
        # All running decode (the decoding pass): their ids are the running set's, the
        # admitted ones' after them, all 1 until the loop below sets the admitted ones.
        scheduled = self._running_ids.copy() if step.num_decoded else {}
        for req, num_new in step.scheduled.items():  # none of them decodes lazily
            prior = req._computed
            # req.is_decoding, inlined: this loop runs over the whole batch every step
            if (
                num_new == 1
                and req._output > 0
                and prior == req.num_prompt_tokens + req._output - 1
            ):
                decode_seqs += 1
                decode_kv += prior
            else:
                prefill_seqs += 1
                prefill_tokens += num_new
                pairs += prefill_pairs(num_new, prior)
            req._computed = prior + num_new
            scheduled[req.request_id] = num_new
        shared = self.shared_kv_tokens(decode_kv) if decode_seqs else 0
        total = prefill_tokens + decode_seqs
        if total > self._max_tokens or step.budget < 0:
            raise RuntimeError(
                f"scheduled {total} tokens with a budget of "
                f"{self._max_tokens} (left {step.budget}): a scheduler bug"
            )
        return SchedulePlan(
            num_scheduled_tokens=scheduled,
            preempted_ids=tuple([r.request_id for r in step.preempted]),
            admitted_ids=tuple([r.request_id for r in step.admitted]),
            batch=BatchShape(
                num_prefill_tokens=prefill_tokens,
                prefill_attention_pairs=pairs,
                num_prefill_seqs=prefill_seqs,
                num_decode_seqs=decode_seqs,
                decode_kv_tokens=decode_kv,
                decode_shared_kv_tokens=shared,
            ),
            # The decoding pass: the running set is the decoded requests, then the admitted.
            requests=tuple(self._running) if step.num_decoded else tuple(step.scheduled),
            admitted_cached_tokens=tuple([r.num_cached_prompt_tokens for r in step.admitted]),
            allocated=step.allocated,
        )

    def update_after_step(self, plan: SchedulePlan) -> StepOutputs:
        """Sample a token for each scheduled request whose computed tokens caught up with
        its known tokens (a decode, or the last chunk of a prefill: the first token), and
        finish those that reached ``max_output_tokens``, freeing their blocks.

        Requests aborted since :meth:`schedule` are skipped. Calling it twice with the
        same plan does nothing the second time.
        """
        self._run_cache = None
        pending = self._pending
        self._pending = None
        if pending is not None and pending[0] is plan:
            return self._update_lazily(plan, pending[1], pending[2])
        self._detach_all()
        tokens: dict[RequestId, int] = {}
        finished: list[EngineRequest] = []
        requests: Iterable[EngineRequest | None] = plan.requests
        if len(plan.requests) != len(plan.num_scheduled_tokens):  # a plan built elsewhere
            requests = [self._requests.get(rid) for rid in plan.num_scheduled_tokens]
        running = RequestStatus.RUNNING
        # Requests that emitted and go on now decode: if they are the whole running set,
        # their sums are _decoding_sums()' answer, gathered here on the way.
        num_decoding = kv_tokens = 0
        max_steps = -1
        for req in requests:  # none decodes lazily now: counters read directly
            if req is None or req.status is not running:
                continue  # aborted since schedule()
            output = req._output
            computed = req._computed
            if computed == req.num_prompt_tokens + output:
                req._output = output = output + 1
                tokens[req.request_id] = 1
                left = req.max_output_tokens - output
                if left <= 0:
                    finished.append(req)
                else:
                    num_decoding += 1
                    kv_tokens += computed
                    if left < max_steps or max_steps < 0:
                        max_steps = left
        return self._close_step(tokens, finished, num_decoding, kv_tokens, max_steps)

    def _update_lazily(self, plan: SchedulePlan, num_decoded: int, kv_before: int) -> StepOutputs:
        """:meth:`update_after_step` for a plan whose running requests decoded lazily
        (the first ``num_decoded`` of ``plan.requests``, ``kv_before`` KV tokens
        before the step; none aborted since): one tick of the clock gives each its token,
        and those that reach ``max_output_tokens`` are found by their finishing tick. The
        others (admitted this step) as in the general loop."""
        clock = self._clock
        clock.output += 1
        requests = plan.requests
        if len(requests) == num_decoded:  # they are the whole step: 1 token each, as planned
            tokens: Mapping[RequestId, int] = plan.num_scheduled_tokens
        else:  # the plan's map, cloned (cheaper than building it), then the others settled
            tokens = emitted = dict(plan.num_scheduled_tokens)
        num_decoding = num_decoded
        kv_tokens = kv_before + num_decoded
        finished = self._finish_due.pop(clock.output, None) or []
        for req in finished:
            num_decoding -= 1
            kv_tokens -= req.num_computed_tokens
        max_steps = self._fewest_lazy_left()
        running = RequestStatus.RUNNING
        for i in range(num_decoded, len(requests)):
            req = requests[i]
            if req.status is not running:
                del emitted[req.request_id]  # aborted since schedule(): no token
                continue
            output = req.num_output_tokens
            computed = req.num_computed_tokens
            if computed != req.num_prompt_tokens + output:
                del emitted[req.request_id]  # a prefill chunk short of the prompt's end
            else:
                req.num_output_tokens = output = output + 1
                emitted[req.request_id] = 1
                left = req.max_output_tokens - output
                if left <= 0:
                    finished.append(req)
                else:
                    num_decoding += 1
                    kv_tokens += computed
                    if left < max_steps or max_steps < 0:
                        max_steps = left
        return self._close_step(tokens, finished, num_decoding, kv_tokens, max_steps)

    def _close_step(
        self,
        tokens: Mapping[RequestId, int],
        finished: list[EngineRequest],
        num_decoding: int,
        kv_tokens: int,
        max_steps: int,
    ) -> StepOutputs:
        """End a step's update (eager or lazy): finish those done, and when the requests
        that go on decoding are the whole running set, cache their sums (gathered on the
        way) for the next :meth:`_decoding_sums`."""
        if finished:
            self._finish(finished)
        self._sums_cache = None
        if num_decoding == len(self._running):
            self._sums_cache = self._checked_sums(max_steps, kv_tokens)
        return StepOutputs(tokens=tokens, finished_ids=tuple([r.request_id for r in finished]))

    def _finish(self, finished: list[EngineRequest]) -> None:
        """Take finished requests out of the running set and free their blocks. Those that
        decode lazily leave lazy decoding (their list in ``_finish_due`` was taken out
        already: they finish together), their counters back from offsets."""
        running, running_ids = self._running, self._running_ids
        clock, due, bs = self._clock, self._block_due, self._block_size
        for req in finished:
            index = running.index(req)
            del running[index], running_ids[req.request_id]
            if req._clock is not None:
                due[req._computed % bs].remove(req)
                self._num_lazy -= 1
                req._computed += clock.computed
                req._output += clock.output
                req._clock = None  # its cached-block count is reset by the release
        pool, requests, status = self.pool, self._requests, RequestStatus.FINISHED
        for req in finished:
            pool.free(req.block_ids[::-1], distinct=True)  # _release, inlined
            req.block_ids = []
            req._cached = 0
            req.status = status
            del requests[req.request_id]
        self.num_finished += len(finished)

    # ----------------------------------------------------------------- KV blocks

    def _prefix_hits(self, req: EngineRequest) -> list[int]:
        """Cached blocks for the request's prefix, at most ``num_tokens - 1`` tokens' worth
        (the last token is always recomputed to get its logits, as in vLLM)."""
        if not self._caching or not req.block_hashes:
            return []
        max_blocks = (req.num_tokens - 1) // self._block_size
        return self.pool.find_cached_prefix(req.block_hashes, max_blocks)

    def _blocks_to_allocate(self, req: EngineRequest, num_slots: int, hits: list[int]) -> int:
        """Free blocks it takes to give ``req`` KV slots for its first ``num_slots``
        tokens, reusing ``hits``: new blocks, plus hits that are free (reviving a free
        cached block takes it out of the free queue too, as in vLLM)::

            | < held blocks > | < hits > | < new blocks ...    |
            |<------------- cdiv(num_slots, block_size) ------>|
        """
        pool = self.pool
        num_new = _cdiv(num_slots, self._block_size) - len(req.block_ids) - len(hits)
        evictable = sum(1 for b in hits if pool.ref_count(b) == 0) if hits else 0
        return max(num_new, 0) + evictable

    def _admission_blocks(
        self,
        req: EngineRequest,
        num_new: int,
        hits: list[int],
        watermark: int,
        *,
        full: bool,
        num_computed: int = -1,
    ) -> int:
        """Free blocks required before ``req`` may get slots for ``num_new`` more tokens
        (``num_computed``: tokens it counts as computed at admission, default its hits)."""
        if num_computed < 0:
            num_computed = len(hits) * self._block_size
        num_slots = req.num_computed_tokens + num_computed + num_new
        required = self._blocks_to_allocate(req, num_slots, hits) + watermark
        if full and self._reserve_full:
            full_required = self._blocks_to_allocate(req, req.num_tokens, hits) + watermark
            required = max(required, full_required)
        return required

    def _allocate_slots(
        self,
        req: EngineRequest,
        num_new: int,
        hits: list[int] | None = None,
        watermark: int = 0,
        *,
        from_waiting: bool = False,
        num_computed: int = -1,
    ) -> bool:
        """Give ``req`` slots for ``num_new`` more tokens (vLLM ``allocate_slots``).

        Returns False and changes nothing if the blocks do not fit; otherwise takes the
        prefix hits, allocates new blocks (for external tokens too: ``num_computed``, the
        tokens counted computed at admission, default the hits' tokens) and caches every
        block that is now full::

            | < computed > | < hits > | < num_new > |
                           |<-- slots to allocate -->|
            | < cached: full blocks of known tokens >   |
        """
        if not hits and not watermark and not from_waiting:
            return self._allocate_running(req, num_new)
        pool = self.pool
        if not hits and not (from_waiting and self._reserve_full):
            # The same as below without hits: new blocks for the slots, plus the watermark.
            num_slots = req.num_computed_tokens + max(num_computed, 0) + num_new
            num_missing = -(-num_slots // self._block_size) - len(req.block_ids)
            if (num_missing if num_missing > 0 else 0) + watermark > pool.num_free:
                return False
            if num_missing > 0:
                req.block_ids += pool.take(num_missing)
            self._cache_full_blocks(req, min(num_slots, req.num_tokens))
            return True
        hits = hits or []
        bs = self._block_size
        if num_computed < 0:
            num_computed = len(hits) * bs
        required = self._admission_blocks(
            req, num_new, hits, watermark, full=from_waiting, num_computed=num_computed
        )
        if required > pool.num_free:
            return False
        if hits:
            pool.touch(hits)
            req.block_ids.extend(hits)
            req._num_cached_blocks = len(hits)
        num_slots = req.num_computed_tokens + num_computed + num_new
        num_missing = _cdiv(num_slots, bs) - len(req.block_ids)
        if num_missing > 0:
            req.block_ids += pool.take(num_missing)
        self._cache_full_blocks(req, min(num_slots, req.num_tokens))
        return True

    def _allocate_running(self, req: EngineRequest, num_new: int) -> bool:
        """:meth:`_allocate_slots` without prefix hits or watermark (a running request's
        next tokens), the same effect by a shorter path: runs for every request each step.
        Only for a request that does not decode lazily (its counters are read directly).
        """
        bs = self._block_size
        num_slots = req._computed + num_new
        blocks = req.block_ids
        num_missing = -(-num_slots // bs) - len(blocks)
        if num_missing > 0:
            if num_missing > self.pool.num_free:
                return False
            blocks += self.pool.take(num_missing)
            self._allocated[req.request_id] = len(blocks)
        if self._caching:
            num_known = req.num_prompt_tokens + req._output
            if num_known > num_slots:
                num_known = num_slots
            if num_known // bs > req._cached:
                self._cache_full_blocks(req, num_known)
        return True

    def _cache_full_blocks(self, req: EngineRequest, num_tokens: int) -> None:
        """Register the request's blocks that ``num_tokens`` known tokens fill."""
        if not self._caching:
            return
        num_full = num_tokens // self._block_size
        start = req._num_cached_blocks
        if num_full <= start:
            return
        hashes = req.block_hashes
        for i in range(start, min(num_full, req._num_eager_hashes)):
            self.pool.cache_block(req.block_ids[i], hashes[i])
        req._num_cached_blocks = num_full

    def _register_unique_blocks(self, req: EngineRequest) -> None:
        """Register the request-unique blocks that vLLM would have cached as they filled.

        Only the request itself could ever hit them, and only after a preemption, so they
        are registered here, just before a preemption frees them, instead of one by one
        on the hot path. The pool ends in the same state either way.
        """
        if not self._caching:
            return
        hashes = req.block_hashes
        for i in range(req._num_eager_hashes, req._num_cached_blocks):
            if i == len(hashes):
                hashes.append(unique_block_hash(req._salt, i))
            self.pool.cache_block(req.block_ids[i], hashes[i])
        req._num_eager_hashes = max(req._num_eager_hashes, req._num_cached_blocks)

    def _release(self, req: EngineRequest) -> None:
        """Free a request's blocks, last block first (its tail is evicted first)."""
        self.pool.free(req.block_ids[::-1], distinct=True)
        req.block_ids = []
        req._cached = 0  # not decoding lazily: its callers took it out first

    # ------------------------------------------------------- decode runs (closed form)

    def _blocks_for_steps(self, num_steps: int) -> int:
        """New blocks the running set needs for ``num_steps`` more decode steps."""
        bs = self._block_size
        total = 0
        for r in self._running:
            need = -(-(r.num_computed_tokens + num_steps) // bs) - len(r.block_ids)
            if need > 0:
                total += need
        return total

    def _max_steps_within(self, max_steps: int, max_blocks: int) -> int:
        """Largest ``n <= max_steps`` whose decode steps need at most ``max_blocks``.

        ``n`` steps cross at most ``cdiv(n, block_size)`` block boundaries per request
        (a running request holds ``cdiv(computed, block_size)`` blocks), so when that
        bound fits, the exact count is not needed.
        """
        bound = len(self._running) * -(-max_steps // self._block_size)
        if bound <= max_blocks or self._blocks_for_steps(max_steps) <= max_blocks:
            return max_steps  # the common case: the pool is far from full
        lo, hi = 0, max_steps
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._blocks_for_steps(mid) <= max_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def decode_run_limit(self) -> int:
        """How many next steps are certain to be identical decode-only steps.

        Such a step schedules every running request for exactly one token, admits
        nobody and preempts nobody. The run ends at the first of: a request's last token
        (that step is included: the request finishes in it), a step whose blocks would
        not fit (preemption), or a step in which the head of the waiting queue could be
        admitted. 0 when the next step is not such a step (a prefill is running, a
        waiting request fits now, ...). New arrivals are the caller's business.

        The answer is kept until the scheduler's state next changes (a driver asks
        several times about the same run).
        """
        return self._decode_run_state()[0]

    def shared_kv_tokens(self, kv_tokens: int) -> int:
        """Of ``kv_tokens`` read by the step's decoding requests, those in blocks another
        running request also holds, counted for every holder but the first
        (:attr:`BatchShape.decode_shared_kv_tokens`): the pool's extra references, whole
        blocks (only full blocks are shared), at most ``kv_tokens``. A prefilling request
        that shares a block with a decoding one counts too: its chunk reads the block in
        the same step."""
        if not self._caching:
            return 0
        return min(kv_tokens, self.pool.num_shared_refs * self._block_size)

    def decode_run_kv_tokens(self) -> int:
        """KV tokens the next decode-only step reads: the running set's computed tokens."""
        kv_tokens = self._decode_run_state()[1]
        if kv_tokens < 0:  # not all decoding: not summed
            kv_tokens = sum(r.num_computed_tokens for r in self._running)
        return kv_tokens

    def _decode_run_state(self) -> tuple[int, int]:
        """``(decode_run_limit, kv_tokens)``, from ``_run_cache`` or computed into it (from
        :meth:`_decoding_sums`); ``kv_tokens`` is -1 unless every request decodes."""
        cached = self._run_cache
        if cached is not None:
            return cached
        max_steps, kv_tokens = self._decoding_sums()
        state = (0, kv_tokens)
        if kv_tokens >= 0:
            steps = self._max_steps_within(max_steps, self.pool.num_free)
            if steps > 0:
                steps = self._limit_by_waiting(steps)
            state = (steps, kv_tokens)
        self._run_cache = state
        return state

    def _checked_sums(self, max_steps: int, kv_tokens: int) -> tuple[int, int]:
        """:meth:`_decoding_sums` for a running set known to be all decoding."""
        if not 0 < len(self._running) <= self._max_tokens:
            return (0, -1)
        return (max_steps, kv_tokens)

    def _decoding_sums(self) -> tuple[int, int]:
        """``(fewest output tokens left, KV tokens)`` over the running set when every
        running request is decoding (and a step can hold them all); ``(0, -1)`` if not.
        From ``_sums_cache`` when set, else one pass over the running set."""
        if self._sums_cache is not None:
            return self._sums_cache
        running = self._running
        if not 0 < len(running) <= self._max_tokens:
            return (0, -1)
        max_steps = running[0].max_output_tokens - running[0].num_output_tokens
        kv_tokens = 0
        for r in running:
            output = r.num_output_tokens
            computed = r.num_computed_tokens
            if output == 0 or computed != r.num_prompt_tokens + output - 1:  # is_decoding
                return (0, -1)
            kv_tokens += computed
            left = r.max_output_tokens - output
            if left < max_steps:
                max_steps = left
        return (max_steps, kv_tokens)

    def _limit_by_waiting(self, steps: int) -> int:
        """Shorten a decode run so that no waiting request could be admitted inside it.

        Admission of the candidate (the head, or the first one chunking does not skip)
        depends on free blocks, which only fall during the run, and on its prefix hits,
        which only change if an allocation evicts one of them: stop before that.
        """
        if not self._waiting:
            return steps
        budget_left = self._max_tokens - len(self._running)
        if len(self._running) >= self._max_seqs or budget_left <= 0:
            return steps
        candidates = self._waiting.ordered() if not self._chunked else [self._waiting.peek()]
        for req in candidates:
            if req is None:
                return steps
            hits = self._prefix_hits(req)
            num_computed = self._admission_computed(req, hits)
            num_new = self._first_chunk(req, num_computed, budget_left)
            if num_new == 0:
                continue
            evictable = {b for b in hits if self.pool.ref_count(b) == 0}
            if evictable:
                limit = self._blocks_for_steps(steps)
                position = self.pool.free_queue_position(evictable, limit)
                steps = self._max_steps_within(steps, position)
                if steps == 0:
                    return 0
            required = self._admission_blocks(
                req, num_new, hits, self._watermark_blocks, full=True, num_computed=num_computed
            )
            # Admitted after the first step's allocations? They are between 0 and one
            # block per running request: count them only when those bounds do not decide.
            free = self.pool.num_free
            if required > free:
                return steps
            if required <= free - len(self._running):
                return 0
            if required <= free - self._blocks_for_steps(1):
                return 0
            return steps
        return steps

    def apply_decode_steps(self, num_steps: int) -> DecodeStepsOutcome:
        """Apply ``num_steps`` identical decode-only steps at once.

        Equivalent to ``num_steps`` rounds of :meth:`schedule` and
        :meth:`update_after_step`, block for block: blocks are taken from the pool in the
        order the steps would take them (step by step, running order within a step) and
        cached as they fill, so the pool ends in the same state.

        Raises:
            ValueError: if ``num_steps`` is not in ``1..decode_run_limit()``.
        """
        limit, kv_first = self._decode_run_state()
        if not 1 <= num_steps <= limit:
            raise ValueError(
                f"num_steps must be in 1..{limit} (got {num_steps}); ask "
                "decode_run_limit() how many identical decode steps are safe"
            )
        self._run_cache = None
        self._pending = None
        if self._attach():
            return self._apply_lazily(num_steps, kv_first)
        bs = self._block_size
        caching = self._caching
        running = self._running
        # Step k computes position p = c + k - 1 of a request with c computed tokens: it
        # needs a new block when p % bs == 0, i.e. at k = offset + 1, offset + 1 + bs, ...
        # with offset = (-c) % bs. Blocks are taken in step order, running order within a
        # step, as stepping would take them: see _take_decode_blocks, which gets the
        # requests that need any, as (offset, running index). Blocks are then cached as
        # they fill. (Blocks filled by decoding hold request-unique content: unless a
        # preemption registered their hashes, _cache_full_blocks only counts them, done
        # inline here. No request decodes lazily: their own counters are read directly.)
        needs: list[tuple[int, int]] = []
        to_cache: list[EngineRequest] = []
        finished: list[EngineRequest] = []
        # The requests that go on still decode: their sums are _decoding_sums()' answer.
        kv_tokens = 0
        max_steps = -1
        for index, r in enumerate(running):
            computed = r._computed
            offset = (-computed) % bs
            if offset < num_steps:
                needs.append((offset, index))
            computed += num_steps
            r._computed = computed
            output = r._output + num_steps
            r._output = output
            if caching:
                num_full = computed // bs
                if num_full > r._cached:
                    if r._cached < r._num_eager_hashes:
                        to_cache.append(r)  # registers hashes: once its blocks are taken
                    else:
                        r._cached = num_full
            left = r.max_output_tokens - output
            if left <= 0:
                finished.append(r)
            else:
                kv_tokens += computed
                if left < max_steps or max_steps < 0:
                    max_steps = left
        block_steps: BlockSteps = ()
        if needs:
            block_steps = self._take_decode_blocks(needs, num_steps)
        for r in to_cache:
            self._cache_full_blocks(r, r.num_computed_tokens)
        request_ids = tuple(self._running_ids)
        if finished:
            self._finish(finished)
        self._sums_cache = self._checked_sums(max_steps, kv_tokens)
        return DecodeStepsOutcome(
            num_steps=num_steps,
            request_ids=request_ids,
            kv_tokens_first_step=kv_first,
            finished_ids=tuple([r.request_id for r in finished]),
            block_steps=block_steps,
        )

    def _apply_lazily(self, num_steps: int, kv_first: int) -> DecodeStepsOutcome:
        """:meth:`apply_decode_steps` for a running set that decodes lazily: ``num_steps``
        ticks of the clock, blocks given to the requests that cross block boundaries (in
        stepping order: by offset of their first boundary, running order within one),
        and the requests whose finishing tick is reached finished."""
        clock = self._clock
        bs = self._block_size
        computed = clock.computed
        num_full, rest = divmod(num_steps, bs)
        due = self._block_due
        order: list[EngineRequest] = []
        block_steps: list[tuple[int, tuple[RequestId, ...]]] = []
        num_last = 0
        for offset in range(min(num_steps, bs)):
            if offset == rest:
                num_last = len(order)
            bucket = due[(-computed - offset) % bs]
            if bucket:
                order += bucket
                block_steps.append((offset + 1, tuple([r.request_id for r in bucket])))
        if not num_full:
            num_last = len(order)
        if order:
            self._give_decode_blocks(order, num_full, num_last)
        clock.computed = computed + num_steps
        clock.output += num_steps
        request_ids = tuple(self._running_ids)
        kv_tokens = kv_first + num_steps * len(self._running)
        finished = self._finish_due.pop(clock.output, None) or []
        for r in finished:
            kv_tokens -= r.num_computed_tokens
        max_steps = self._fewest_lazy_left()
        if finished:
            self._finish(finished)
        self._sums_cache = self._checked_sums(max_steps, kv_tokens)
        return DecodeStepsOutcome(
            num_steps=num_steps,
            request_ids=request_ids,
            kv_tokens_first_step=kv_first,
            finished_ids=tuple([r.request_id for r in finished]),
            block_steps=tuple(block_steps),
        )

    def _take_decode_blocks(self, needs: list[tuple[int, int]], num_steps: int) -> BlockSteps:
        """Give the running requests of a decode run their new blocks, in stepping order.

        ``needs`` holds ``(offset, running index)`` of each request that needs a block
        in steps ``offset + 1``, ``offset + 1 + bs``, ... Sorted, it is the order of one
        full round of ``bs`` steps: every full round serves all of them, and the last,
        partial round those with ``offset < rest``, a prefix. Taken in that order, the
        blocks of the request at position ``q`` of the ``F``-long round are
        ``taken[q], taken[q + F], ...``: one slice per request. Returns them as
        :data:`BlockSteps` (a request's first block in step ``offset + 1``).
        """
        needs.sort()
        running = self._running
        order = [running[index] for _, index in needs]
        num_full, rest = divmod(num_steps, self._block_size)
        self._give_decode_blocks(order, num_full, bisect_left(needs, (rest, -1)))
        block_steps: list[tuple[int, tuple[RequestId, ...]]] = []
        first = needs[0][0]
        ids: list[RequestId] = []
        for offset, index in needs:
            if offset != first:
                block_steps.append((first + 1, tuple(ids)))
                first, ids = offset, []
            ids.append(running[index].request_id)
        block_steps.append((first + 1, tuple(ids)))
        return tuple(block_steps)

    def _give_decode_blocks(self, order: list[EngineRequest], num_full: int, num_last: int) -> None:
        """Blocks for ``num_full`` full rounds of ``order`` and the first ``num_last`` of
        it, taken in that order (see :meth:`_take_decode_blocks`)."""
        size = len(order)
        end = size * num_full
        taken = self.pool.take(end + num_last)
        if num_full:
            for q, r in enumerate(order):
                r.block_ids += taken[q:end:size]
        for q in range(num_last):
            order[q].block_ids.append(taken[end + q])

    # ------------------------------------------------------- lazy decoding

    def _attach(self) -> bool:
        """Make every running request decode lazily; call it only when all of them decode.

        A lazily decoding request keeps its counters as offsets from the clock (see
        :class:`~headway.core.engine.request.DecodeClock`), sits in ``_block_due`` and
        ``_finish_due``, and is visited only when it needs a block or finishes. Requests
        admitted since the last call (the tail of the running set) join here. False, with
        no request lazy any more, if one cannot join: it has hashes to register as its
        blocks fill (see ``_num_eager_hashes``); the caller then visits each request.
        Also False, with none lazy, while fewer than ``_min_lazy`` requests run and none
        is lazy yet: for so few, visiting each costs less.
        """
        if not self.lazy_decoding:
            return False
        running = self._running
        start = self._num_lazy
        end = len(running)
        if start == end:
            return True
        if not start and end < self._min_lazy:
            return False  # visiting a few requests costs less than listing them
        if self._caching:
            for i in range(start, end):
                r = running[i]
                if r._cached < r._num_eager_hashes:
                    self._detach_all()
                    return False
        clock = self._clock
        bs = self._block_size
        clock_computed, clock_output = clock.computed, clock.output
        due, finish_due, keys = self._block_due, self._finish_due, self._finish_keys
        for i in range(start, end):
            r = running[i]
            offset = r._computed - clock_computed
            r._computed = offset
            r._output -= clock_output
            r._clock = clock
            due[offset % bs].append(r)
            key = r.max_output_tokens - r._output
            same = finish_due.get(key)
            if same is None:
                finish_due[key] = [r]
                heapq.heappush(keys, key)
            else:
                same.append(r)
        self._num_lazy = end
        return True

    def _materialize(self, req: EngineRequest) -> None:
        """Turn a lazily decoding request's offsets back into its counters."""
        clock = self._clock
        computed = req._computed + clock.computed
        req._computed = computed
        req._output += clock.output
        if self._caching and computed // self._block_size > req._cached:
            req._cached = computed // self._block_size
        req._clock = None

    def _detach_all(self) -> None:
        """Stop lazy decoding: every request keeps its counters itself again."""
        num_lazy = self._num_lazy
        if not num_lazy:
            return
        for r in self._running[:num_lazy]:
            self._materialize(r)
        for bucket in self._block_due:
            bucket.clear()
        self._finish_due.clear()
        self._finish_keys.clear()
        self._num_lazy = 0

    def _detach(self, req: EngineRequest) -> None:
        """Take a lazily decoding request that just left the running set out of lazy
        decoding (out of ``_finish_due`` too unless its list was already taken out)."""
        offset = req._computed
        self._block_due[offset % self._block_size].remove(req)
        key = req.max_output_tokens - req._output
        same = self._finish_due.get(key)
        if same is not None and req in same:
            same.remove(req)
            if not same:
                del self._finish_due[key]
        self._num_lazy -= 1
        self._materialize(req)

    def _fewest_lazy_left(self) -> int:
        """Fewest output tokens left over the lazily decoding requests still in
        ``_finish_due``; -1 if none."""
        keys, finish_due = self._finish_keys, self._finish_due
        while keys and keys[0] not in finish_due:
            heapq.heappop(keys)
        return keys[0] - self._clock.output if keys else -1

    # ----------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Raise ``RuntimeError`` if the scheduler's state is inconsistent (between steps).

        Checks the pool's own invariants, then: ``_running_ids`` are the running set's
        ids in order; the running set is within ``max_num_seqs`` and holds RUNNING
        requests each once; each running request holds
        exactly ``cdiv(num_computed_tokens, block_size)`` blocks, has computed at most its
        known tokens and has tokens left to generate; waiting requests hold no blocks and
        have computed nothing; live requests are exactly running plus waiting; every
        block's ref count equals the number of requests holding it; a request's cached
        blocks carry its block hashes; the cached decode-run state and decoding sums
        (``_run_cache``, ``_sums_cache``) equal what the current state gives; the lazily
        decoding requests are listed as :meth:`_check_lazy` says.
        """
        self.pool.check_invariants()
        cached_run, cached_sums = self._run_cache, self._sums_cache
        self._run_cache = self._sums_cache = None
        fresh_sums = self._decoding_sums()
        fresh_run = self._decode_run_state()
        self._run_cache, self._sums_cache = cached_run, cached_sums
        if cached_sums is not None and cached_sums != fresh_sums:
            raise RuntimeError(f"cached decoding sums {cached_sums} are stale: now {fresh_sums}")
        if cached_run is not None and cached_run != fresh_run:
            raise RuntimeError(f"cached decode-run state {cached_run} is stale: now {fresh_run}")
        self._check_lazy()
        cfg = self.config
        ids = self._running_ids
        if list(ids) != [r.request_id for r in self._running] or set(ids.values()) - {1}:
            raise RuntimeError("the running ids are not those of the running set, 1 each")
        if len(self._running) > cfg.max_num_seqs:
            raise RuntimeError(f"{len(self._running)} running > max_num_seqs {cfg.max_num_seqs}")
        waiting = list(self._waiting.ordered())
        if len(waiting) != len(self._waiting):
            raise RuntimeError(f"waiting count {len(self._waiting)} != {len(waiting)} queued")
        live = {id(r) for r in self._running} | {id(r) for r in waiting}
        if len(live) != len(self._running) + len(waiting) or live != {
            id(r) for r in self._requests.values()
        }:
            raise RuntimeError("live requests are not exactly the running plus waiting ones")
        holders = [0] * self.pool.num_blocks
        for r in self._running:
            self._check_running(r)
            for b in r.block_ids:
                holders[b] += 1
        for r in waiting:
            if r.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                raise RuntimeError(f"{r!r} is queued with status {r.status.value}")
            if r.block_ids or r.num_computed_tokens:
                raise RuntimeError(f"waiting {r!r} holds blocks or computed tokens")
        for b, count in enumerate(holders):
            if self.pool.ref_count(b) != count:
                raise RuntimeError(
                    f"block {b} has ref count {self.pool.ref_count(b)} but {count} holders"
                )

    def _check_lazy(self) -> None:
        """The lazily decoding requests are the first ``_num_lazy`` running ones, all
        decoding, none with hashes to register; ``_block_due`` and ``_finish_due`` hold
        each of them once, under its offset and finishing tick, in running order (the lists
        are compared with lists built in running order)."""
        clock = self._clock
        lazy = self._running[: self._num_lazy]
        if len(lazy) != self._num_lazy:
            raise RuntimeError(f"{self._num_lazy} lazy requests but {len(lazy)} running")
        if any(r._clock is not clock for r in lazy) or any(
            r._clock is not None for r in (*self._running[self._num_lazy :], *self.waiting())
        ):
            raise RuntimeError("the lazily decoding requests are not a prefix of running")
        due: dict[int, list[EngineRequest]] = {}
        finish: dict[int, list[EngineRequest]] = {}
        for r in lazy:
            if not r.is_decoding or (self._caching and r._cached < r._num_eager_hashes):
                raise RuntimeError(f"{r!r} decodes lazily but cannot")
            due.setdefault(r._computed % self._block_size, []).append(r)
            finish.setdefault(r.max_output_tokens - r._output, []).append(r)
        buckets = {k: b for k, b in enumerate(self._block_due) if b}
        if buckets != due or self._finish_due != finish:
            raise RuntimeError("the lazy block or finish lists do not match the requests")
        if any(r.max_output_tokens - r._output <= clock.output for r in lazy):
            raise RuntimeError("a lazily decoding request is past its last token")
        if not set(self._finish_due) <= set(self._finish_keys):
            raise RuntimeError("a finishing tick is missing from the heap")

    def _check_running(self, r: EngineRequest) -> None:
        bs = self._block_size
        if r.status is not RequestStatus.RUNNING:
            raise RuntimeError(f"{r!r} is in the running set")
        if not 0 < r.num_computed_tokens <= r.num_tokens:
            raise RuntimeError(f"{r!r} has computed tokens out of range")
        if len(r.block_ids) != _cdiv(r.num_computed_tokens, bs):
            raise RuntimeError(f"{r!r} holds {len(r.block_ids)} blocks")
        if not 0 <= r.num_output_tokens < r.max_output_tokens:
            raise RuntimeError(f"{r!r} should have finished")
        if r._num_cached_blocks > len(r.block_ids):
            raise RuntimeError(f"{r!r} has more cached blocks than blocks")
        for i in range(min(r._num_cached_blocks, r._num_eager_hashes)):
            if self.pool.block_hash(r.block_ids[i]) != r.block_hashes[i]:
                raise RuntimeError(f"{r!r} block {i} is cached under another hash")
