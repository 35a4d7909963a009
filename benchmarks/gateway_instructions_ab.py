"""The gateway's CPU work against an older commit, counted in instructions (issue 18).

``benchmarks/gateway_overhead_ab.py`` measures CPU seconds, and on this shared two-core
machine one repeat of it moves ±20% and a median of seven ±5%: too coarse to tell a 10%
bound from noise. Here the gateway runs under Valgrind's callgrind, which counts the
instructions it executes, and counting is switched on (``callgrind_control -i on``)
only while the load runs, so start-up and warm-up are not in it. Two runs of the same
code agree within 2% (the event loop batches differently from run to run), whatever
else the machine does.

For this checkout's ``src`` and ``--old``'s (``git archive``, first on ``PYTHONPATH`` so
the gateway child runs it), both pure Python (``HEADWAY_PURE_PYTHON=1``): the
instructions per non-streamed request (``--requests`` calls, the body of phase 1 of
``benchmarks/gateway_overhead.py``) and per streamed chunk (a quarter as many streams
of 64 tokens), ``--concurrency`` calls at a time against the same mock upstream. Prints
each count, then one line of JSON with the ratios new / old
(``instructions_per_request_ratio``, ``instructions_per_chunk_ratio``; 1.10 is the
issue's bound). Needs ``valgrind``; a few minutes.

    python benchmarks/gateway_instructions_ab.py --old c8bfb98 [--requests 600]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from support.old_source import export_src  # benchmarks/support/: helpers, not benchmarks

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, glob, os, subprocess
sys.path.insert(0, {bench!r})
import gateway_overhead as go
import uvloop
from headway.gateway.process import GatewayProcess

out, requests, concurrency = {out!r}, {requests}, {concurrency}
prefix = ("valgrind", "--tool=callgrind", "--instr-atstart=no",
          f"--callgrind-out-file={{out}}/cg.%p")

def control(pid, *args):
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)

def counted(pid, run):
    control(pid, "--zero")
    control(pid, "--instr=on")
    result = uvloop.run(run)
    control(pid, "--instr=off")
    control(pid, "--dump")
    newest = max(glob.glob(f"{{out}}/cg.*"), key=os.path.getmtime)
    with open(newest) as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
    return result, total

with go._mock() as mock, GatewayProcess(go._gateway_config(mock), prefix=prefix) as gw:
    url = f"{{gw.url}}/v1/chat/completions"
    uvloop.run(go._closed(url, go._body(16), 100, concurrency))  # warm up
    (done, _), whole = counted(gw.pid, go._closed(url, go._body(16), requests, concurrency))
    streams = max(requests // 4, 1)
    (sent, events), streamed = counted(
        gw.pid, go._closed(url, go._body(64, True), streams, concurrency)
    )
print(json.dumps({{
    "instructions_per_request": whole / max(len(done), 1),
    "instructions_per_chunk": streamed / max(events, 1),
    "requests_ok": len(done), "streams_ok": len(sent), "events": events,
}}))
"""


def _count(src: Path, requests: int, concurrency: int) -> dict[str, float]:
    """Instructions per request and per chunk of the gateway run from ``src``."""
    with tempfile.TemporaryDirectory(prefix="headway-callgrind-") as out:
        code = _CHILD.format(
            bench=str(ROOT / "benchmarks"), out=out, requests=requests, concurrency=concurrency
        )
        env = {**os.environ, "PYTHONPATH": str(src), "HEADWAY_PURE_PYTHON": "1"}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        )
        figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    if figures["requests_ok"] < requests or figures["streams_ok"] < max(requests // 4, 1):
        raise SystemExit(f"calls failed under {src}: {figures}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the commit to compare against")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: install valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as folder:
        sources = {"old": export_src(args.old, Path(folder)), "new": ROOT / "src"}
        counts = {}
        for label in ("old", "new"):
            counts[label] = _count(sources[label], args.requests, args.concurrency)
            print(f"{label}: {counts[label]}", file=sys.stderr)
    old, new = counts["old"], counts["new"]
    print(
        json.dumps(
            {
                "old": args.old,
                "requests": args.requests,
                "concurrency": args.concurrency,
                "old_counts": old,
                "new_counts": new,
                "instructions_per_request_ratio": new["instructions_per_request"]
                / old["instructions_per_request"],
                "instructions_per_chunk_ratio": new["instructions_per_chunk"]
                / old["instructions_per_chunk"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
