"""Fit a workload to a trace: its rate profile, its burstiness and its joint token lengths.

The fitted workload has one source whose arrivals are a piecewise-constant ``schedule``
(the trace's counts per ``bin_s`` window) with renewal gaps of the CV the trace shows once
the rate profile is taken out (time-rescaled gaps: ``Λ(t[i+1]) − Λ(t[i])``), and one
class whose tokens are a ``joint_tokens`` table of observed (input, output) pairs, so the
input/output correlation is kept. Quantised timestamps are spread over their tick before
the CV is measured, as a replay with ``tick_policy: auto`` would.

A trace records no promise, so the class gets :data:`DEFAULT_SLO` (or the one given):
without a latency bound every load meets the SLO and ``plan`` has no knee to find.
``headway trace fit`` says so in the file and on the terminal: it is a default to edit.
"""

from __future__ import annotations

import numpy as np

from headway.core.errors import TraceError
from headway.core.seeding import stream
from headway.core.trace_data import TraceData, detect_tick_s
from headway.core.workload.arrivals import RateProfile
from headway.core.workload.spec import (
    JointTokens,
    Schedule,
    Slo,
    Source,
    Step,
    TaskClass,
    Tenant,
    WorkloadSpec,
)

DEFAULT_SLO = Slo(ttft_s=2.0, tpot_s=0.1)
"""The fitted class's SLO unless one is given: first token within 2 s and 10 tokens/s
after it (an interactive chat's), 90% attainment. A placeholder for your promise."""


def rescaled_gap_cv(arrival_s: np.ndarray, profile: RateProfile) -> float:
    """CV of the gaps after mapping times through the cumulative rate ``Λ``."""
    cum = profile.cumulative()
    seg = np.clip(
        np.searchsorted(profile.edges_s, arrival_s, side="right") - 1,
        0,
        profile.rates_per_s.size - 1,
    )
    u = cum[seg] + (arrival_s - profile.edges_s[seg]) * profile.rates_per_s[seg]
    gaps = np.diff(u)
    if gaps.size < 2 or gaps.mean() <= 0:
        return 1.0
    return float(gaps.std() / gaps.mean())


def fit_workload(
    trace: TraceData,
    *,
    bin_s: float = 10.0,
    min_step_s: float | None = None,
    max_pairs: int = 4000,
    seed: int = 0,
    slo: Slo = DEFAULT_SLO,
) -> WorkloadSpec:
    """A workload whose compiled runs reproduce ``trace``'s rate profile and lengths, its
    class promised ``slo``. No step is shorter than ``min_step_s`` (default: half of
    ``bin_s``): a shorter last window is merged into the one before it."""
    n = len(trace)
    if n < 2:
        raise TraceError(f"trace {trace.name!r} has {n} request(s); fitting needs at least 2")
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0 (got {bin_s})")
    if min_step_s is not None and not 0 <= min_step_s <= bin_s:
        raise ValueError(f"min_step_s must be between 0 and bin_s {bin_s:g} (got {min_step_s})")
    times = trace.arrival_s.astype(np.float64)
    tick_s = detect_tick_s(times)
    if tick_s is not None:
        times = np.sort(times + stream(seed, "fit/ticks").uniform(0.0, tick_s, n))
    # The run lasts one mean gap past the last arrival; the last step may be short.
    duration_s = float(times[-1] - times[0]) * n / (n - 1)
    edges = np.append(np.arange(0.0, duration_s, bin_s), duration_s)
    min_step_s = bin_s / 2 if min_step_s is None else min_step_s
    while edges.size > 2 and edges[-1] - edges[-2] < min_step_s:
        # A partial last window (rows stamped at the trace's end fall into a sliver of a
        # bin: 3 rows in 2.4 ms read as 1,230 calls/s) joins the one before it.
        edges = np.delete(edges, -2)
    counts, _ = np.histogram(times - times[0], edges)
    widths = np.diff(edges)
    rates = np.array([float(f"{r:.6g}") for r in counts / widths])
    steps = [
        Step(duration_s=float(f"{w:.6g}"), rate_per_s=float(r))
        for w, r in zip(widths, rates, strict=True)
    ]
    cv = rescaled_gap_cv(times - times[0], RateProfile(edges, rates))
    rng = stream(seed, "fit/pairs")
    rows = np.arange(n) if n <= max_pairs else np.sort(rng.choice(n, max_pairs, replace=False))
    pairs = [
        (int(i), int(o))
        for i, o in zip(trace.input_tokens[rows], trace.output_tokens[rows], strict=True)
    ]
    tenants = {"default": Tenant()}
    if trace.tenant is not None:
        # Shares by token work (prompt plus output), not by request count: the share
        # divides capacity among tenants, and a tenant of many 1-token calls is light.
        names, _, _, work = trace.tenant_work()
        total = float(work.sum())
        tenants = {
            k: Tenant(share=round(float(w) / total, 6) if total > 0 else 1.0 / len(names))
            for k, w in zip(names, work, strict=True)
        }
    return WorkloadSpec(
        name=f"{trace.name}-fit",
        description=(
            f"Fitted by `headway trace fit` to {trace.name} ({n} requests over "
            f"{trace.arrival_s[-1]:.0f} s): a {bin_s:g} s rate schedule with gap CV {cv:.3g}"
            + (f" (timestamps spread over their {tick_s:.3g} s ticks)" if tick_s else "")
            + f", and {len(pairs)} observed (input, output) token pairs."
        ),
        seed=seed,
        duration_s=float(edges[-1]),
        classes={
            "trace": TaskClass(
                calls=1.0,
                joint_tokens=JointTokens(
                    pairs=pairs,
                    max_input_tokens=int(trace.input_tokens.max()) or None,
                    max_output_tokens=int(trace.output_tokens.max()) or None,
                ),
                slo=slo,
            )
        },
        sources=[
            Source(
                name=trace.name,
                arrivals=Schedule(steps=steps, cv=round(cv, 4), repeat=False),
                mix={"trace": 1.0},
            )
        ],
        tenants=tenants,
    )
