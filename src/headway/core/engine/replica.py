"""One engine replica: the scheduler and the KV pool, timed by a step-time model.

The simulator (virtual clock) and the emulator (wall clock) drive the same
:class:`ReplicaModel`; time only comes in as ``now``. A driver loop::

    replica.add_request(req, now)          # any time; it joins at the next step
    result = replica.step(now)             # one engine step, starting at now
    # tokens in result.tokens are emitted at result.end_s; call step() again at end_s

Runs of identical decode-only steps (every running request emits one token, nobody is
admitted, preempted or finished until the last step) evolve in closed form: step ``k`` of
a run over ``R`` sequences that starts with ``KV`` tokens in cache reads ``KV + (k-1)·R``
KV tokens, so with a step time ``base + per_kv·kv`` the first ``k`` steps take::

    T(k) = k·base + per_kv·(k·KV + R·k·(k-1)/2)

The simulator asks :meth:`ReplicaModel.max_identical_decode_steps` (and
:meth:`ReplicaModel.decode_steps_starting_before` for its next arrival) and jumps with
:meth:`ReplicaModel.advance_decode_steps`, which leaves the replica in exactly the state
that stepping one by one would (``tests/property/test_engine_decode_skip.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from headway.core.engine.scheduler import (
    BlockSteps,
    EngineRequest,
    RequestId,
    Scheduler,
    SchedulerConfig,
)
from headway.core.engine.steptime import BatchShape, StepTimeModel
from headway.core.pickling import reduce_by_fields

__all__ = [
    "DecodeRun",
    "ReplicaModel",
    "ReplicaSnapshot",
    "StepResult",
    "decode_run_duration_s",
    "steps_starting_before",
]


def decode_run_duration_s(
    num_steps: int,
    num_seqs: int,
    kv_tokens_first_step: int,
    base_s: float,
    per_kv_token_s: float,
) -> float:
    """Seconds taken by ``num_steps`` decode-only steps of ``num_seqs`` sequences.

    Step ``k`` (1-based) reads ``kv_tokens_first_step + (k - 1) * num_seqs`` KV tokens and
    takes ``base_s + per_kv_token_s * kv``; the sum is an arithmetic series, summed exactly
    in integers before the one multiplication.
    """
    kv_total = num_steps * kv_tokens_first_step + num_seqs * (num_steps * (num_steps - 1) // 2)
    return num_steps * base_s + per_kv_token_s * kv_total


def steps_starting_before(
    now: float,
    until_s: float,
    limit: int,
    num_seqs: int,
    kv_first: int,
    base_s: float,
    per_kv_s: float,
) -> int:
    """How many of at most ``limit`` identical decode steps run from ``now`` < ``until_s``
    (``num_seqs`` sequences, ``kv_first`` KV tokens at the first, each step ``base_s +
    per_kv_s × KV tokens``) start before ``until_s`` (the first always does)."""
    lo, hi = 1, limit  # step 1 starts at now < until_s

    # The search decides with the same sums; the closed-form estimate of the answer
    # (the root of a quadratic) only narrows its bracket, usually to one value.
    def starts_before(k: int) -> bool:
        duration_s = decode_run_duration_s(k - 1, num_seqs, kv_first, base_s, per_kv_s)
        return now + duration_s < until_s

    guess = _estimate_steps_before(until_s - now, num_seqs, kv_first, base_s, per_kv_s)
    guess = min(max(guess, lo), hi)
    if starts_before(guess):
        lo = guess
        if guess < hi and not starts_before(guess + 1):
            hi = guess
    else:
        hi = guess - 1  # >= 1: step 1 starts before until_s
        if lo < hi and starts_before(hi):
            lo = hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts_before(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _estimate_steps_before(
    until_s: float, num_seqs: int, kv_tokens_first_step: int, base_s: float, per_kv_token_s: float
) -> int:
    """Roughly how many decode steps start before ``until_s`` seconds into a run: the
    real root ``x`` of ``T(x) = until_s``, where ``T(x) = a x² + b x`` is
    :func:`decode_run_duration_s` written as a polynomial, plus one (step ``k`` starts
    at ``T(k - 1)``). An estimate for a search to check, 1 when there is none."""
    a = per_kv_token_s * num_seqs / 2
    b = base_s + per_kv_token_s * kv_tokens_first_step - a
    if a > 0:
        root = (-b + math.sqrt(b * b + 4 * a * until_s)) / (2 * a)
    elif b > 0:
        root = until_s / b
    else:
        return 1
    if not 0 <= root < 2**62:
        return 1
    return math.ceil(root)


@dataclass(slots=True, init=False, unsafe_hash=True)  # a value: see BatchShape
class StepResult:
    """The outcome of one :meth:`ReplicaModel.step`."""

    start_s: float
    """When the step started (the ``now`` passed in)."""

    duration_s: float
    """How long it took, from the step-time model (0 for an empty step)."""

    end_s: float
    """``start_s + duration_s``: when its tokens are emitted and the next step may start."""

    tokens: Mapping[RequestId, int]
    """Tokens emitted per request at ``end_s`` (1 each; a prefill that completes emits the
    first token; a prefill chunk that does not is absent)."""

    finished_ids: tuple[RequestId, ...]
    """Requests that emitted their last token in this step."""

    preempted_ids: tuple[RequestId, ...]
    """Requests preempted by this step (KV freed; they will recompute)."""

    admitted_ids: tuple[RequestId, ...]
    """Requests that entered the running set in this step (new or resumed)."""

    num_scheduled_tokens: Mapping[RequestId, int]
    """Tokens computed per request in this step."""

    batch: BatchShape
    """The step's batch sums (what the step-time model priced)."""

    admitted_cached_tokens: tuple[int, ...] = field(compare=False, hash=False, repr=False)
    """Per request of ``admitted_ids``: prompt tokens found in the prefix cache at its
    first admission (empty when the plan did not say)."""

    allocated: Mapping[RequestId, int] = field(hash=False, repr=False)
    """Requests given KV blocks at ``start_s`` (prefill chunks, admissions, decode tokens
    that start a block), each with the blocks it holds from then on (see
    ``SchedulePlan.allocated``); ``preempted_ids`` gave all of theirs back then, and a
    request that finishes in the step holds its blocks to ``end_s``, as a client sees it."""

    def __init__(
        self,
        *,
        start_s: float,
        duration_s: float,
        end_s: float,
        tokens: Mapping[RequestId, int],
        finished_ids: tuple[RequestId, ...],
        preempted_ids: tuple[RequestId, ...],
        admitted_ids: tuple[RequestId, ...],
        num_scheduled_tokens: Mapping[RequestId, int],
        batch: BatchShape,
        admitted_cached_tokens: tuple[int, ...] = (),
        allocated: Mapping[RequestId, int] | None = None,
    ) -> None:
        self.start_s = start_s
        self.duration_s = duration_s
        self.end_s = end_s
        self.tokens = tokens
        self.finished_ids = finished_ids
        self.preempted_ids = preempted_ids
        self.admitted_ids = admitted_ids
        self.num_scheduled_tokens = num_scheduled_tokens
        self.batch = batch
        self.admitted_cached_tokens = admitted_cached_tokens
        self.allocated = {} if allocated is None else allocated

    @property
    def is_empty(self) -> bool:
        """True when the replica had nothing it could compute."""
        return self.batch.is_empty


