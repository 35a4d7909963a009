"""Simulated clients: retries of shed calls (the core RetryPolicy) and patience."""

from __future__ import annotations

from typing import Any

import numpy as np

from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import OUTCOMES, SimOutcome

_CAPACITY_PER_S = 14.0
"""Calls of 512 + 128 tokens one Llama-2-7B replica on an A100 completes per second."""


def _simulate(
    clients: dict[str, Any],
    gateway: str,
    rate_per_s: float = 3 * _CAPACITY_PER_S,
    *,
    budget: dict[str, float] | None = None,
) -> tuple[CompiledWorkload, SimResult, SimOutcome]:
    """``budget``: every call is tenant ``t``'s, with these token-budget limits (its
    calls' ``max_tokens`` their output, 128, so that the gateway charges 640 a call)."""
    data: dict[str, Any] = {
        "name": "clients",
        "duration_s": 60,
        "classes": {"fixed": {"input_tokens": 512, "output_tokens": 128}},
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}}],
        "clients": clients,
    }
    cluster: dict[str, Any] = {
        "replicas": 1,
        "model": "llama-2-7b",
        "gpu": "a100",
        "num_kv_blocks": 7424,
        "engine": {"max_num_seqs": 128, "enable_chunked_prefill": False},
        "gateway": {"preset": gateway},
    }
    if budget is not None:
        data["classes"]["fixed"]["max_tokens"] = 128
        data["sources"][0]["tenants"] = {"t": 1.0}
        data["tenants"] = {"t": {}}
        cluster["gateway"]["admission"] = {"tenants": {"t": budget}}
    w = compile_workload(parse_workload(data), seed=11)
    result, out = simulate_compiled(w, parse_cluster(cluster))
    return w, result, out


def test_shed_calls_are_retried_after_retry_after_within_the_budget() -> None:
    retries = {"max_attempts": 3, "backoff_base_s": 0.5, "honour_retry_after": True}
    w, result, out = _simulate({"retries": retries}, "headway-default")
    _, once, _ = _simulate({}, "headway-default")
    c = out.calls
    acc = result.accounting
    assert acc.balanced and acc.offered_calls == w.num_calls
    assert once.accounting.amplification == 1.0
    # Retries happened, each a new attempt of the same call, at most max_attempts each.
    assert c.attempts.max() <= 3 and c.attempts.min() == 1
    assert acc.attempts == int(c.attempts.sum()) > acc.offered_calls
    assert acc.amplification == acc.attempts / acc.offered_calls > 1.0
    # The retry budget (10% of requests per 10 s window, at least 3) bounds the storm.
    retries_made = acc.attempts - acc.offered_calls
    windows = 60 / 10 + 1
    assert retries_made <= 0.1 * acc.offered_calls + 3 * windows
    # Retry tickets: a client that waited out its Retry-After is let in on its first retry.
    retried = c.attempts >= 2
    first_retry_done = retried & (c.attempts == 2) & (c.outcome == OUTCOMES.index("completed"))
    assert first_retry_done.sum() >= 0.9 * retried.sum()
    # A call served after a shed waited at least the retry_after it was given.
    served_after_shed = (c.outcome == OUTCOMES.index("completed")) & np.isfinite(c.retry_after_s)
    assert served_after_shed.any()
    waited = c.dispatch_s[served_after_shed] - c.arrival_s[served_after_shed]
    assert (waited >= c.retry_after_s[served_after_shed] - 1e-9).all()


def test_impatient_clients_cancel_calls_without_a_first_token() -> None:
    patience_s = 5.0
    w, result, out = _simulate({"patience_s": patience_s}, "fifo-unbounded")
    c = out.calls
    acc = result.accounting
    cancelled = c.outcome == OUTCOMES.index("cancelled")
    assert acc.balanced and acc.cancelled == acc.cancelled_by_patience == int(cancelled.sum())
    assert acc.cancelled > 0.3 * w.num_calls
    # Cancelled exactly when patience ran out, with no token delivered by then.
    np.testing.assert_allclose(c.finish_s[cancelled], c.arrival_s[cancelled] + patience_s)
    first = c.first_token_s[cancelled]
    assert not (first <= c.arrival_s[cancelled] + patience_s).any()
    # Every completed call had its first token within the client's patience.
    completed = c.outcome == OUTCOMES.index("completed")
    assert (c.first_token_s[completed] - c.arrival_s[completed] <= patience_s).all()
    # Abandoned calls were aborted in the engine (the cancel path that frees KV at once).
    assert result.engine.cancelled_calls == acc.cancelled
    # Without patience (the default) nobody gives up.
    _, patient, _ = _simulate({}, "fifo-unbounded")
    assert patient.accounting.cancelled == 0


def test_a_budget_refusal_past_its_promisable_turns_is_retried_on_the_clients_backoff() -> None:
    # One tenant offers about 4x its token budget (640 tokens a call, 2,000 tokens/s, a
    # 10 s bucket): its bucket can promise turns to only some of its refusals. Those get a
    # Retry-After and a ticket, and their retries get in; the rest name no time (the
    # gateway's 429 without Retry-After), and their clients retry on their own backoff
    # instead of giving up as if no retry could help.
    w, result, out = _simulate(
        {"retries": {"max_attempts": 3, "budget_ratio": 1.0}},
        "headway-default",
        12.0,
        budget={"token_rate_per_s": 2000.0, "burst_s": 10.0},
    )
    c = out.calls
    assert result.accounting.balanced
    assert set(result.accounting.shed_by_reason) == {"tenant_token_rate"}
    assert (np.isfinite(c.first_retry_after_s) | (c.attempts >= 2)).sum() > 0.5 * w.num_calls
    named = (c.attempts >= 2) & np.isfinite(c.first_retry_after_s)
    unnamed = (c.attempts >= 2) & np.isnan(c.first_retry_after_s)
    assert named.sum() > 20 and unnamed.sum() > 20
    completed = c.outcome == OUTCOMES.index("completed")
    # A named time is a kept turn: the retry that waited it out is let in.
    assert (named & completed & (c.attempts == 2)).sum() >= 0.9 * named.sum()
    waited = c.dispatch_s[named & completed] - c.arrival_s[named & completed]
    assert (waited >= c.first_retry_after_s[named & completed] - 1e-9).all()
