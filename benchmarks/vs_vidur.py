"""headway's simulator against Vidur on the same workloads, in the same run.

Vidur (microsoft/vidur, the field's best-known LLM-serving simulator) is not part of
headway: give the path of a checkout (commit 7d47513) with ``--vidur``. The script

1. prepares Vidur beside it, if needed: its own venv (``<checkout>/.venv`` with its
   ``requirements.txt``) and the Llama-2-7B/A100 attention profile that the checkout
   lacks (rebuilt by ``../shared/tools/vidur/make_attention_csv.py``);
2. checks Vidur's predictor cache: its first run on a model/GPU trains sklearn models for
   over an hour on 2 cores. If the cache is absent it starts that run in the background
   (``nice``, one thread) and exits with code 3: run the script again when it is done;
3. writes the workloads (true Poisson arrivals from one seed, fixed 512 input and 128
   output tokens): R1, 10 req/s on 1 replica, and R2, 40 req/s on 4 replicas round robin
   (the anchors' R1 and R2, ``../shared/reference/simulator-anchors.md`` §3);
4. runs both simulators on each, interleaved, ``--repeat`` times (the run of median wall
   time counts): Vidur through a small wrapper that times its ``Simulator.run()`` event
   loop alone (not its set-up, not the metrics it writes afterwards), headway through its
   library, whose ``SimOutcome.loop_wall_s`` times its event loop likewise; the wall time
   of headway's whole ``simulate_compiled`` call (replicas built, the records' arrays,
   the summaries by class, tenant and length) is reported too. Like-for-like settings:
   Llama-2-7B on A100, TP1, 7,424 KV blocks of 16 tokens, batch cap 128, 4,096 batched
   tokens, vLLM-v0-style prefill without chunking, recompute preemption;
5. prints wall time, simulated requests per wall-second, TTFT/TPOT/e2e p50 and p99 of
   both and the ratios, and ends with one line of JSON (``speedup_vs_vidur`` is the
   smallest event-loop speed ratio over the workloads; ``R*_speedup_whole`` counts
   headway's whole call).

Usage: ``python benchmarks/vs_vidur.py --vidur /path/to/vidur [--requests 10000] [--repeat 3]``
(each simulator runs ``--repeat`` times per workload; the run of median wall time counts).
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ATTENTION = "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv"

# Our own wrapper, run in Vidur's venv: times Simulator.run() and nothing else.
WRAPPER = r"""
import json, sys, time
from vidur.config import SimulationConfig
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds
sys.argv = ["vidur"] + sys.argv[1:]
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
t0 = time.perf_counter()
simulator = Simulator(config)
t1 = time.perf_counter()
simulator.run()
t2 = time.perf_counter()
print("HEADWAY-BENCH " + json.dumps({"init_s": t1 - t0, "run_s": t2 - t1,
      "output_dir": config.metrics_config.output_dir}), flush=True)
"""

WORKLOADS = {
    "R1": {"qps": 10.0, "replicas": 1, "router": "round_robin"},
    "R2": {"qps": 40.0, "replicas": 4, "router": "round_robin"},
}


def vidur_args(trace: Path, replicas: int) -> list[str]:
    """Vidur's command line for a trace replay on Llama-2-7B/A100 with its vLLM scheduler."""
    return [
        "--replica_config_device", "a100",
        "--replica_config_model_name", "meta-llama/Llama-2-7b-hf",
        "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--no-metrics_config_store_plots",
        "--no-metrics_config_enable_chrome_trace",
        "--cluster_config_num_replicas", str(replicas),
        "--global_scheduler_config_type", "round_robin",
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace),
        "--replica_scheduler_config_type", "vllm",
        "--random_forrest_execution_time_predictor_config_num_training_job_threads", "1",
    ]  # fmt: skip


def prepare_vidur(vidur: Path) -> Path:
    """Make sure the checkout has a venv and the attention profile; return its python."""
    python = vidur / ".venv" / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(vidur / ".venv")], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-r", str(vidur / "requirements.txt")],
            check=True,
        )
    attention = vidur / ATTENTION
    if not attention.exists():
        sample = SHARED / "traces/calibration/vidur_a100_Llama-2-7b-hf_attention_sample.csv.gz"
        subprocess.run(
            [str(python), str(SHARED / "tools/vidur/make_attention_csv.py"), str(sample),
             str(attention)],
            check=True,
        )  # fmt: skip
    return python


