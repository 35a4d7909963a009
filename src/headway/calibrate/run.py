"""Calibrate an endpoint: probe it, fit the step-time model, build the profile.
The library entry point of ``headway calibrate``."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable
from dataclasses import asdict

from headway.calibrate.fit import collect_samples, fit_step_time
from headway.calibrate.plan import DEFAULT_PLAN, ProbePlan, ProbeShape
from headway.calibrate.probe import run_probes
from headway.calibrate.profile import FitSummary, Profile

__all__ = ["calibrate"]


def calibrate(
    target: str,
    *,
    plan: ProbePlan = DEFAULT_PLAN,
    model: str | None = None,
    time_scale: float | None = None,
    hardware: str = "",
    progress: Callable[[int, int, ProbeShape], None] | None = None,
) -> Profile:
    """Probe ``target`` with ``plan`` and fit a profile.

    ``time_scale`` converts measured wall seconds to engine seconds; ``None`` takes the
    endpoint's own (an emulator's ``speedup`` from ``/version``), else 1.
    """
    started = time.perf_counter()
    info, results = asyncio.run(run_probes(target, plan, model=model, progress=progress))
    scale = time_scale if time_scale is not None else info.time_scale
    samples = collect_samples(results, plan, scale)
    fit = fit_step_time(samples)
    return Profile(
        model=info.model,
        engine=info.engine,
        hardware=hardware or info.hardware,
        created_utc=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        target=target,
        step_time=fit.step_time,
        request_overhead_s=fit.request_overhead_s,
        fit=FitSummary(
            num_ttft_samples=len(samples.ttft),
            num_gap_samples=len(samples.gaps),
            rms_relative_error=fit.rms_relative_error,
            max_relative_error=fit.max_relative_error,
            num_discarded_probes=samples.num_discarded_probes,
            time_scale=scale,
            wall_s=time.perf_counter() - started,
        ),
        plan={k: list(v) if isinstance(v, tuple) else v for k, v in asdict(plan).items()},
    )
