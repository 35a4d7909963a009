"""Fit a workload to a trace: its rate profile, its burstiness and its joint token lengths.

Each large tenant of the trace (at least ``min_tenant_share`` of its requests or of its
token work, up to ``max_tenants``) gets its own source and class; the other tenants are
pooled into one (a trace without a tenant column is one pool). A pool's source has a
piecewise-constant ``schedule`` (its counts per ``bin_s`` window) with renewal gaps of the
CV its arrivals show once that rate profile is taken out (time-rescaled gaps:
``Λ(t[i+1]) − Λ(t[i])``), and its class a ``joint_tokens`` table of its observed (input,
output) pairs, so the input/output correlation is kept and a tenant of 1-token calls keeps
its 1-token calls. Quantised timestamps are spread over their tick before the CV is
measured, as a replay with ``tick_policy: auto`` would. Tenants' ``share`` (what their
budgets divide) is their share of the token work.

A trace records no promise, so each class gets :data:`DEFAULT_SLO` (or the one given):
without a latency bound every load meets the SLO and ``plan`` has no knee to find.
``headway trace fit`` says so in the file and on the terminal: it is a default to edit.
:func:`fit_quality` compiles the fitted workload and sets its per-tenant statistics beside
the trace's, so the user sees what the fit kept and what it lost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headway.core.errors import TraceError
from headway.core.seeding import stream
from headway.core.trace_data import TenantWork, TraceData, detect_tick_s
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

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

DEFAULT_SLO = Slo(ttft_s=2.0, tpot_s=0.1)
"""Each fitted class's SLO unless one is given: first token within 2 s and 10 tokens/s
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


MIN_TENANT_SHARE = 0.05
"""A tenant with at least this share of the requests or of the token work is fitted on
its own; smaller ones are pooled."""
MAX_TENANTS = 10
"""At most this many tenants are fitted on their own (the largest by token work)."""
TAIL = "other-tenants"
"""The pooled tenants' source and class (suffixed with ``_`` should a tenant be so named)."""


@dataclass(frozen=True, slots=True)
class _Pool:
    """Requests fitted together: one large tenant, or the pooled rest."""

    name: str
    rows: IntArray
    tenants: dict[str, float] | None
    """The source's tenants and their request shares (None: no tenant column)."""
    pooled: bool = False
    """Several tenants (or a trace without tenants) fitted as one."""


def fit_workload(
    trace: TraceData,
    *,
    bin_s: float = 10.0,
    min_step_s: float | None = None,
    max_pairs: int = 4000,
    seed: int = 0,
    slo: Slo = DEFAULT_SLO,
    min_tenant_share: float = MIN_TENANT_SHARE,
    max_tenants: int = MAX_TENANTS,
    tenant_target: float | None = None,
) -> WorkloadSpec:
    """A workload whose compiled runs reproduce ``trace``'s rate profile and lengths, tenant
    by tenant, each class promised ``slo``. No step is shorter than ``min_step_s``
    (default: half of ``bin_s``): a shorter last window is merged into the one before it.
    Each pool keeps at most ``max_pairs`` token pairs. ``tenant_target``: the
    ``attainment_target`` of each tenant fitted on its own (the plan then sizes for the
    worst of them; None: none)."""
    n = len(trace)
    if n < 2:
        raise TraceError(f"trace {trace.name!r} has {n} request(s); fitting needs at least 2")
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0 (got {bin_s})")
    if min_step_s is not None and not 0 <= min_step_s <= bin_s:
        raise ValueError(f"min_step_s must be between 0 and bin_s {bin_s:g} (got {min_step_s})")
    if not 0 < min_tenant_share <= 1:
        raise ValueError(f"min_tenant_share must be in (0, 1] (got {min_tenant_share})")
    if max_tenants < 0:
        raise ValueError(f"max_tenants must be >= 0 (got {max_tenants})")
    if tenant_target is not None and not 0 < tenant_target <= 1:
        raise ValueError(f"tenant_target must be in (0, 1] (got {tenant_target})")
    times = trace.arrival_s.astype(np.float64)
    tick_s = detect_tick_s(times)
    if tick_s is not None:  # spread in place: row i stays request i (pools index rows)
        times = times + stream(seed, "fit/ticks").uniform(0.0, tick_s, n)
    times = times - times.min()
    # The run lasts one mean gap past the last arrival; the last step may be short.
    duration_s = float(times.max()) * n / (n - 1)
    min_step_s = bin_s / 2 if min_step_s is None else min_step_s
    edges = _edges(duration_s, bin_s, min_step_s)
    counts, _ = np.histogram(times, edges)
    peak_per_s = float((counts / np.diff(edges)).max())
    classes: dict[str, TaskClass] = {}
    sources: list[Source] = []
    cvs: list[float] = []
    bins: list[float] = []
    pairs_kept = 0
    by_tenant = None if trace.tenant is None else trace.tenant_work()
    pools = _pools(len(trace), by_tenant, min_tenant_share, max_tenants)
    for pool in pools:
        steps, cv, pool_bin_s = _schedule(np.sort(times[pool.rows]), duration_s, bin_s, min_step_s)
        cvs.append(cv)
        bins.append(pool_bin_s)
        rng = stream(seed, f"fit/pairs/{pool.name}")
        rows = pool.rows
        if rows.size > max_pairs:
            rows = np.sort(rng.choice(rows, max_pairs, replace=False))
        pairs = [
            (int(i), int(o))
            for i, o in zip(trace.input_tokens[rows], trace.output_tokens[rows], strict=True)
        ]
        pairs_kept += len(pairs)
        classes[pool.name] = TaskClass(
            calls=1.0,
            joint_tokens=JointTokens(
                pairs=pairs,
                max_input_tokens=int(trace.input_tokens[pool.rows].max()) or None,
                max_output_tokens=int(trace.output_tokens[pool.rows].max()) or None,
            ),
            slo=slo,
        )
        sources.append(
            Source(
                name=trace.name if pool.tenants is None else f"{trace.name}/{pool.name}",
                arrivals=Schedule(steps=steps, cv=round(cv, 4), repeat=False),
                mix={pool.name: 1.0},
                tenants=pool.tenants,
                # Its share of the trace's peak (the most calls in a bin_s window): the
                # plan sizes for every source at its peak at once, and the pools' own
                # peaks (10 s apart, or a burst's second) would add up past the trace's.
                peak_rate_per_s=float(f"{peak_per_s * pool.rows.size / n:.6g}"),
            )
        )
    tenants = {"default": Tenant()}
    if by_tenant is not None:
        # Shares by token work (prompt plus output), not by request count: the share
        # divides capacity among tenants, and a tenant of many 1-token calls is light.
        names, _, _, work = by_tenant
        total = float(work.sum())
        targeted = {p.name for p in pools if not p.pooled}
        tenants = {
            k: Tenant(
                share=round(float(w) / total, 6) if total > 0 else 1.0 / len(names),
                attainment_target=tenant_target if k in targeted else None,
            )
            for k, w in zip(names, work, strict=True)
        }
    alone = sum(not pool.pooled for pool in pools)
    per = (
        f"a source per large tenant ({alone} fitted alone, {len(pools) - alone} pool of the "
        "rest), each with"
        if trace.tenant is not None
        else "one source with"
    )
    return WorkloadSpec(
        name=f"{trace.name}-fit",
        description=(
            f"Fitted by `headway trace fit` to {trace.name} ({n} requests over "
            f"{trace.arrival_s[-1] - trace.arrival_s[0]:.0f} s): {per} a rate schedule "
            f"({_span(bins, 's')} steps) with gap CV {_span(cvs, '')}"
            + (f" (timestamps spread over their {tick_s:.3g} s ticks)" if tick_s else "")
            + f", and {pairs_kept} observed (input, output) token pairs."
        ),
        seed=seed,
        duration_s=float(edges[-1]),
        classes=classes,
        sources=sources,
        tenants=tenants,
    )


