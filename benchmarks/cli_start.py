"""CPU time of starting the CLI: ``headway --help`` and ``headway workload check``.

Issue 16 (defect 12): ``--help`` took 4.8-7.1 s wall on a loaded machine because it
imported every verb, scipy included; it must take under 0.5 s of CPU, and ``workload
check`` must start as fast. Each command runs in a fresh interpreter; its CPU time (user +
system, from the child's rusage) is measured with a bare ``python -c pass`` in the same
run as the baseline, the three interleaved, ``--repeats`` times each; medians are
reported. Ends with one line of JSON: ``help_cpu_s``, ``workload_check_cpu_s``,
``python_cpu_s`` and ``help_over_python`` (the ratio). Run from the repository root:
``python benchmarks/cli_start.py [--repeats 9]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "examples" / "reference-assistant.yaml"
COMMANDS: dict[str, list[str]] = {
    "python_cpu_s": [sys.executable, "-c", "pass"],
    "help_cpu_s": [sys.executable, "-m", "headway", "--help"],
    "workload_check_cpu_s": [sys.executable, "-m", "headway", "workload", "check", str(WORKLOAD)],
}


def _cpu_s(command: list[str]) -> float:
    """User + system CPU seconds of one run of ``command`` (it must exit 0)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, check=False, env=os.environ.copy())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-500:]!r}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    _cpu_s(COMMANDS["help_cpu_s"])  # warm the file cache and the bytecode
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():
            samples[name].append(_cpu_s(command))
    medians = {name: round(statistics.median(v), 3) for name, v in samples.items()}
    for name, value in medians.items():
        print(f"{name:22} median {value:.3f} s CPU over {args.repeats} runs")
    figures = {
        **medians,
        "help_over_python": round(medians["help_cpu_s"] / max(medians["python_cpu_s"], 1e-3), 2),
        "target_cpu_s": 0.5,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
