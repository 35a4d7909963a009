"""Soak: the ``soak`` drill (10× overload against gateway + emulated engines) for several
minutes, then its memory and accounting figures.

    python benchmarks/soak.py [--minutes 4]

Runs ``headway drill soak --duration-s SECONDS`` (the same drill CI runs for 20 s) and
prints the gateway's memory over the run (sampled every 0.25 s: peak, the first, middle
and last thirds, growth of the last third over the middle one), the calls by terminal
state and the accounting check. Ends with one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="headway-soak-"))
    seconds = args.minutes * 60
    proc = subprocess.run(
        [sys.executable, "-m", "headway", "drill", "soak", "--duration-s", f"{seconds:g}",
         "--out", str(out), "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    result = data["results"][0]
    f = result["figures"]
    rss = [r for r in result["series"]["rss_mb"] if r is not None]
    third = len(rss) // 3
    figures = {
        "soak_s": seconds,
        "status": result["status"],
        "calls": f["calls"],
        "ok": f["ok"],
        "shed": f["shed"],
        "lost": f["lost"],
        "server_errors": f["server_errors"],
        "accounting_mismatch": f["accounting_mismatch"],
        "overload_factor": round(f["overload_factor"], 2),
        "rss_first_third_mb": round(statistics.fmean(rss[:third]), 1),
        "rss_middle_third_mb": round(statistics.fmean(rss[third : 2 * third]), 1),
        "rss_last_third_mb": round(statistics.fmean(rss[-third:]), 1),
        "rss_peak_mb": round(max(rss), 1),
        "rss_growth": round(f["rss_growth"], 3),
    }
    for check in result["checks"]:
        print(f"{check['figure']:28} {check['op']} {check['value']:<8g} observed "
              f"{check['observed']}  {'pass' if check['passed'] else 'FAIL'}")  # fmt: skip
    print(json.dumps(figures))
    return 0 if result["status"] == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
