"""Simulator speed: simulated requests per wall-second, memory, and the first prediction.

Runs, each in a fresh process (so peak memory is its own):

1. the Azure 2023 conversation trace (19,366 requests, one hour) on 4 replicas of
   Llama-3-8B on H100 (``sim_requests_per_s``);
2. a one-hour synthetic workload of about one million requests (Poisson 277.8/s, lognormal
   512/128 tokens) on 64 replicas (``one_million_requests_s``; skip with ``--quick``, which
   runs 6 minutes of it and extrapolates);
3. the first prediction for a new model/GPU pair: build the roofline for a model and GPU
   from their public specifications and price one step, in a fresh interpreter
   (``first_prediction_s``, interpreter start excluded);
4. the Azure trace again behind the ``headway-default`` gateway (the live gateway's core:
   admission, queues, slots, routing over the core's load views for every call;
   ``sim_requests_per_s_gateway``, and ``gateway_speed_ratio`` against run 1, same run;
   skip with ``--no-gateway``).

Prints a table and ends with one line of JSON. Run from the repository root:
``python benchmarks/sim_speed.py [--quick] [--traces ../shared/traces]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from headway import native

ROOT = Path(__file__).resolve().parents[1]

SYNTHETIC = {
    "name": "synthetic-1h",
    "duration_s": 3600,
    "seed": 1,
    "classes": {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 512, "cv": 1.0, "max": 8192},
            "output_tokens": {"dist": "lognormal", "mean": 128, "cv": 1.0, "max": 2048},
            "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
        }
    },
    "sources": [{"name": "users", "arrivals": {"process": "poisson", "rate_per_s": 277.8}}],
}


def _child_simulate(spec_json: str, replicas: int, trace: str | None, gateway: str) -> None:
    """Run in a child process: compile, simulate, print figures as JSON."""
    from headway.core.trace_data import TraceData
    from headway.files.workload import parse_workload
    from headway.sim.cluster import ClusterSpec
    from headway.sim.run import simulate
    from headway.trace.readers import read_trace

    data = json.loads(spec_json)
    traces: dict[str, TraceData] = {}
    if trace is not None:
        traces[trace] = read_trace(trace)
    spec = parse_workload(data)
    started = time.perf_counter()
    cluster = msgspec.convert({"replicas": replicas, "gateway": {"preset": gateway}}, ClusterSpec)
    result, _, workload = simulate(spec, cluster, traces=traces)
    wall_s = time.perf_counter() - started
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "requests": workload.num_calls,
                "wall_s": wall_s,
                "requests_per_s": workload.num_calls / wall_s,
                "simulated_s": result.end_s,
                "peak_rss_mb": rss_mb,
                "steps": result.engine.steps,
                "steps_skipped": result.engine.steps_skipped,
                "ttft_p50_s": result.latencies.ttft.p50_s,
                "shed": sum(g.calls for g in result.by_outcome if g.name == "shed"),
                "tpot_p50_s": result.latencies.tpot.p50_s,
            }
        )
    )


def _child_first_prediction() -> None:
    started = time.perf_counter()
    from headway.core.engine.catalog import get_gpu, get_model
    from headway.core.engine.roofline import RooflineStepTime
    from headway.core.engine.steptime import BatchShape
    from headway.data import load_efficiency_table

    gpu = get_gpu("b200")
    model = get_model("qwen3-8b")
    step = RooflineStepTime(
        model=model, gpu=gpu, efficiency=load_efficiency_table().profile_for(gpu)
    )
    seconds = step.step_time_s(BatchShape(num_prefill_tokens=2048, num_prefill_seqs=1,
                                          prefill_attention_pairs=2048 * 2049 // 2))  # fmt: skip
    print(json.dumps({"first_prediction_s": time.perf_counter() - started, "step_s": seconds}))


def _run_child(*args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="6 minutes of the 1-hour workload")
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument(
        "--no-gateway", action="store_true", help="skip the run behind headway-default"
    )
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        if args.child[0] == "first":
            _child_first_prediction()
        else:
            trace = args.child[2] or None
            _child_simulate(args.child[0], int(args.child[1]), trace, args.child[3])
        return 0

    trace = args.traces / "azure_llm_2023_conv.csv.gz"
    azure_spec = {
        "name": "azure-conv",
        "duration_s": 4000,
        "classes": {"conv": {"slo": {"ttft_s": 2.0, "tpot_s": 0.1}}},
        "sources": [{"name": "azure", "arrivals": {"process": "trace", "path": str(trace)}}],
    }
    azure = _run_child(json.dumps(azure_spec), "4", str(trace), "fifo-unbounded")
    synthetic = dict(SYNTHETIC)
    fraction = 0.1 if args.quick else 1.0
    synthetic["duration_s"] = 3600 * fraction
    million = _run_child(json.dumps(synthetic), "64", "", "fifo-unbounded")
    first = _run_child("first")
    gated = None
    if not args.no_gateway:
        gated = _run_child(json.dumps(azure_spec), "4", str(trace), "headway-default")
    million_s = million["wall_s"] / fraction * (1_000_000 / (million["requests"] / fraction))
    print(f"{'workload':<34}{'requests':>10}{'wall s':>9}{'req/s':>9}{'RSS MB':>8}")
    runs = [("Azure conv, 4 × Llama-3-8B/H100", azure),
            (f"synthetic {fraction:g} h, 64 replicas", million)]  # fmt: skip
    if gated is not None:
        runs.append(("Azure conv, behind headway-default", gated))
    for name, r in runs:
        print(
            f"{name:<34}{r['requests']:>10,.0f}{r['wall_s']:>9.2f}{r['requests_per_s']:>9,.0f}"
            f"{r['peak_rss_mb']:>8.0f}"
        )
    first_s = first["first_prediction_s"]
    print(f"first prediction for a new model/GPU (Qwen3-8B on B200): {first_s:.3f} s")
    figures = {
        "sim_requests_per_s": round(azure["requests_per_s"], 1),
        "azure_conv_wall_s": round(azure["wall_s"], 3),
        "azure_conv_peak_rss_mb": round(azure["peak_rss_mb"], 1),
        "one_million_requests_s": round(million_s, 1),
        "one_million_measured": not args.quick,
        "synthetic_requests_per_s": round(million["requests_per_s"], 1),
        "synthetic_peak_rss_mb": round(million["peak_rss_mb"], 1),
        "first_prediction_s": round(first["first_prediction_s"], 4),
        "headway_compiled": native.status().compiled,
    }
    if gated is not None:
        figures["sim_requests_per_s_gateway"] = round(gated["requests_per_s"], 1)
        figures["gateway_speed_ratio"] = round(gated["requests_per_s"] / azure["requests_per_s"], 3)
        figures["gateway_shed"] = gated["shed"]
    print(f"headway ran {native.status().reason}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
