"""Shards of a schedule, and the run summary's arithmetic on hand-made records."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headway.bench.records import OK, STATUS, TIMEOUT, CallRecords
from headway.bench.schedule import peak_rate_per_s, shard_plans
from headway.bench.sent_trace import sent_rows
from headway.bench.summary import Budgets, Cost, Outcomes, checks, pacing, summarize_run
from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload


def _spec(calls: int = 1, rate: float = 10.0, duration: float = 2.0):  # type: ignore[no-untyped-def]
    return parse_workload(
        {
            "name": "s",
            "duration_s": duration,
            "classes": {
                "c": {
                    "calls": calls,
                    "input_tokens": 5,
                    "output_tokens": 11,
                    "slo": {"ttft_s": 0.1, "e2e_s": 1.0},
                }
            },
            "sources": [{"name": "u", "arrivals": {"process": "constant", "rate_per_s": rate}}],
        }
    )


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_shards_cover_every_call_once(workers: int) -> None:
    w = compile_workload(_spec(calls=3))
    plans = shard_plans(w, workers)
    calls = np.concatenate([p.calls for p in plans])
    assert np.array_equal(np.sort(calls), np.arange(w.num_calls))
    for p in plans:
        offsets = np.array(p.static_offset_s)
        assert (np.diff(offsets) >= 0).all()
        assert len(p.static_calls) * 3 == p.num_calls  # only first steps are on the clock
        assert p.follow_ups is not None
        first = p.static_calls[0]
        assert p.follow_ups.group_end[first] == first + 1
        assert p.follow_ups.task_end[first] == first + 3


def test_single_step_shards_have_no_follow_ups_and_even_spacing() -> None:
    w = compile_workload(_spec())
    (plan,) = shard_plans(w, 1)
    assert plan.follow_ups is None
    assert np.allclose(np.diff(plan.static_offset_s), 0.1)
    assert peak_rate_per_s(np.asarray(plan.static_offset_s)) == pytest.approx(10, abs=1)


def _records(n: int) -> CallRecords:
    r = CallRecords.empty(n)
    r.scheduled_s[:] = np.arange(n) * 0.1
    r.sent_s[:] = r.scheduled_s + 0.001
    r.first_byte_s[:] = r.first_token_s[:] = r.scheduled_s + 0.05
    r.last_token_s[:] = r.end_s[:] = r.scheduled_s + 0.5
    r.status[:] = 200
    r.error[:] = OK
    r.completion_tokens[:] = 11
    return r


def _summary(w, r):  # type: ignore[no-untyped-def]
    cost = Cost(workers=1, loop="uvloop", connections_prefilled=1, run_cpu_s=0.0,
                cpu_ms_per_request=None, total_cpu_s=0.0, startup_s=0.0, wall_s=1.0)  # fmt: skip
    outcomes = Outcomes(calls=w.num_calls, by_error={}, by_status={}, connects=0,
                        connect_errors=0, resent=0, max_open_connections=0)  # fmt: skip
    return summarize_run(w, r, target="t", model="m", endpoint="chat", load_factor=1.0,
                         cost=cost, outcomes=outcomes, budgets=Budgets())  # fmt: skip


def test_refusals_and_timeouts_are_misses_and_latency_starts_at_schedule() -> None:
    w = compile_workload(_spec())
    r = _records(w.num_calls)
    r.error[0], r.status[0] = STATUS, 429
    r.error[1], r.end_s[1] = TIMEOUT, math.nan
    r.sent_s[2] = r.scheduled_s[2] + 0.2  # sent late: its TTFT counts from the schedule
    r.first_token_s[2] = r.sent_s[2] + 0.05
    res = _summary(w, r)
    assert res.slo.calls == 20 and res.slo.met == 17
    assert res.slo.attainment == pytest.approx(17 / 20)
    assert res.latencies.ttft.max_s == pytest.approx(0.25)
    assert res.passed is False  # p99 lateness 0.2 s is over the 10 ms budget


def test_budget_checks() -> None:
    r = _records(100)
    p = pacing(r)
    assert p.rate_ratio == pytest.approx(1.0) and p.scheduled_gap_cv == pytest.approx(0, abs=1e-9)
    assert all(c.passed for c in checks(p, Budgets()))
    r.sent_s[50:] += np.linspace(0, 5, 50)  # the sender falls behind
    failed = {c.name for c in checks(pacing(r), Budgets()) if not c.passed}
    assert failed == {"lateness_p99_s", "rate_ratio"}


def test_served_tokens_are_compared_with_the_asked_and_drift_warns_past_two_percent() -> None:
    """The summary has asked and served totals; +10% prompt drift warns, +1% does not."""
    w = compile_workload(_spec())  # 20 calls of 5 input and 11 output tokens
    r = _records(w.num_calls)
    r.usage[:] = True
    r.prompt_tokens[:] = 5
    r.prompt_tokens[:2] = 10  # +10 of 100 asked
    r.error[19] = TIMEOUT  # not completed: left out of both totals
    t = _summary(w, r).tokens
    assert (t.asked_prompt_tokens, t.prompt_tokens_reported) == (95, 105)
    assert (t.asked_output_tokens, t.output_tokens) == (209, 209)
    assert t.prompt_drift == pytest.approx(10 / 95) and t.output_drift == 0.0
    (line,) = _summary(w, r).warnings
    assert "prompt tokens are +10.5%" in line and "sent-trace.jsonl" in line
    r.prompt_tokens[:2] = 5
    r.prompt_tokens[2] = 6  # +1 of 95: within 2%
    assert _summary(w, r).warnings == []


def test_the_sent_trace_has_the_served_counts_in_send_order() -> None:
    """Rows by send time from the first send; served counts, asked where none came back."""
    w = compile_workload(_spec(duration=0.3))
    r = _records(w.num_calls)
    r.sent_s[:] = [0.5, 0.2, 0.3]
    r.prompt_tokens[:] = [7, -1, 9]
    r.error[2] = TIMEOUT
    rows = sent_rows(w, r)
    assert rows == [
        {"timestamp_s": 0.0, "input_tokens": 5, "output_tokens": 11},
        {"timestamp_s": pytest.approx(0.1), "input_tokens": 9, "output_tokens": 11},
        {"timestamp_s": pytest.approx(0.3), "input_tokens": 7, "output_tokens": 11},
    ]
