"""What a degraded mode buys on a bad day, simulated and live (issue 20, deliverable 1).

One overloaded workload (a traffic burst past what one replica serves within the SLO)
through ``headway simulate`` with the ``headway-default`` gateway and through
``headway gateway`` in front of ``headway emulate``, driven by ``headway bench``, each
with and without one degraded mode (``brief``: answers capped at ``CAP`` tokens while the
line waits). Both gateways have the same settings (slots, queue bound, speed prior from
the profile, the replica's KV pool, the mode), as in ``benchmarks/parity.py``.

Figures: ``sim_goodput_gain`` and ``live_goodput_gain`` (goodput with the mode / without
it, minus 1), ``gain_relative_difference`` (|live gain - sim gain| / sim gain: the issue
asks for at most 10%), the goodputs and the calls served degraded.

    python benchmarks/degraded_modes.py [--sim-only] [--duration 60]

It ends by printing one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from support.emulator_profile import TRUTH, truth_file  # benchmarks/support/

CAP = 64
"""The mode's output cap, tokens."""

E2E_S = 6.0
"""The answers' SLO: whole within this (also each call's deadline, on both sides)."""

SLOTS = 16
QUEUE = 48

MODE = {
    "bands": ["interactive"],
    "max_tokens": CAP,
    "enter": {"slot_utilization": 0.9},
    "leave": {"slot_utilization": 0.6},
    "min_on_s": 5.0,
}


def workload(duration_s: float) -> dict[str, Any]:
    """Answers judged whole (non-streamed API calls: an e2e bound), with a burst at 3x
    the base rate for the middle third of the run."""
    return {
        "name": "degraded-burst",
        "duration_s": duration_s,
        "seed": 5,
        "classes": {
            "answer": {
                "input_tokens": {"dist": "lognormal", "mean": 800, "cv": 0.5, "max": 4000},
                "output_tokens": {"dist": "lognormal", "mean": 200, "cv": 0.5, "max": 500},
                "slo": {"e2e_s": E2E_S},
            }
        },
        "sources": [
            {
                "name": "users",
                "arrivals": {
                    "process": "poisson",
                    "rate_per_s": 4,
                    "bursts": [
                        {"start_s": duration_s / 3, "duration_s": duration_s / 3, "multiplier": 3.0}
                    ],
                },
            }
        ],
    }


def run(duration_s: float, *, sim_only: bool) -> dict[str, Any]:
    """The four runs (simulated and live, with and without the mode) and the figures."""
    from headway.core.policy.degraded import DegradedConfig
    from headway.data import load_efficiency_table
    from headway.files.workload import parse_workload
    from headway.gateway.config import parse_config
    from headway.sim.cluster import ClusterSpec, build_replica, step_time_model
    from headway.sim.gateway import GatewayConfig
    from headway.sim.run import simulate

    spec = parse_workload(workload(duration_s), "<degraded-burst>")
    cluster = ClusterSpec(step_time="profile", profile=TRUTH)
    step_time = step_time_model(cluster, load_efficiency_table())
    kv_blocks = build_replica(cluster, step_time).scheduler.pool.num_blocks
    band = {"max_queued_requests": QUEUE}
    key = "degraded-key"
    out: dict[str, Any] = {"cap_tokens": CAP, "duration_s": duration_s}
    with tempfile.TemporaryDirectory() as folder:
        truth = truth_file(Path(folder))
        for on in (False, True):
            name = "on" if on else "off"
            live_config: dict[str, Any] = {
                "slots_per_upstream": SLOTS,
                "metrics_public": True,
                "default_deadline_s": E2E_S,  # the simulator's per-call deadline: the e2e bound
                "profile": str(truth),
                "kv_blocks_per_upstream": kv_blocks,
                "queues": {"interactive": band, "background": band, "critical": band},
                "tenants": {key: {"name": next(iter(spec.tenants))}},
            }
            parsed = parse_config({"upstreams": [{"url": "http://127.0.0.1:9"}], **live_config})
            if on:
                live_config["degraded"] = {"modes": {"brief": MODE}}
            gateway = GatewayConfig(
                preset="headway-default",
                admission=parsed.admission_config(),
                queues=parsed.queue_config(),
                slots_per_replica=SLOTS,
                tenant_budgets="none",
                tenant_slot_headroom=parsed.tenant_slot_headroom,
                degraded=msgspec.convert({"modes": {"brief": MODE}}, DegradedConfig)
                if on
                else None,
            )
            sim, _, _ = simulate(spec, msgspec.structs.replace(cluster, gateway=gateway))
            out[f"sim_goodput_{name}_per_s"] = sim.slo.goodput_per_s
            out[f"sim_attainment_{name}"] = sim.slo.attainment
            out[f"sim_degraded_calls_{name}"] = sim.degraded_calls
            if not sim_only:
                live = _live(spec, truth, live_config, key)
                out.update({f"live_{k}_{name}": v for k, v in live.items()})
            print(f"mode {name}: " + ", ".join(f"{k}={v}" for k, v in out.items()
                  if k.endswith((name, f"{name}_per_s"))), file=sys.stderr)  # fmt: skip
    sim_gain = out["sim_goodput_on_per_s"] / out["sim_goodput_off_per_s"] - 1
    out["sim_goodput_gain"] = sim_gain
    if not sim_only:
        live_gain = out["live_goodput_per_s_on"] / out["live_goodput_per_s_off"] - 1
        out["live_goodput_gain"] = live_gain
        out["gain_relative_difference"] = abs(live_gain - sim_gain) / abs(sim_gain)
    return out


def _live(spec: Any, truth: Path, live_config: dict[str, Any], key: str) -> dict[str, Any]:
    """The workload through a live gateway in front of an emulator, driven by the bench."""
    from headway.bench.benchmark import BenchInput, BenchOptions, run_bench
    from headway.bench.payloads import parse_target
    from headway.drill.observe import Metrics
    from headway.emulate.process import EmulatorProcess
    from headway.files.workload import LoadedWorkload
    from headway.gateway.process import GatewayProcess

    with (
        EmulatorProcess(["--profile", str(truth)]) as emu,
        GatewayProcess({"upstreams": [{"url": emu.url}], **live_config}) as gw,
    ):
        options = BenchOptions(
            target=parse_target(gw.url), endpoint="completions", seed=spec.seed,
            workers=1, api_key=key,
        )  # fmt: skip
        bench = run_bench(BenchInput(LoadedWorkload(spec=spec, path=None), spec.duration_s),
                          options).result  # fmt: skip
        with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as resp:
            metrics = Metrics(resp.read().decode())
        degraded = metrics.total("headway_gateway_degraded_requests_total")
    return {
        "goodput_per_s": bench.slo.goodput_per_s,
        "attainment": bench.slo.attainment,
        "degraded_requests": degraded,
        "statuses": bench.outcomes.by_status,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sim-only", action="store_true", help="skip the live runs")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per run")
    args = parser.parse_args()
    out = run(args.duration, sim_only=args.sim_only)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
