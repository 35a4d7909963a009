"""What a run records: per-call rows, step and decode-run tokens, ITL, timeline samples.

Records are Python lists while the run goes (cheaper to touch than numpy elements) and
become :class:`~headway.sim.outcome.CallRecords` arrays at the end. Token gaps go into a
log-binned histogram as they come, each with its weight (the tokens that had it).
"""

from __future__ import annotations

import math
from typing import Final, cast

import numpy as np

from headway.core.engine.replica import DecodeRun, StepResult
from headway.core.engine.request import EngineRequest
from headway.sim.outcome import (
    FAILED,
    IN_FLIGHT,
    NOT_OFFERED,
    STAY_COLUMNS,
    CallRecords,
    SimOutcome,
)
from headway.sim.state import SimState

# ITL histogram: log-spaced bins from 10 µs to 1,000 s, 0.25% wide.
_ITL_EDGES: Final = np.geomspace(1e-5, 1e3, 7373)
_ITL_EDGE_LIST: Final[list[float]] = _ITL_EDGES.tolist()
_ITL_LOW_S: Final[float] = _ITL_EDGE_LIST[0]
_ITL_HIGH_S: Final[float] = _ITL_EDGE_LIST[-1]
_ITL_BINS: Final[int] = len(_ITL_EDGE_LIST) - 1
_ITL_PER_LOG: Final[float] = _ITL_BINS / math.log(_ITL_HIGH_S / _ITL_LOW_S)


def processed_tokens(req: EngineRequest) -> int:
    """The tokens an engine request has processed where it is (its prompt as far as
    computed there, not counting KV that arrived from elsewhere, and its output)."""
    prompt = min(req.num_computed_tokens, req.num_prompt_tokens)
    return max(prompt - req.num_external_computed_tokens, 0) + req.num_output_tokens


