"""The KV stability boundary μ against the simulator and the analytic capacity.

Usage (from the repository root)::

    python benchmarks/stability.py [--traces ../shared/traces] [--duration-s 300]

For each length mix (input and output token pairs drawn from a shared public trace) and
each KV pool (small to large, as ``num_kv_blocks``) on one Llama-3-8B H100 replica, it
prints three capacities in calls per second:

* **μ** = M / (b̄ · E[g]) (:mod:`headway.core.engine.stability`, Nie, Si & Zhou), and
  the capacity it implies: μ, or less where ``max_num_seqs`` caps the batch before the
  pool fills (``bound``); ``mu/sim`` is that capacity over the simulated figure;
* **analytic**: :func:`~headway.core.engine.capacity.max_throughput` for the mean call,
  the analytic plan's own capacity figure;
* **simulated**: the simulator's completed calls per second under a Poisson load of
  1.5 × max(μ, analytic), after a warm-up of a third of the run (the rate a saturated
  engine sustains; its queue grows without bound).

and the ratios to the simulated figure. The last line is one JSON object:
``mu_error_median`` (median |μ's capacity / simulated − 1|), ``analytic_error_median``
and ``rows``. The traces are used for their lengths only; nothing is fitted to them.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.planner.stability import replica_capacity
from headway.sim.cluster import parse_cluster
from headway.sim.run import simulate_compiled

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
MIXES = {
    "azure-conv": "azure_llm_2023_conv.csv.gz",
    "azure-code": "azure_llm_2023_code.csv.gz",
}
KV_BLOCKS = (2_000, 8_000, 25_000)
"""Small to large pools (16-token blocks): 32k, 128k and 400k tokens."""
PAIRS_PER_MIX = 2_000


def _pairs(path: Path, seed: int = 0) -> list[tuple[int, int]]:
    """A seeded sample of (input, output) token pairs from an Azure trace."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [
            (int(r["ContextTokens"]), max(1, int(r["GeneratedTokens"]))) for r in csv.DictReader(fh)
        ]
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(rows), size=min(PAIRS_PER_MIX, len(rows)), replace=False)
    return [rows[i] for i in sorted(picked)]


def _workload(pairs: list[tuple[int, int]], rate_per_s: float, duration_s: float) -> Any:
    return parse_workload(
        {
            "name": "stability",
            "seed": 1,
            "duration_s": duration_s,
            "classes": {
                "mix": {
                    "joint_tokens": {"pairs": [list(p) for p in pairs]},
                    "slo": {"ttft_s": 1000.0},
                }
            },
            "sources": [
                {"name": "all", "mix": {"mix": 1.0},
                 "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}}
            ],
        }
    )  # fmt: skip


def row(mix: str, pairs: list[tuple[int, int]], blocks: int, duration_s: float) -> dict[str, Any]:
    cluster = parse_cluster(
        {"replicas": 1, "model": "llama-3-8b", "gpu": "h100-sxm", "num_kv_blocks": blocks}
    )
    capacity = replica_capacity(_workload(pairs, 1.0, duration_s), cluster)
    assert capacity is not None
    boundary = capacity.boundary
    mu = boundary.mu_requests_per_s
    analytic = capacity.analytic.requests_per_s  # one call per task here
    offered = 1.5 * max(mu, analytic)
    workload = compile_workload(_workload(pairs, offered, duration_s), seed=1)
    result, outcome = simulate_compiled(workload, cluster)
    warm_s = duration_s / 3
    finish = outcome.calls.finish_s
    done = int(np.count_nonzero((finish >= warm_s) & (finish <= duration_s)))
    simulated = done / (duration_s - warm_s)
    return {
        "mix": mix,
        "kv_blocks": blocks,
        "bound": boundary.bound,
        "mu_calls_per_s": round(mu, 3),
        "mu_capacity_calls_per_s": round(boundary.capacity_requests_per_s, 3),
        "analytic_calls_per_s": round(analytic, 3),
        "simulated_calls_per_s": round(simulated, 3),
        "mu_over_simulated": round(boundary.capacity_requests_per_s / simulated, 3)
        if simulated
        else None,
        "analytic_over_simulated": round(analytic / simulated, 3) if simulated else None,
        "preemptions": result.engine.preemptions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--duration-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(
            f"error: --traces {args.traces} is not a folder; give the shared traces folder",
            file=sys.stderr,
        )
        return 2
    rows = []
    header = (
        f"{'mix':<12}{'KV blocks':>10}{'bound':>14}{'mu':>9}{'mu cap':>9}{'analytic':>10}"
        f"{'simulated':>11}{'mu/sim':>8}{'an/sim':>8}"
    )
    print(header)
    for mix, name in MIXES.items():
        pairs = _pairs(args.traces / name)
        for blocks in KV_BLOCKS:
            r = row(mix, pairs, blocks, args.duration_s)
            rows.append(r)
            print(
                f"{r['mix']:<12}{r['kv_blocks']:>10,}{r['bound']:>14}{r['mu_calls_per_s']:>9.2f}"
                f"{r['mu_capacity_calls_per_s']:>9.2f}"
                f"{r['analytic_calls_per_s']:>10.2f}{r['simulated_calls_per_s']:>11.2f}"
                f"{r['mu_over_simulated']:>8.2f}{r['analytic_over_simulated']:>8.2f}",
                flush=True,
            )
    mu_err = statistics.median(abs(r["mu_over_simulated"] - 1) for r in rows)
    an_err = statistics.median(abs(r["analytic_over_simulated"] - 1) for r in rows)
    print(json.dumps({"mu_error_median": round(mu_err, 4),
                      "analytic_error_median": round(an_err, 4), "rows": rows}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
