"""Parity of the emulator with the simulator: one workload through ``headway simulate``
and through ``headway emulate`` + ``headway bench``, compared.

Both run the same step-time profile and engine settings. The emulator runs ``speedup``
times faster than real time, so the bench sends the workload compressed by ``speedup``
(rates × speedup, duration ÷ speedup) and its latencies are scaled back into engine time.
TTFT measured over HTTP also holds the client's and the server's own time (about a
millisecond of wall time, × ``speedup`` in engine time), which the simulator does not model.
"""

from __future__ import annotations

import json
import re
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from headway.calibrate.profile import PROFILE_FORMAT
from headway.core.engine.steptime import AffineStepTime
from headway.core.workload.spec import WorkloadSpec
from headway.emulate.process import EmulatorProcess

__all__ = ["ParityResult", "compare_simulate_emulate", "relative_difference"]

METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "throughput_requests_per_s")


@dataclass(frozen=True, slots=True)
class ParityResult:
    """Each metric simulated and emulated (engine seconds), and their relative difference."""

    simulated: dict[str, float | None]
    emulated: dict[str, float | None]
    relative_error: dict[str, float]
    calls: int
    emulator_lag_max_s: float
    """The emulator's largest delivery lag in the run (wall seconds): how far it fell
    behind real time (``headway_emulator_lag_max_seconds``)."""

    @property
    def max_relative_error(self) -> float:
        """The largest relative difference over :data:`METRICS`."""
        return max(self.relative_error.values())


def relative_difference(a: float | None, b: float | None) -> float:
    """|a − b| / |b| (inf when either is missing or ``b`` is 0)."""
    if a is None or b is None or b == 0:
        return float("inf")
    return abs(a - b) / abs(b)


def compare_simulate_emulate(
    spec: WorkloadSpec, profile: AffineStepTime, *, speedup: float = 1.0
) -> ParityResult:
    """Run ``spec`` through the simulator and through the emulator + bench; compare."""
    from headway.bench.benchmark import BenchInput, BenchOptions, run_bench
    from headway.bench.payloads import parse_target
    from headway.core.workload.scale import scale_workload
    from headway.files.workload import LoadedWorkload
    from headway.sim.cluster import ClusterSpec
    from headway.sim.run import simulate

    sim, _, _ = simulate(spec, ClusterSpec(step_time="profile", profile=profile))
    fast = scale_workload(spec, speedup) if speedup != 1 else spec
    bench_input = BenchInput(LoadedWorkload(spec=fast, path=None), spec.duration_s / speedup)
    fields = {name: getattr(profile, name) for name in AffineStepTime.__dataclass_fields__}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profile.json"
        path.write_text(json.dumps({"format": PROFILE_FORMAT, "step_time": fields}))
        with EmulatorProcess(["--profile", str(path), "--speedup", str(speedup)]) as emu:
            options = BenchOptions(
                target=parse_target(emu.url), endpoint="completions", seed=spec.seed, workers=1
            )
            bench = run_bench(bench_input, options).result
            lag_max_s = emulator_lag_max_s(emu.url)
    lat, slat = bench.latencies, sim.latencies

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * speedup

    emulated = {
        "ttft_p50_s": scaled(lat.ttft.p50_s), "ttft_p99_s": scaled(lat.ttft.p99_s),
        "tpot_p50_s": scaled(lat.tpot.p50_s), "tpot_p99_s": scaled(lat.tpot.p99_s),
        "throughput_requests_per_s": bench.throughput_requests_per_s / speedup,
    }  # fmt: skip
    simulated = {
        "ttft_p50_s": slat.ttft.p50_s, "ttft_p99_s": slat.ttft.p99_s,
        "tpot_p50_s": slat.tpot.p50_s, "tpot_p99_s": slat.tpot.p99_s,
        "throughput_requests_per_s": sim.throughput.requests_per_s,
    }  # fmt: skip
    errors = {k: relative_difference(emulated[k], simulated[k]) for k in METRICS}
    return ParityResult(simulated=simulated, emulated=emulated, relative_error=errors,
                        calls=sim.calls, emulator_lag_max_s=lag_max_s)  # fmt: skip


def emulator_lag_max_s(url: str) -> float:
    """The emulator's largest lag behind real time so far (its metrics), wall seconds."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    match = re.search(r"^headway_emulator_lag_max_seconds\S* (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")