class Recording(SimState):
    """The simulator's records: call rows, tokens and gaps per step, timeline samples."""

    def _init_records(self, n: int) -> None:
        """Empty records for ``n`` calls, an empty ITL histogram, no steps yet."""
        nan = math.nan
        self._dispatch_s = [nan] * n
        self._replica_enter_s = [nan] * n
        self._replica_stays = []
        self._kv_held = [0] * n
        self._kv_blocks = [0] * n
        self._kv_block_s = [0.0] * n
        self._kv_window_s = math.inf
        self._admitted_s = [nan] * n
        self._first_token_s = [nan] * n
        self._finish_s = [nan] * n
        self._last_token_s = [nan] * n
        self._num_output_tokens = [0] * n
        self._itl_max_s = [0.0] * n
        self._num_preemptions = [0] * n
        self._replica = [-1] * n
        self._cancelled = [False] * n
        self._lost_race = [False] * n
        self._fell_back = [False] * n
        self._degraded = [False] * n
        self._deferred = [False] * n
        self._arrival_s = [nan] * n
        self._outcome = [NOT_OFFERED] * n
        self._shed_reason = [-1] * n
        self._retry_after_s = [nan] * n
        self._first_retry_after_s = [nan] * n
        self._attempts = [0] * n
        self._cached_prompt_tokens = [-1] * n
        self._itl_counts = [0] * _ITL_BINS
        self._num_steps = 0
        self._num_skipped = 0

    def _record_stay(
        self, j: int, now: float, prompt_tokens: int, output_tokens: int, computed_tokens: int,
        aborted: bool,
    ) -> None:  # fmt: skip
        """Row ``j``'s engine request left its engine at ``now``, finished (or its prefill
        handed on) or ``aborted`` (cancelled, lost with its replica), having held
        ``prompt_tokens``, generated ``output_tokens`` and processed ``computed_tokens``
        (prompt and output) there: one row of :data:`~headway.sim.outcome.STAY_COLUMNS`,
        its blocks given back at ``now`` (a request that finished in a step held them to
        its end, as a client sees it)."""
        held, block_s = self._kv_held[j], self._kv_block_s[j]
        if held and now < self._kv_window_s:
            block_s -= held * (self._kv_window_s - now)
        blocks = self._kv_blocks[j]
        self._kv_held[j] = self._kv_blocks[j] = 0
        self._kv_block_s[j] = 0.0
        enter = self._replica_enter_s[j]
        admitted = self._admitted_s[j]
        if admitted < enter:  # admitted in an earlier stay (a decode replica's: at entry)
            admitted = enter
        first = self._first_token_s[j]
        if not first >= enter:  # none in this stay (a decode replica's: its first step)
            first = admitted
        stay = (enter, now, admitted, first, float(prompt_tokens), float(output_tokens))
        self._replica_stays.extend(stay)
        self._replica_stays.extend((float(computed_tokens), float(j), float(aborted)))
        self._replica_stays.extend((float(blocks), block_s))

    def _sim_outcome(self, now: float, num_events: int, loop_wall_s: float) -> SimOutcome:
        """The run's outcome at its end ``now``, after ``num_events`` events in
        ``loop_wall_s`` seconds of wall-clock time."""
        timeline = np.array(self._timeline) if self._timeline else np.zeros((0, 4))
        at = np.array(self._boundary_samples) if self._boundary_samples else np.zeros((0, 4))
        up_s = [(now if d.stopped_s is None else d.stopped_s) - d.started_s for d in self.drivers]
        return SimOutcome(
            calls=self._call_records(),
            task_finish_s=self.task_finish_s,
            timeline_s=timeline[:, 0].astype(np.float64),
            timeline_running=timeline[:, 1].astype(np.int64),
            timeline_waiting=timeline[:, 2].astype(np.int64),
            timeline_kv_usage=timeline[:, 3].astype(np.float64),
            itl_histogram=np.array(self._itl_counts, dtype=np.int64),
            itl_edges_s=_ITL_EDGES,
            num_steps=self._num_steps,
            num_skipped_steps=self._num_skipped,
            num_events=num_events,
            end_s=now,
            loop_wall_s=loop_wall_s,
            replica_num_blocks=self.drivers[0].model.scheduler.pool.num_blocks,
            replica_block_size=self._block_size,
            gateway_preset="fifo-unbounded" if self.gateway is None else "headway-default",
            cancelled_by_patience=self._num_impatient,
            prefix_queried_tokens=sum(
                d.model.scheduler.num_prefix_queried_tokens for d in self.drivers
            ),
            prefix_hit_tokens=sum(d.model.scheduler.num_prefix_hit_tokens for d in self.drivers),
            replica_s=sum(up_s),
            replica_up_s=up_s,
            replica_busy_s=[d.busy_s for d in self.drivers],
            replicas_provisioned_max=max(
                [self._initial_replicas] + [n for _, n in self._scale_events]
            ),
            calls_lost_with_replicas=self._num_lost_calls,
            tool_failures=self._num_tool_failures,
            tool_retries=self._tool_retries,
            duplicates_sent=self._duplicates_sent,
            duplicates_coalesced=self._duplicates_coalesced,
            duplicate_output_tokens=self._duplicate_tokens,
            task_end_s=np.array(self._task_end_s, dtype=np.float64),
            timeline_tasks=at[:, 0].astype(np.int64),
            timeline_calls=at[:, 1].astype(np.int64),
            timeline_kv_blocks=at[:, 2].astype(np.int64),
            timeline_tool_calls=at[:, 3].astype(np.int64),
            tool_stays_s=np.array(self._tool_stays, dtype=np.float64).reshape(-1, 2),
            kv_transfers=self._num_transfers,
            kv_transfer_s_total=self._transfer_s_total,
            cache_emptied=np.array(
                [(float(d.index), d.started_s) for d in self.drivers[: self._initial_replicas]]
                + [(float(r), t) for r, t in self._cache_emptied],
                dtype=np.float64,
            ).reshape(-1, 2),
            replica_stays=np.array(self._replica_stays, dtype=np.float64).reshape(
                -1, len(STAY_COLUMNS)
            ),
        )

    def _call_records(self) -> CallRecords:
        """The per-call lists as the arrays of :class:`CallRecords`: one row per call of
        the workload; a call its client's duplicate answered takes the duplicate's
        timings (the user saw that copy), keeping its own arrival."""
        n = self.w.num_calls
        dispatch_s, admitted_s = self._dispatch_s, self._admitted_s
        first_token_s, itl_max_s, replica = self._first_token_s, self._itl_max_s, self._replica
        for j, d in self._answered_by.items():
            dispatch_s[j], admitted_s[j] = dispatch_s[d], admitted_s[d]
            first_token_s[j], itl_max_s[j], replica[j] = first_token_s[d], itl_max_s[d], replica[d]
            self._num_output_tokens[j] = self._num_output_tokens[d]
            self._kv_transfer_s[j] = self._kv_transfer_s[d]
            self._cached_prompt_tokens[j] = self._cached_prompt_tokens[d]
        return CallRecords(
            dispatch_s=np.array(dispatch_s[:n], dtype=np.float64),
            admitted_s=np.array(admitted_s[:n], dtype=np.float64),
            first_token_s=np.array(first_token_s[:n], dtype=np.float64),
            finish_s=np.array(self._finish_s[:n], dtype=np.float64),
            num_output_tokens=np.array(self._num_output_tokens[:n], dtype=np.int64),
            itl_max_s=np.array(itl_max_s[:n], dtype=np.float64),
            num_preemptions=np.array(self._num_preemptions[:n], dtype=np.int64),
            replica=np.array(replica[:n], dtype=np.int64),
            cancelled=np.array(self._cancelled[:n], dtype=np.bool_),
            arrival_s=np.array(self._arrival_s[:n], dtype=np.float64),
            outcome=np.array(
                [FAILED if o == IN_FLIGHT else o for o in self._outcome[:n]], dtype=np.int8
            ),
            shed_reason=np.array(self._shed_reason[:n], dtype=np.int8),
            retry_after_s=np.array(self._retry_after_s[:n], dtype=np.float64),
            first_retry_after_s=np.array(self._first_retry_after_s[:n], dtype=np.float64),
            attempts=np.array(self._attempts[:n], dtype=np.int64),
            lost_race=np.array(self._lost_race[:n], dtype=np.bool_),
            fell_back=np.array(self._fell_back[:n], dtype=np.bool_),
            degraded=np.array(self._degraded[:n], dtype=np.bool_),
            deferred=np.array(self._deferred[:n], dtype=np.bool_),
            kv_transfer_s=np.array(self._kv_transfer_s[:n], dtype=np.float64),
            cached_prompt_tokens=np.array(self._cached_prompt_tokens[:n], dtype=np.int64),
        )

    def _record_step(self, result: StepResult) -> None:
        """Record a step's admissions, preemptions and tokens.

        Requests that emitted their previous token together have the same gap now: each
        such group goes into the ITL histogram as one value weighted by its size (integer
        weights sum exactly, so the histogram is the same as with one value per token).
        Token counts are not kept per step: see :meth:`_settle_output_tokens`.
        """
        end = result.end_s
        admitted_s = self._admitted_s
        cached = result.admitted_cached_tokens
        for k, j in enumerate(cast("tuple[int, ...]", result.admitted_ids)):
            if admitted_s[j] != admitted_s[j]:  # NaN: the first admission
                admitted_s[j] = result.start_s
                if k < len(cached):
                    self._cached_prompt_tokens[j] = cached[k]
                if self.autoscaler is not None:
                    self._window_wait_s += result.start_s - self._arrival_s[j]
                    self._window_admitted += 1
                    self._window_tokens += self._call_in[j] + self._call_out[j]
        # KV blocks: given at the step's start (a block-second for each second of the
        # window left), all given back by a preemption then.
        inside_s = self._kv_window_s - result.start_s
        held, given_blocks, block_s = self._kv_held, self._kv_blocks, self._kv_block_s
        if result.allocated:
            for j, now_held in cast("dict[int, int]", result.allocated).items():
                given = now_held - held[j]
                held[j] = now_held
                if inside_s > 0:
                    given_blocks[j] += given
                    block_s[j] += given * inside_s
        for j in cast("tuple[int, ...]", result.preempted_ids):
            self._num_preemptions[j] += 1
            if inside_s > 0:
                block_s[j] -= held[j] * inside_s
            held[j] = 0
        last = self._last_token_s
        itl_max = self._itl_max_s
        # The same float object stored for every token (compiled, each store of a float
        # would allocate one): the lists are read as floats and written through these.
        last_out, itl_max_out = cast("list[object]", last), cast("list[object]", itl_max)
        end_obj: object = end
        group_t, gap, count = math.nan, 0.0, 0
        gap_obj: object = gap
        for j in cast("dict[int, int]", result.tokens):
            previous = last[j]
            if previous != previous:  # NaN: the first token
                self._first_token_s[j] = end
            else:
                if previous != group_t:
                    if count:
                        self._count_itl(gap, count)
                    group_t, gap, count = previous, end - previous, 0
                    gap_obj = gap
                count += 1
                if gap > itl_max[j]:
                    itl_max_out[j] = gap_obj
            last_out[j] = end_obj
        if count:
            self._count_itl(gap, count)

    def _record_run(self, run: DecodeRun) -> None:
        """Record ``run.num_steps`` tokens per request of a decode run.

        Step ``k`` of the run lasts ``base + per_kv (KV + (k - 1) R)``: the gaps inside the
        run form an arithmetic progression, summarised for the ITL histogram by a few
        equal chunks (their mean gap, weighted by tokens) instead of one value per token.
        The first gap of each request (since its previous token) is grouped as in
        :meth:`_record_step`.
        """
        self._num_steps += run.num_steps
        m = run.num_steps
        r = run.num_seqs
        base, per_kv, kv = run.base_s, run.per_kv_token_s, run.kv_tokens_first_step
        first_end = run.start_s + base + per_kv * kv
        last_end = run.end_s
        inner_max = base + per_kv * (kv + (m - 1) * r) if m > 1 else 0.0
        last = self._last_token_s
        itl_max = self._itl_max_s
        last_out, itl_max_out = cast("list[object]", last), cast("list[object]", itl_max)
        last_end_obj: object = last_end  # one float object for all (see _record_step)
        group_t, gap, peak, count = math.nan, 0.0, 0.0, 0
        peak_obj: object = peak
        for j in cast("tuple[int, ...]", run.request_ids):
            previous = last[j]
            if previous != group_t:
                if count:
                    self._count_itl(gap, count)
                group_t, gap, count = previous, first_end - previous, 0
                peak = gap if gap > inner_max else inner_max
                peak_obj = peak
            count += 1
            if peak > itl_max[j]:
                itl_max_out[j] = peak_obj
            last_out[j] = last_end_obj
        if count:
            self._count_itl(gap, count)
        if run.block_steps:
            self._record_run_blocks(run)
        if m > 1:
            # Gaps d_k for k = 2..m; chunk c covers k in [lo, hi).
            chunks = min(m - 1, 4)
            lo = 2
            for c in range(1, chunks + 1):
                hi = 2 + (m - 1) * c // chunks
                mid_k = (lo + hi - 1) / 2
                self._count_itl(base + per_kv * (kv + (mid_k - 1) * r), (hi - lo) * r)
                lo = hi

    def _record_run_blocks(self, run: DecodeRun) -> None:
        """Record the KV blocks a decode run gave (``run.block_steps``: a block at the
        start of step ``k`` and of every ``block_size``-th step after it, the same for
        each request of an entry), their block-seconds inside the window summed in closed
        form (step by step only for a run across the window's end, which the samples
        split: none normally)."""
        window_s = self._kv_window_s
        held, given_blocks, block_s = self._kv_held, self._kv_blocks, self._kv_block_s
        steps = cast("tuple[tuple[int, tuple[int, ...]], ...]", run.block_steps)
        sums = run.block_starts_s(self._block_size)
        inside, outside = run.end_s <= window_s, run.start_s >= window_s
        for e in range(len(steps)):  # indexed, not zipped: compiled, a zip is generic
            k, ids = steps[e]
            count, starts_s = sums[e]
            if inside:
                given, inside_s = count, count * window_s - starts_s
            else:
                given, inside_s = 0, 0.0
                for i in range(0 if outside else count):
                    start_s = run.step_end_s(k - 1 + i * self._block_size)
                    if start_s < window_s:
                        given += 1
                        inside_s += window_s - start_s
            for j in ids:
                held[j] += count
                given_blocks[j] += given
                block_s[j] += inside_s

    def _settle_output_tokens(self) -> None:
        """Fill in the output tokens of calls still live in a replica (none, normally).

        Tokens are not counted step by step: a call that finishes emitted all of its
        output (set in :meth:`_call_finished`), a cancelled one what its engine request
        had emitted (:meth:`_cancel_call`); this covers any other at the end.
        """
        for d in self.drivers:
            sched = d.model.scheduler
            for req in (*sched.running, *sched.waiting()):
                r = cast("int", req.request_id)
                self._num_output_tokens[r] = req.num_output_tokens + (r in self._on_decode)

    def _count_itl(self, gap_s: float, tokens: int) -> None:
        """Add ``tokens`` tokens with gap ``gap_s`` to the ITL histogram, in the bin that
        ``np.histogram`` would choose (``edges[i] <= gap < edges[i + 1]``, the last bin
        closed; outside the edges, or NaN: not counted): the log gives the bin to within
        one, the edges themselves decide."""
        if not _ITL_LOW_S <= gap_s <= _ITL_HIGH_S:
            return
        edges = _ITL_EDGE_LIST
        i = min(int(math.log(gap_s / _ITL_LOW_S) * _ITL_PER_LOG), _ITL_BINS - 1)
        while i > 0 and gap_s < edges[i]:
            i -= 1
        while i < _ITL_BINS - 1 and gap_s >= edges[i + 1]:
            i += 1
        self._itl_counts[i] += tokens

    def _sample(self, now: float) -> None:
        """One timeline sample at ``now``: every replica's requests and blocks as a client
        sees them. A pending decode run is applied up to ``now`` first (read before, its
        tokens and blocks would still be those of the run's start); a request whose last
        token the step in flight emits still runs, with its blocks, until that step ends
        (the engine model frees them when it plans the step)."""
        running = waiting = blocks = 0
        used = 0.0
        alive = 0
        block_size = self._block_size
        for d in self.drivers:
            if not d.alive:
                continue
            self._materialize(d, now)
            alive += 1
            finishing = d.pending_finished
            if d.step_result is not None:
                finishing = cast("tuple[int, ...]", d.step_result.finished_ids)
            prefill_only = self._num_prefill > 0 and d.index < self._num_prefill
            for j in finishing:
                # Its last step computed all its tokens but the last one emitted.
                tokens = self._call_in[j] + (0 if prefill_only else self._call_out[j] - 1)
                blocks += -(-tokens // block_size)
            running += d.model.num_running + len(finishing)
            waiting += d.model.num_waiting
            used += d.model.kv_usage
            blocks += d.model.scheduler.pool.num_used
        self._timeline.append((now, running, waiting, used / max(alive, 1)))
        tools = sum(service.in_system(now) for service in self._services)
        self._boundary_samples.append((self._live_tasks, self._live_calls, blocks, tools))