@dataclass(slots=True, init=False, unsafe_hash=True)  # a value: see BatchShape
class DecodeRun:
    """A run of identical decode-only steps applied at once by
    :meth:`ReplicaModel.advance_decode_steps`.

    Every request in ``request_ids`` emitted one token at the end of each step ``k``
    (``1..num_steps``), at :meth:`step_end_s` ``(k)``.
    """

    start_s: float
    """When the first step started."""

    num_steps: int
    """Steps in the run."""

    request_ids: tuple[RequestId, ...]
    """The decoding requests, in running order."""

    kv_tokens_first_step: int
    """KV tokens read by the first step."""

    base_s: float
    """Per-step cost at this batch size, from ``StepTimeModel.decode_step_affine``."""

    per_kv_token_s: float
    """Per-KV-token cost, from ``StepTimeModel.decode_step_affine``."""

    finished_ids: tuple[RequestId, ...]
    """Requests that emitted their last token in the last step."""

    end_s: float
    """When the last step ended: ``step_end_s(num_steps)``, computed once."""

    block_steps: BlockSteps
    """The KV blocks the run gave, by step (see ``scheduler.BlockSteps``; the start of
    step ``k`` is ``step_end_s(k - 1)``). Empty for a preview: only the applied run says."""

    def __init__(
        self,
        *,
        start_s: float,
        num_steps: int,
        request_ids: tuple[RequestId, ...],
        kv_tokens_first_step: int,
        base_s: float,
        per_kv_token_s: float,
        finished_ids: tuple[RequestId, ...],
        block_steps: BlockSteps = (),
    ) -> None:
        self.start_s = start_s
        self.num_steps = num_steps
        self.request_ids = request_ids
        self.kv_tokens_first_step = kv_tokens_first_step
        self.base_s = base_s
        self.per_kv_token_s = per_kv_token_s
        self.finished_ids = finished_ids
        self.block_steps = block_steps
        self.end_s = start_s + decode_run_duration_s(
            num_steps, len(request_ids), kv_tokens_first_step, base_s, per_kv_token_s
        )

    @property
    def num_seqs(self) -> int:
        """Sequences in each step."""
        return len(self.request_ids)

    def step_end_s(self, k: int) -> float:
        """End of step ``k`` (``0 <= k <= num_steps``; step 0 ends at ``start_s``)."""
        if not 0 <= k <= self.num_steps:
            raise ValueError(f"k must be in 0..{self.num_steps} (got {k})")
        return self.start_s + decode_run_duration_s(
            k, self.num_seqs, self.kv_tokens_first_step, self.base_s, self.per_kv_token_s
        )

    def block_starts_s(self, block_size: int) -> list[tuple[int, float]]:
        """Per entry ``(k, ids)`` of :attr:`block_steps`: how many blocks each of its
        requests took (in steps ``k``, ``k + block_size``, ... up to :attr:`num_steps`)
        and the start times of those steps summed (step ``j`` starts when step ``j - 1``
        ends), in closed form: the KV tokens are summed exactly in integers, as in
        :func:`decode_run_duration_s`."""
        m, kv_first, num_seqs = self.num_steps, self.kv_tokens_first_step, len(self.request_ids)
        start_s, base_s, per_kv_s = self.start_s, self.base_s, self.per_kv_token_s
        b = block_size
        sums: list[tuple[int, float]] = []
        for k, _ in self.block_steps:
            # Step j starts T(j - 1) after the run's start: offsets a, a + b, ... (n of them)
            n, a = (m - k) // b + 1, k - 1
            pairs = n * (n - 1) // 2
            sum_x = n * a + b * pairs
            sum_x2 = n * a * a + 2 * a * b * pairs + b * b * (pairs * (2 * n - 1) // 3)
            # T(x) = x base + per_kv (x KV + R x (x - 1) / 2), summed over the offsets
            kv_total = kv_first * sum_x + num_seqs * ((sum_x2 - sum_x) // 2)
            sums.append((n, n * start_s + base_s * sum_x + per_kv_s * kv_total))
        return sums

    @property
    def duration_s(self) -> float:
        """Seconds the whole run took."""
        return decode_run_duration_s(
            self.num_steps,
            self.num_seqs,
            self.kv_tokens_first_step,
            self.base_s,
            self.per_kv_token_s,
        )

    @property
    def tokens(self) -> Mapping[RequestId, int]:
        """Tokens emitted per request over the run (``num_steps`` each)."""
        return dict.fromkeys(self.request_ids, self.num_steps)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSnapshot:
    """Load and KV state of a replica, for metrics and routing."""

    num_running: int
    """Requests in the running set."""
    num_waiting: int
    """Requests in the waiting queue (preempted ones included)."""
    num_blocks: int
    """KV blocks in the pool."""
    num_free_blocks: int
    """Blocks not held by any request (cached ones included)."""
    num_cached_blocks: int
    """Blocks that carry a prefix-cache hash."""
    kv_usage: float
    """Fraction of blocks held by requests (vLLM ``kv_cache_usage_perc``)."""
    num_pending_prefill_tokens: int
    """Known tokens not yet computed, over live requests that are not decoding."""
    num_steps: int
    """Steps run so far (a decode run counts each of its steps)."""
    num_preemptions: int
    """Preemptions so far."""
    num_finished: int
    """Requests finished so far."""
    num_aborted: int
    """Requests aborted so far."""
    num_prefix_queried_tokens: int
    """Known tokens of requests at admission, summed."""
    num_prefix_hit_tokens: int
    """Of those, tokens served from the prefix cache."""
    busy_until_s: float
    """End of the last step (``-inf`` before the first)."""

    def __reduce__(self) -> tuple[Callable[[], ReplicaSnapshot], tuple[()]]:
        """Pickle by calling the class (compiled, the default refuses a frozen class)."""
        return reduce_by_fields(self)


class ReplicaModel:
    """A replica of an inference engine, modelled step by step (vLLM v1 semantics).

    Contract: :meth:`add_request` and :meth:`abort` may be called at any time between
    steps; :meth:`step` runs one step starting at ``now``, which must not be earlier than
    the end of the previous step; :meth:`advance_decode_steps` runs several identical
    decode-only steps at once. Nothing here reads a clock.
    """

    def __init__(self, config: SchedulerConfig, num_blocks: int, step_time: StepTimeModel):
        """Create an idle replica.

        Args:
            config: scheduler and cache settings.
            num_blocks: KV blocks, from the roofline's memory budget.
            step_time: predicts each step's duration.

        Raises:
            ValueError: if ``num_blocks`` is not positive.
        """
        self.scheduler: Final = Scheduler(config, num_blocks)
        self.step_time: Final = step_time
        self._busy_until_s = -math.inf
        self._num_steps = 0
        self._affine: dict[int, tuple[float, float]] = {}
        """``step_time.decode_step_affine`` by batch size, asked once per size (a step-time
        model is a function of the batch: the same batch always takes the same time)."""
        self.time_scale = 1.0
        """Every step takes this many times what the step-time model predicts (a degraded
        replica: :meth:`set_time_scale`)."""

    def set_time_scale(self, factor: float) -> None:
        """Make steps that start from now on take ``factor`` × the predicted time (a
        slowdown fault; 1 restores). Steps and decode runs are scaled alike."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"a time scale must be a finite number > 0 (got {factor})")
        self.time_scale = factor

    @property
    def config(self) -> SchedulerConfig:
        """The scheduler configuration."""
        return self.scheduler.config

    @property
    def has_work(self) -> bool:
        """True while a request is running or waiting."""
        return self.scheduler.has_unfinished_requests

    @property
    def num_running(self) -> int:
        """Requests in the running set."""
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue."""
        return self.scheduler.num_waiting

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks held by requests."""
        return self.scheduler.pool.usage

    @property
    def num_preemptions(self) -> int:
        """Preemptions so far."""
        return self.scheduler.num_preemptions

    @property
    def busy_until_s(self) -> float:
        """End of the last step; the next one may not start earlier."""
        return self._busy_until_s

    # ----------------------------------------------------------------- requests

    def add_request(self, req: EngineRequest, now: float) -> None:
        """Queue a request received at ``now``; it can join the next step.

        Raises:
            ValueError: see :meth:`Scheduler.add_request`.
        """
        self.scheduler.add_request(req, now)

    def abort(self, request_id: RequestId) -> bool:
        """Cancel a request and free its KV blocks at once; False if it is not live."""
        return self.scheduler.abort(request_id)

    # ----------------------------------------------------------------- stepping

    def _check_start(self, now: float) -> None:
        if not now >= self._busy_until_s or math.isinf(now):
            raise ValueError(
                f"a step cannot start at now={now}: the previous step ends at "
                f"{self._busy_until_s}; start the next step at or after its end_s"
            )

    def step(self, now: float) -> StepResult:
        """Run one engine step starting at ``now``.

        Raises:
            ValueError: if ``now`` is before the end of the previous step.
        """
        self._check_start(now)
        plan = self.scheduler.schedule()
        duration_s = 0.0 if plan.is_empty else self.step_time.step_time_s(plan.batch)
        duration_s *= self.time_scale
        if not (duration_s >= 0.0 and math.isfinite(duration_s)):
            raise ValueError(
                f"step_time_s returned {duration_s} for {plan.batch}; a step-time model "
                "must return a finite duration >= 0"
            )
        outputs = self.scheduler.update_after_step(plan)
        end_s = now + duration_s
        self._busy_until_s = end_s
        if not plan.is_empty:
            self._num_steps += 1
        return StepResult(
            start_s=now,
            duration_s=duration_s,
            end_s=end_s,
            tokens=outputs.tokens,
            finished_ids=outputs.finished_ids,
            preempted_ids=plan.preempted_ids,
            admitted_ids=plan.admitted_ids,
            num_scheduled_tokens=plan.num_scheduled_tokens,
            batch=plan.batch,
            admitted_cached_tokens=plan.admitted_cached_tokens,
            allocated=plan.allocated,
        )

    def max_identical_decode_steps(self) -> int:
        """How many next steps are certain to be identical decode-only steps (0 if the
        next step is not one): see :meth:`Scheduler.decode_run_limit`. Arrivals are not
        known to the replica; bound the run with :meth:`decode_steps_starting_before`."""
        return self.scheduler.decode_run_limit()

    def _decode_step_affine(self, num_seqs: int, shared_kv_tokens: int) -> tuple[float, float]:
        """``step_time.decode_step_affine(num_seqs, shared_kv_tokens)``, memoised per
        replica where nothing is shared (the common case)."""
        if shared_kv_tokens:
            return self.step_time.decode_step_affine(num_seqs, shared_kv_tokens)
        affine = self._affine.get(num_seqs)
        if affine is None:
            affine = self._affine[num_seqs] = self.step_time.decode_step_affine(num_seqs)
        return affine

    def _decode_affine(self) -> tuple[int, int, float, float]:
        sched = self.scheduler
        num_seqs = sched.num_running
        kv_first = sched.decode_run_kv_tokens()
        base_s, per_kv_token_s = self._decode_step_affine(
            num_seqs, sched.shared_kv_tokens(kv_first)
        )
        scale = self.time_scale
        return num_seqs, kv_first, base_s * scale, per_kv_token_s * scale

    def decode_run_end_s(self, now: float, num_steps: int) -> float:
        """When ``num_steps`` identical decode steps run from ``now`` would end: the
        ``end_s`` of :meth:`preview_decode_run`, without building the run."""
        num_seqs, kv_first, base_s, per_kv_s = self._decode_affine()
        return now + decode_run_duration_s(num_steps, num_seqs, kv_first, base_s, per_kv_s)

    def decode_steps_starting_before(
        self, now: float, until_s: float, max_steps: int | None = None
    ) -> int:
        """How many of the next identical decode steps, run from ``now``, start before
        ``until_s`` (a step that starts at or after an arrival must see that arrival).

        ``max_steps`` defaults to :meth:`max_identical_decode_steps`.
        """
        limit = self.max_identical_decode_steps() if max_steps is None else max_steps
        if limit <= 0 or not now < until_s:
            return 0
        return steps_starting_before(now, until_s, limit, *self._decode_affine())

    def preview_decode_run(self, now: float, num_steps: int) -> DecodeRun:
        """The run that :meth:`advance_decode_steps` would apply, without applying it.

        Lets a driver schedule the run's end (and split it when something arrives) while
        the replica's state stays as it is until the steps are really applied.
        """
        running = self.scheduler.running
        _, kv_first, base_s, per_kv_token_s = self._decode_affine()
        return DecodeRun(
            start_s=now,
            num_steps=num_steps,
            request_ids=tuple(r.request_id for r in running),
            kv_tokens_first_step=kv_first,
            base_s=base_s,
            per_kv_token_s=per_kv_token_s,
            finished_ids=tuple(
                r.request_id for r in running if r.num_remaining_output_tokens == num_steps
            ),
        )

    def advance_decode_steps(self, now: float, num_steps: int) -> DecodeRun:
        """Apply ``num_steps`` identical decode-only steps starting at ``now``.

        Every running request emits ``num_steps`` tokens, blocks are allocated as
        requests cross block boundaries, and the duration is the closed-form sum above.

        Raises:
            ValueError: if ``now`` is before the end of the previous step, or
                ``num_steps`` is not in ``1..max_identical_decode_steps()``.
        """
        self._check_start(now)
        # The run's affine form as previewed, taken before the run is applied: it ends by
        # freeing its finished requests, and their shared blocks with them.
        _, _, base_s, per_kv_token_s = self._decode_affine()
        outcome = self.scheduler.apply_decode_steps(num_steps)
        run = DecodeRun(
            start_s=now,
            num_steps=outcome.num_steps,
            request_ids=outcome.request_ids,
            kv_tokens_first_step=outcome.kv_tokens_first_step,
            base_s=base_s,
            per_kv_token_s=per_kv_token_s,
            finished_ids=outcome.finished_ids,
            block_steps=outcome.block_steps,
        )
        self._busy_until_s = run.end_s
        self._num_steps += num_steps
        return run

    # ----------------------------------------------------------------- state

    def snapshot(self) -> ReplicaSnapshot:
        """Current load and KV state (O(live requests))."""
        sched = self.scheduler
        pool = sched.pool
        pending = 0
        for req in (*sched.running, *sched.waiting()):
            if not req.is_decoding:
                pending += req.num_tokens - req.num_computed_tokens
        return ReplicaSnapshot(
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            num_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free,
            num_cached_blocks=pool.num_cached,
            kv_usage=pool.usage,
            num_pending_prefill_tokens=pending,
            num_steps=self._num_steps,
            num_preemptions=sched.num_preemptions,
            num_finished=sched.num_finished,
            num_aborted=sched.num_aborted,
            num_prefix_queried_tokens=sched.num_prefix_queried_tokens,
            num_prefix_hit_tokens=sched.num_prefix_hit_tokens,
            busy_until_s=self._busy_until_s,
        )

    def check_invariants(self) -> None:
        """Raise ``RuntimeError`` if the scheduler or pool state is inconsistent."""
        self.scheduler.check_invariants()
