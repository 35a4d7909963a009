"""A seeded synthetic multi-tenant trace, shaped like the busy hour of issue 17: a dominant
light tenant of ~1-token answers (Poisson), a bursty heavy tenant (on/off bursts of long
prompts and answers) and a long tail of small steady tenants."""

from __future__ import annotations

import numpy as np

from headway.core.trace_data import TraceData


def tenant_trace(
    *, seed: int = 7, duration_s: float = 600.0, light_rate_per_s: float = 8.0,
    burst_rate_per_s: float = 6.0, tail_tenants: int = 20, tail_rate_per_s: float = 0.06,
) -> TraceData:  # fmt: skip
    """The trace: arrivals over ``[0, duration_s]``, the last row stamped at the end."""
    rng = np.random.default_rng(seed)
    times: list[np.ndarray] = []
    inputs: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    tenants: list[np.ndarray] = []

    def add(name: str, t: np.ndarray, inp: np.ndarray, out: np.ndarray) -> None:
        times.append(t)
        inputs.append(np.maximum(inp.astype(np.int64), 1))
        outputs.append(np.maximum(out.astype(np.int64), 1))
        tenants.append(np.full(t.size, name, dtype=object))

    n = rng.poisson(light_rate_per_s * duration_s)
    add(
        "light",
        np.sort(rng.uniform(0, duration_s, n)),
        rng.lognormal(np.log(300), 0.4, n),
        rng.choice([1, 1, 1, 2], n),
    )
    # Bursts of ~5 s every ~25 s on average (exponential gaps: irregular, as in production).
    bursty: list[np.ndarray] = []
    start = rng.exponential(20.0)
    while start < duration_s:
        on_s = min(rng.exponential(5.0), duration_s - start)
        bursty.append(np.sort(start + rng.uniform(0, on_s, rng.poisson(burst_rate_per_s * on_s))))
        start += on_s + rng.exponential(20.0)
    t = np.concatenate(bursty)
    add(
        "bursty",
        t,
        rng.lognormal(np.log(1500), 0.3, t.size),
        rng.lognormal(np.log(300), 0.5, t.size),
    )
    for k in range(tail_tenants):
        n = rng.poisson(tail_rate_per_s * duration_s)
        add(
            f"tail-{k:02d}",
            np.sort(rng.uniform(0, duration_s, n)),
            rng.lognormal(np.log(500), 0.8, n),
            rng.lognormal(np.log(80), 0.8, n),
        )
    arrival = np.concatenate(times)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    arrival[-1] = duration_s  # cropped to an exact window: the last row at its end stamp
    return TraceData(
        name="tenants",
        kind="generic",
        arrival_s=arrival - arrival[0],
        input_tokens=np.concatenate(inputs)[order],
        output_tokens=np.concatenate(outputs)[order],
        tenant=np.concatenate(tenants)[order],
    )
