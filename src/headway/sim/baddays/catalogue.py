"""The named bad days and :func:`get_scenario`, which finds one by name (``a+b`` composes).

They are seed 002's list ("one provider or replica pool unavailable; cache cold after
deploy; prompts twice normal length; retry storm from a downstream timeout; large tenant
burst; autoscaler delayed; tool latency feeding back into agent concurrency"):

============================  ============================================================
``baseline``                  nothing changed
``replica-lost-prefill``      half the replicas (at least one, one survives) fail at a third
                              of the run, at a step with prefill work
``replica-lost-decode``       the same, at a decode-only step
``cache-cold``                prefix caches flushed at the start and after a deploy mid-run
``long-prompts``              every class's prompts twice as long
``retry-storm``               steps 3× slower for a window; clients time out and retry with
                              no retry budget
``tenant-burst``              the largest tenant sends 5× its rate for a window
``autoscaler``                the reference for ``autoscaler-delayed``: the cluster's
                              autoscaler, or a default one, on time
``autoscaler-delayed``        the same autoscaler, detecting and starting replicas 3× later
``burst-autoscaler-delayed``  the tenant's burst met by the late autoscaler (issue 20: the
                              day the predictive autoscaler is measured on)
``slow-tool``                 tool calls (and downstream services) 5× slower
============================  ============================================================
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from headway.core.errors import ConfigError
from headway.core.workload.spec import WorkloadSpec
from headway.sim.baddays.scenario import Scenario, compose
from headway.sim.baddays.transforms import (
    autoscaler_delayed,
    autoscaler_on_time,
    cache_cold,
    long_prompts,
    replica_lost,
    retry_storm,
    slow_tool,
    tenant_burst,
    unchanged,
)
from headway.sim.cluster import ClusterSpec


def _burst_then_late(spec: WorkloadSpec, cluster: ClusterSpec) -> tuple[WorkloadSpec, ClusterSpec]:
    """``burst-autoscaler-delayed``: ``tenant-burst``, then ``autoscaler-delayed``."""
    return autoscaler_delayed(*tenant_burst(spec, cluster))


_ALL: tuple[Scenario, ...] = (
    Scenario("baseline", "nothing changed", "Nothing.", unchanged),
    Scenario(
        "replica-lost-prefill",
        "half the replicas lost while they run prefill work",
        "Adds a `replica_lost` fault at a third of the run, `phase: prefill`, losing half "
        "the replicas (at least one; a one-replica cluster gets a second replica so that "
        "one survives).",
        replica_lost("prefill"),
    ),
    Scenario(
        "replica-lost-decode",
        "half the replicas lost while they run decode-only steps",
        "Adds a `replica_lost` fault at a third of the run, `phase: decode`, losing half "
        "the replicas (at least one; a one-replica cluster gets a second replica so that "
        "one survives).",
        replica_lost("decode"),
    ),
    Scenario(
        "cache-cold",
        "prefix caches cold after a deploy",
        "Adds `cache_flush` faults at the start and half way through the run (a deploy "
        "that restarts the engines).",
        cache_cold,
    ),
    Scenario(
        "long-prompts",
        "prompts twice their normal length",
        "Multiplies every class's `input_tokens` (values and `min`/`max` caps) and "
        "`joint_tokens` prompts by 2; `max_tokens` and outputs are unchanged (token "
        "counts replayed from a trace are not scaled).",
        long_prompts,
    ),
    Scenario(
        "retry-storm",
        "retry storm after a downstream timeout",
        "Adds a `slowdown` fault (steps 3× longer) from a third of the run for a quarter "
        "of it; clients time out an attempt with no first token after "
        "`clients.retries.timeout_s` (the workload's, else 2× the loosest `ttft_s`) and "
        "retry with at least 3 attempts and no retry budget (`budget_ratio: null`).",
        retry_storm,
    ),
    Scenario(
        "tenant-burst",
        "the largest tenant bursting",
        "Adds, for each source of the tenant with the highest mean task rate, a source "
        "of its traffic alone that raises its rate to 5× its mean from a third of the "
        "run for a quarter of it.",
        tenant_burst,
    ),
    Scenario(
        "autoscaler",
        "an autoscaler on time (the reference for autoscaler-delayed)",
        "Keeps the cluster's `autoscaler`; without one, adds the default autoscaler "
        "(queue delay, target 1 s) between replicas − 1 and 2 × replicas, its timings "
        "scaled to the run (× min(1, duration_s / 600 s)).",
        autoscaler_on_time,
    ),
    Scenario(
        "autoscaler-delayed",
        "the autoscaler detecting and starting replicas late",
        "The autoscaler of `autoscaler`, with `detection_delay_s` and `startup_delay_s` "
        "multiplied by 3.",
        autoscaler_delayed,
    ),
    Scenario(
        "burst-autoscaler-delayed",
        "the largest tenant bursting while the autoscaler is late",
        "`tenant-burst`, then `autoscaler-delayed` (the same as "
        "`tenant-burst+autoscaler-delayed`).",
        _burst_then_late,
    ),
    Scenario(
        "slow-tool",
        "a slow external tool feeding back into agent concurrency",
        "Multiplies `tool_latency_s` of every class with tool calls, and every service's "
        "`service_time_s`, by 5 (service timeouts unchanged).",
        slow_tool,
    ),
)

SCENARIOS: Mapping[str, Scenario] = {s.name: s for s in _ALL}
"""Every scenario by name, in the matrix's default order."""

DEFAULT_SCENARIOS: tuple[str, ...] = tuple(SCENARIOS)
"""The scenarios a matrix runs by default: all of them."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``did you mean 'x'? `` for the known name that starts with ``name`` or is closest
    to it, or nothing."""
    names = list(known)
    close = [k for k in names if name and k.startswith(name)]
    close = close or difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ``a+b`` composes ``a`` then ``b``. Unknown names raise
    :class:`ConfigError` with the closest known name."""
    parts = [p.strip() for p in name.split("+")]
    found = []
    for part in parts:
        scenario = SCENARIOS.get(part)
        if scenario is None:
            raise ConfigError(
                f"unknown bad-day scenario {part!r}; {did_you_mean(part, SCENARIOS)}choose from "
                f"{', '.join(SCENARIOS)} (join names with + to compose them)"
            )
        found.append(scenario)
    return compose(*found)
