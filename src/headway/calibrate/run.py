"""Calibrate an endpoint: probe it, fit the step-time model, judge the fit, build the
profile. The library entry point of ``headway calibrate``."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

from headway.calibrate.engine_settings import with_flags
from headway.calibrate.fit import (
    bootstrap_intervals,
    disturbed,
    fit_step_time,
    pool,
    probe_samples,
)
from headway.calibrate.plan import DEFAULT_PLAN, ProbePlan, ProbeShape
from headway.calibrate.probe import ProbeResult, run_probes
from headway.calibrate.profile import FitSummary, ParameterFit, Profile
from headway.calibrate.trust import (
    DEFAULT_LIMITS,
    TrustLimits,
    ci_impacts,
    problems,
    reference_drift,
)

__all__ = ["calibrate"]


def calibrate(
    target: str,
    *,
    plan: ProbePlan = DEFAULT_PLAN,
    model: str | None = None,
    time_scale: float | None = None,
    hardware: str = "",
    progress: Callable[[int, int, ProbeShape], None] | None = None,
    limits: TrustLimits = DEFAULT_LIMITS,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    resamples: int = 200,
) -> Profile:
    """Probe ``target`` with ``plan``, fit a profile and check it against ``limits``
    (``profile.fit.problems`` lists what failed; empty when it can be trusted).

    ``time_scale`` converts measured wall seconds to engine seconds; ``None`` takes the
    endpoint's own (an emulator's ``speedup`` from ``/version``), else 1. The engine's
    step budget is what it exposes, else ``max_num_batched_tokens``, else the plan's.
    """
    started = time.perf_counter()

    def reference_disturbed(result: ProbeResult, endpoint_scale: float) -> bool:
        scale = time_scale if time_scale is not None else endpoint_scale
        return disturbed(result, plan, scale)

    info, results = asyncio.run(
        run_probes(
            target,
            plan,
            model=model,
            progress=progress,
            for_fit=True,
            disturbed=reference_disturbed,
        )
    )
    settings = with_flags(
        info.engine_settings,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    if settings.max_num_batched_tokens is not None:
        plan = dataclasses.replace(plan, max_num_batched_tokens=settings.max_num_batched_tokens)
    scale = time_scale if time_scale is not None else info.time_scale
    probes = probe_samples(results, plan, scale)
    samples = pool(probes)
    fit = fit_step_time(samples)
    intervals = bootstrap_intervals(probes, resamples=resamples)
    impacts = ci_impacts(intervals, fit.leverage)
    values = fit.coefficients
    steps_s, drift = reference_drift(probes)
    frontends = [
        r.ttft_split.frontend_s * scale
        for r in results
        if r.shape.kind == "prefill" and r.ttft_split is not None
    ]
    return Profile(
        model=info.model,
        engine=info.engine,
        hardware=hardware or info.hardware,
        created_utc=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        target=target,
        step_time=fit.step_time,
        engine_settings=settings,
        fit=FitSummary(
            num_ttft_samples=len(samples.ttft),
            num_gap_samples=len(samples.gaps),
            rms_relative_error=fit.rms_relative_error,
            max_relative_error=fit.max_relative_error,
            num_discarded_probes=samples.num_discarded_probes,
            time_scale=scale,
            wall_s=time.perf_counter() - started,
            num_rounds=plan.rounds,
            parameters={
                name: ParameterFit(
                    value=values[name],
                    ci_low=intervals[name][0],
                    ci_high=intervals[name][1],
                    ci_impact=impacts[name],
                )
                for name in values
            },
            reference_step_s=steps_s,
            drift=drift,
            num_reference_reruns=sum(1 for r in results if r.attempt > 0),
            frontend_s=statistics.median(frontends) if frontends else None,
            problems=problems(
                steps_s=steps_s,
                drift=drift,
                intervals=intervals,
                impacts=impacts,
                values=values,
                limits=limits,
            ),
        ),
        plan={k: list(v) if isinstance(v, tuple) else v for k, v in asdict(plan).items()},
    )
