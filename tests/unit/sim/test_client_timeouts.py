"""Client timeouts: an attempt with no first token in time is abandoned and retried.

This is the retry storm of seed 000: at saturation every attempt waits past the
clients' timeout, so without a retry budget each call is sent ``max_attempts`` times;
the budget caps the extra load at its ratio.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import OUTCOMES, SimOptions, SimOutcome

_CAPACITY_PER_S = 14.0
"""Calls of 512 + 128 tokens one Llama-2-7B replica on an A100 completes per second."""


def _simulate(
    retries: dict[str, Any],
    *,
    gateway: str = "fifo-unbounded",
    rate_per_s: float = 2 * _CAPACITY_PER_S,
    idempotent: bool = True,
    skip_decode: bool = True,
) -> tuple[CompiledWorkload, SimResult, SimOutcome]:
    data = {
        "name": "timeouts",
        "duration_s": 40,
        "classes": {"fixed": {"input_tokens": 512, "output_tokens": 128, "idempotent": idempotent}},
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}}],
        "clients": {"retries": retries},
    }
    cluster = {
        "replicas": 1,
        "model": "llama-2-7b",
        "gpu": "a100",
        "num_kv_blocks": 7424,
        "engine": {"max_num_seqs": 128, "enable_chunked_prefill": False},
        "gateway": {"preset": gateway},
    }
    w = compile_workload(parse_workload(data), seed=5)
    options = SimOptions(skip_decode=skip_decode, check_invariants=not skip_decode)
    result, out = simulate_compiled(w, parse_cluster(cluster), options)
    return w, result, out


_STORM = {"max_attempts": 3, "timeout_s": 2.0, "backoff_base_s": 0.2}


def test_without_a_budget_a_timeout_storm_multiplies_the_offered_load() -> None:
    w, result, out = _simulate({**_STORM, "budget_ratio": None})
    c, acc = out.calls, result.accounting
    assert acc.balanced and acc.offered_calls == w.num_calls
    assert acc.amplification >= 2.0
    assert c.attempts.max() == 3
    # A call given up after its last attempt timed out is `timed_out`, at its timeout.
    timed_out = c.outcome == OUTCOMES.index("timed_out")
    assert timed_out.any() and (c.attempts[timed_out] == 3).all()
    assert not (c.first_token_s[timed_out] <= c.finish_s[timed_out]).any()


def test_the_retry_budget_caps_the_storm_at_its_ratio() -> None:
    _, result, _ = _simulate({**_STORM, "budget_ratio": 0.1})
    acc = result.accounting
    assert acc.balanced
    retries = acc.attempts - acc.offered_calls
    windows = 40 / 10 + 1  # budget_min_retries (3) per window of 10 s
    assert 0 < retries <= 0.1 * acc.offered_calls + 3 * windows
    assert acc.amplification <= 1.1 + 3 * windows / acc.offered_calls


def test_a_stream_that_started_is_never_retried_and_fast_calls_are_not_timed_out() -> None:
    # Below capacity every first token comes well within the timeout: nobody retries.
    _, result, out = _simulate({**_STORM, "budget_ratio": None}, rate_per_s=0.3 * _CAPACITY_PER_S)
    assert result.accounting.amplification == 1.0
    assert (out.calls.outcome == OUTCOMES.index("completed")).all()
    # At saturation, a completed call's first token came within its last attempt's
    # timeout (an attempt that had streamed a token is never abandoned).
    _, _, out = _simulate({**_STORM, "budget_ratio": None})
    c = out.calls
    done = c.outcome == OUTCOMES.index("completed")
    assert done.any()
    assert (c.first_token_s[done] - c.dispatch_s[done] <= _STORM["timeout_s"] + 1e-9).all()


def test_non_idempotent_calls_are_not_retried_after_a_timeout() -> None:
    _, result, out = _simulate({**_STORM, "budget_ratio": None}, idempotent=False)
    assert result.accounting.amplification == 1.0
    assert (out.calls.outcome == OUTCOMES.index("timed_out")).any()


@pytest.mark.parametrize("gateway", ["fifo-unbounded", "headway-default"])
def test_timeouts_and_retries_give_the_same_records_step_by_step(gateway: str) -> None:
    retries = {**_STORM, "budget_ratio": None}
    _, _, skipped = _simulate(retries, gateway=gateway, rate_per_s=1.5 * _CAPACITY_PER_S)
    _, _, stepped = _simulate(
        retries, gateway=gateway, rate_per_s=1.5 * _CAPACITY_PER_S, skip_decode=False
    )
    a, b = skipped.calls, stepped.calls
    np.testing.assert_array_equal(a.outcome, b.outcome)
    np.testing.assert_array_equal(a.attempts, b.attempts)
    np.testing.assert_allclose(a.first_token_s, b.first_token_s, rtol=1e-9)
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=1e-9)