def vidur_cache_ready(vidur: Path) -> bool:
    """Whether Vidur's predictor cache for this model/GPU looks trained."""
    cache = vidur / "cache"
    return cache.is_dir() and sum(1 for _ in cache.rglob("*")) > 20


def write_workload(path: Path, n: int, qps: float, seed: int) -> None:
    """Poisson arrivals (exponential gaps), fixed 512/128 tokens, Vidur's CSV columns."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / qps, size=n)
    gaps[0] = 0.0
    times = np.cumsum(gaps)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        for t in times.tolist():
            writer.writerow([f"{t:.6f}", 512, 128])


def run_vidur(python: Path, vidur: Path, trace: Path, replicas: int) -> dict[str, float]:
    """Run Vidur once; return its loop time and latency percentiles."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=str(vidur), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [str(python), "-c", WRAPPER, *vidur_args(trace, replicas)],
        cwd=vidur, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    line = next(x for x in out.stdout.splitlines() if x.startswith("HEADWAY-BENCH "))
    info = json.loads(line.removeprefix("HEADWAY-BENCH "))
    metrics = vidur / info["output_dir"] / "request_metrics.csv"
    with metrics.open() as handle:
        rows = list(csv.DictReader(handle))
    ttft = np.array([float(r["prefill_e2e_time"]) for r in rows])
    tpot = np.array([float(r["decode_time_execution_plus_preemption_normalized"]) for r in rows])
    e2e = np.array([float(r["request_e2e_time"]) for r in rows])
    return {"wall_s": info["run_s"], "requests": len(rows), **_percentiles(ttft, tpot, e2e)}


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run of median wall time (the simulations are deterministic: only time varies)."""
    return sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]


def _percentiles(ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        finite = values[np.isfinite(values)]
        out[f"{name}_p50_s"] = float(np.percentile(finite, 50))
        out[f"{name}_p99_s"] = float(np.percentile(finite, 99))
    return out


def run_headway(trace: Path, replicas: int, router: str) -> dict[str, float]:
    """Run headway on the same CSV with like-for-like engine settings."""
    from headway.core.engine.scheduler import SchedulerConfig
    from headway.core.metrics import tpot_s
    from headway.core.trace_data import TraceData
    from headway.core.workload.compile import compile_workload
    from headway.files.workload import parse_workload
    from headway.sim.cluster import ClusterSpec
    from headway.sim.run import simulate_compiled

    with trace.open() as handle:
        rows = list(csv.DictReader(handle))
    data = TraceData(
        name="vidur-workload",
        kind="generic",
        arrival_s=np.array([float(r["arrived_at"]) for r in rows]),
        input_tokens=np.array([int(r["num_prefill_tokens"]) for r in rows], dtype=np.int64),
        output_tokens=np.array([int(r["num_decode_tokens"]) for r in rows], dtype=np.int64),
    )
    spec = parse_workload(
        {
            "name": trace.stem,
            "duration_s": float(data.arrival_s[-1]) + 1.0,
            "classes": {"fixed": {}},
            "sources": [
                {
                    "name": "trace",
                    "arrivals": {"process": "trace", "path": "trace", "tick_policy": "literal"},
                }
            ],
        }
    )
    workload = compile_workload(spec, traces={"trace": data})
    cluster = ClusterSpec(
        replicas=replicas,
        model="llama-2-7b",
        gpu="a100",
        num_kv_blocks=7424,
        router=router,  # type: ignore[arg-type]
        engine=SchedulerConfig(
            max_num_seqs=128, max_num_batched_tokens=4096, enable_chunked_prefill=False
        ),
    )
    gc.collect()  # the set-up's garbage is not the simulation's to collect
    started = time.perf_counter()
    _, outcome = simulate_compiled(workload, cluster)
    whole_s = time.perf_counter() - started
    c = outcome.calls
    ttft = c.first_token_s - c.dispatch_s
    e2e = c.finish_s - c.dispatch_s
    return {
        # The event loop, as Vidur's Simulator.run() is timed; and the whole call
        # (replicas built, records' arrays, the summaries by class, tenant and length).
        "wall_s": outcome.loop_wall_s,
        "whole_s": whole_s,
        "requests": workload.num_calls,
        **_percentiles(ttft, tpot_s(e2e, ttft, c.num_output_tokens), e2e),
    }


def main() -> int:
    """Run the comparison; exit 3 while Vidur's predictor cache is still being built."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vidur", type=Path, required=True, help="a microsoft/vidur checkout")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", type=Path, default=Path("/tmp/headway-vs-vidur"))
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each simulator per workload, interleaved; the run of median wall time "
        "counts (both simulators alike: a shared machine's noise is large at these times)",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1 (got {args.repeat})")
    vidur = args.vidur.resolve()
    python = prepare_vidur(vidur)
    args.work.mkdir(parents=True, exist_ok=True)
    traces = {}
    for name, w in WORKLOADS.items():
        traces[name] = args.work / f"{name}_fixed512x128_n{args.requests}.csv"
        write_workload(traces[name], args.requests, float(w["qps"]), args.seed)
    if not vidur_cache_ready(vidur):
        log = args.work / "vidur_first_run.log"
        env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=str(vidur), OMP_NUM_THREADS="1")
        with log.open("w") as handle:
            subprocess.Popen(
                ["nice", "-n", "19", str(python), "-m", "vidur.main",
                 *vidur_args(traces["R1"], 1)],
                cwd=vidur, env=env, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        print(
            f"Vidur's predictor cache is not built; its first run (over an hour on 2 cores) "
            f"is training in the background, log in {log}. Run this again when it is done."
        )
        return 3
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, w in WORKLOADS.items():
        replicas = int(w["replicas"])
        runs: dict[str, list[dict[str, float]]] = {"vidur": [], "headway": []}
        for _ in range(args.repeat):  # interleaved: a shared machine's speed drifts
            runs["vidur"].append(run_vidur(python, vidur, traces[name], replicas))
            runs["headway"].append(run_headway(traces[name], replicas, str(w["router"])))
        results[name] = {sim: _median_run(r) for sim, r in runs.items()}
    figures: dict[str, float | str | bool] = {}
    header = f"{'':<5}{'sim':<9}{'wall s':>8}{'req/s':>9}"
    for m in ("ttft", "tpot", "e2e"):
        header += f"{m + ' p50':>11}{m + ' p99':>11}"
    print(header)
    speedups = []
    for name, pair in results.items():
        for sim in ("vidur", "headway"):
            r = pair[sim]
            line = f"{name:<5}{sim:<9}{r['wall_s']:>8.2f}{r['requests'] / r['wall_s']:>9,.0f}"
            for m in ("ttft", "tpot", "e2e"):
                line += f"{r[m + '_p50_s'] * 1000:>9.1f}ms{r[m + '_p99_s'] * 1000:>9.1f}ms"
            print(line)
        speed = (pair["headway"]["requests"] / pair["headway"]["wall_s"]) / (
            pair["vidur"]["requests"] / pair["vidur"]["wall_s"]
        )
        speedups.append(speed)
        figures[f"{name}_speedup"] = round(speed, 2)
        figures[f"{name}_vidur_wall_s"] = round(pair["vidur"]["wall_s"], 3)
        figures[f"{name}_headway_wall_s"] = round(pair["headway"]["wall_s"], 3)
        whole = (pair["headway"]["requests"] / pair["headway"]["whole_s"]) / (
            pair["vidur"]["requests"] / pair["vidur"]["wall_s"]
        )
        figures[f"{name}_headway_whole_s"] = round(pair["headway"]["whole_s"], 3)
        figures[f"{name}_speedup_whole"] = round(whole, 2)
        for m in ("ttft", "tpot", "e2e"):
            for q in ("p50", "p99"):
                key = f"{m}_{q}_s"
                figures[f"{name}_{m}_{q}_ratio"] = round(
                    pair["headway"][key] / pair["vidur"][key], 3
                )
        print(
            f"{name}: headway is {speed:.1f}x Vidur's simulated requests per wall-second "
            f"(event loop against event loop; {whole:.1f}x counting headway's set-up, "
            "arrays and summaries too)"
        )
    figures["speedup_vs_vidur"] = round(min(speedups), 2)
    from headway import native

    print(f"headway ran {native.status().reason}")
    figures["headway_compiled"] = native.status().compiled
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
