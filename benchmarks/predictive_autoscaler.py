"""The predictive autoscaler against the reactive one on ``burst-autoscaler-delayed``
(issue 20, deliverable 5, "must show").

The workload (``examples/two-tenants.yaml``) is two tenants of unequal size (chat, an
agent with tool calls, a lookup through a database service) scaled to ``--load``; the
cluster is ``--replicas`` llama-3-8b replicas on H100 with the bad day's reference
autoscaler (queue delay, target 1 s, between replicas − 1 and 2 × replicas, timings ×
min(1, duration / 600 s), detection and start-up then × 3), once ``kind: reactive`` and
once ``kind: predictive`` with its defaults. It prints one JSON line: each one's SLO
attainment and replica-hours.

    PYTHONPATH=src python benchmarks/predictive_autoscaler.py --duration-s 600
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgspec

from headway.files.workload import load_workload
from headway.sim.baddays import run_bad_days
from headway.sim.baddays.transforms import reference_autoscaler
from headway.sim.cluster import parse_cluster

SCENARIO = "burst-autoscaler-delayed"

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "two-tenants.yaml"
"""The workload (the bad-day matrix's test workload, as an example file)."""


def compare(duration_s: float, load: float, replicas: int) -> dict[str, float]:
    """Attainment and replica-hours of both kinds on the bad day."""
    spec = msgspec.structs.replace(load_workload(EXAMPLE).spec, duration_s=duration_s)
    base = parse_cluster({"replicas": replicas, "model": "llama-3-8b", "gpu": "h100"})
    out: dict[str, float] = {}
    for kind in ("reactive", "predictive"):
        scaler = msgspec.structs.replace(reference_autoscaler(spec, base), kind=kind)
        cluster = msgspec.structs.replace(base, autoscaler=scaler)
        matrix = run_bad_days(
            spec, cluster, presets=["fifo-unbounded"], scenarios=[SCENARIO], load=load
        )
        cell = matrix.cells[0]
        out[f"{kind}_attainment"] = round(cell.slo_attainment, 4)
        out[f"{kind}_replica_hours"] = round(cell.replica_s / 3600.0, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--load", type=float, default=8.0, help="multiple of the file's rate")
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    figures = compare(args.duration_s, args.load, args.replicas)
    print(json.dumps({"scenario": SCENARIO, **vars(args), **figures}))


if __name__ == "__main__":
    main()