BURSTY_CV = 1.5
"""A pool whose gaps, the rate profile taken out, have a CV above this is bursty within
its steps: its steps are halved (down to :data:`FINEST_BIN_FRACTION` of ``bin_s``) until
the schedule holds its bursts. Renewal gaps of a high CV would clump its calls at random
instead, far harsher than the trace's bursts."""
FINEST_BIN_FRACTION = 1 / 8


def _edges(duration_s: float, bin_s: float, min_step_s: float) -> FloatArray:
    """Step edges every ``bin_s`` over the run, none shorter than ``min_step_s``."""
    edges = np.append(np.arange(0.0, duration_s, bin_s), duration_s)
    while edges.size > 2 and edges[-1] - edges[-2] < min_step_s:
        # A partial last window (rows stamped at the trace's end fall into a sliver of a
        # bin: 3 rows in 2.4 ms read as 1,230 calls/s) joins the one before it.
        edges = np.delete(edges, -2)
    return edges


def _schedule(
    times: FloatArray, duration_s: float, bin_s: float, min_step_s: float
) -> tuple[list[Step], float, float]:
    """A pool's steps, its rescaled gap CV and its step width (see :data:`BURSTY_CV`)."""
    width_s = bin_s
    while True:
        edges = _edges(duration_s, width_s, min_step_s * width_s / bin_s)
        counts, _ = np.histogram(times, edges)
        widths = np.diff(edges)
        rates = np.array([float(f"{r:.6g}") for r in counts / widths])
        cv = rescaled_gap_cv(times, RateProfile(edges, rates))
        if cv <= BURSTY_CV or width_s / 2 < bin_s * FINEST_BIN_FRACTION:
            break
        width_s /= 2
    steps = [
        Step(duration_s=float(f"{w:.6g}"), rate_per_s=float(r))
        for w, r in zip(widths, rates, strict=True)
    ]
    return steps, cv, width_s


def _span(values: list[float], unit: str) -> str:
    low, high = min(values), max(values)
    return f"{low:.3g}{unit}" if low == high else f"{low:.3g}..{high:.3g}{unit}"


def _pools(n: int, by_tenant: TenantWork | None, min_share: float, max_tenants: int) -> list[_Pool]:
    """The large tenants, each alone (largest token work first), then the rest pooled
    (``by_tenant``: the trace's :meth:`~TraceData.tenant_work`; None: no tenant column,
    one pool of all ``n`` requests)."""
    if by_tenant is None:
        return [_Pool("trace", np.arange(n, dtype=np.int64), None, pooled=True)]
    names, index, requests, work = by_tenant
    request_share = requests / requests.sum()
    work_share = work / work.sum() if work.sum() > 0 else np.zeros(len(names))
    large = [
        i
        for i in np.argsort(-work_share, kind="stable").tolist()
        if request_share[i] >= min_share or work_share[i] >= min_share
    ][:max_tenants]
    pools = [
        _Pool(names[i], np.flatnonzero(index == i).astype(np.int64), {names[i]: 1.0}) for i in large
    ]
    rest = [i for i in range(len(names)) if i not in set(large)]
    if rest:
        tail = TAIL
        while tail in names:
            tail += "_"
        rows = np.flatnonzero(np.isin(index, rest)).astype(np.int64)
        total = float(requests[rest].sum())
        pools.append(
            _Pool(
                tail,
                rows,
                {names[i]: round(float(requests[i]) / total, 6) for i in rest},
                pooled=True,
            )
        )
    return pools
