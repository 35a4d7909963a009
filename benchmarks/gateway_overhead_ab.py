"""The gateway's CPU cost against an older commit, in the same run (issue 18: "no regression").

Runs phases 1-2 of ``benchmarks/gateway_overhead.py`` (CPU per non-streamed request, CPU
per streamed chunk) alternately with this checkout's ``src`` and with ``--old``'s (taken
with ``git archive`` into a temporary folder and put first on ``PYTHONPATH``, so the
gateway child process runs it), ``--repeats`` times each, interleaved. Both run pure
Python (``HEADWAY_PURE_PYTHON=1``), so that one build does not differ from the other
only by what was compiled. Prints each run, then one line of JSON: the medians and the
ratios new / old (``cpu_per_request_ratio``, ``cpu_per_chunk_ratio``; 1.10 is the
issue's bound), and the median of each repeat's back-to-back ratio (``*_pair_ratio_median``).

    python benchmarks/gateway_overhead_ab.py --old c8bfb98 [--repeats 3] [--requests 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from support.old_source import export_src  # benchmarks/support/: helpers, not benchmarks

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("cpu_ms_per_request", "cpu_us_per_chunk")
SKIP = ("litellm", "overload", "obedience", "fairness", "infeasible", "disconnect")


def _run(src: Path, requests: int) -> dict[str, float]:
    """Phases 1-2 with ``src`` first on the path; their first JSON line."""
    env = {**os.environ, "PYTHONPATH": str(src), "HEADWAY_PURE_PYTHON": "1"}
    args = [sys.executable, str(ROOT / "benchmarks" / "gateway_overhead.py")]
    args += ["--requests", str(requests)]
    for phase in SKIP:
        args += ["--skip", phase]
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
    first = json.loads(out.splitlines()[0])
    return {key: float(first[key]) for key in KEYS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the commit to compare against")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as folder:
        sources = {"old": export_src(args.old, Path(folder)), "new": ROOT / "src"}
        for repeat in range(args.repeats):
            for label in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
                figures = _run(sources[label], args.requests)
                runs[label].append(figures)
                print(f"{label} #{repeat + 1}: {figures}", file=sys.stderr)
    medians = {
        label: {key: statistics.median(r[key] for r in rs) for key in KEYS}
        for label, rs in runs.items()
    }
    result = {
        "old": args.old,
        "repeats": args.repeats,
        "requests": args.requests,
        "old_medians": medians["old"],
        "new_medians": medians["new"],
        "cpu_per_request_ratio": medians["new"]["cpu_ms_per_request"]
        / medians["old"]["cpu_ms_per_request"],
        "cpu_per_chunk_ratio": medians["new"]["cpu_us_per_chunk"]
        / medians["old"]["cpu_us_per_chunk"],
        # Each repeat's new / old, run back to back: robust to the machine's load drifting.
        "cpu_per_request_pair_ratio_median": statistics.median(
            n["cpu_ms_per_request"] / o["cpu_ms_per_request"]
            for n, o in zip(runs["new"], runs["old"], strict=True)
        ),
        "cpu_per_chunk_pair_ratio_median": statistics.median(
            n["cpu_us_per_chunk"] / o["cpu_us_per_chunk"]
            for n, o in zip(runs["new"], runs["old"], strict=True)
        ),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
