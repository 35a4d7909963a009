"""examples/overload.yaml past its knee through `headway simulate --json`, both presets.

The knee of the example (fifo-unbounded, 300 s) is at load ~0.8 (benchmarks/overload.py
finds it); these runs use two simulated minutes at ~3× and ~5× of it and check what holds
by design: the baseline sheds nothing and collapses, headway-default sheds at arrival,
keeps more goodput and the critical class, and every offered call is accounted for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from headway.cli import main

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "examples" / "overload.yaml"
CLUSTER = ROOT / "examples" / "clusters" / "overload.yaml"
KNEE = 0.8
MAX_RETRY_AFTER_S = 60.0
"""``AdmissionConfig.max_retry_after_s``'s default: every Retry-After is capped at it."""


def _simulate(
    preset: str, load: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], Any]:
    cluster = yaml.safe_load(CLUSTER.read_text(encoding="utf-8"))
    cluster["gateway"] = {"preset": preset}
    path = tmp_path / f"{preset}-{load}.yaml"
    path.write_text(yaml.safe_dump(cluster), encoding="utf-8")
    out = tmp_path / f"out-{preset}-{load}"
    args = ["simulate", str(WORKLOAD), "--cluster", str(path), "--load", str(load),
            "--duration-s", "120", "--json", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    return json.loads(capsys.readouterr().out), np.load(out / "records.npz")


def _attainment(result: dict[str, Any], priority: str) -> float:
    return next(g["slo_attainment"] for g in result["by_priority"] if g["name"] == priority)


def _check_accounting(result: dict[str, Any], records: Any) -> None:
    acc = result["accounting"]
    ends = acc["completed"] + acc["shed"] + acc["cancelled"] + acc["timed_out"] + acc["failed"]
    assert acc["balanced"]
    assert ends == acc["offered_calls"] == result["calls"]
    assert acc["attempts"] == int(records["attempts"].sum())
    assert acc["shed"] == sum(acc["shed_by_reason"].values())


def test_three_times_the_knee(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo, fifo_records = _simulate("fifo-unbounded", 3 * KNEE, tmp_path, capsys)
    gate, gate_records = _simulate("headway-default", 3 * KNEE, tmp_path, capsys)
    for result, records in ((fifo, fifo_records), (gate, gate_records)):
        _check_accounting(result, records)
    # The baseline refuses nothing and serves everything late.
    assert fifo["accounting"]["shed"] == 0
    assert fifo["accounting"]["amplification"] == 1.0
    assert fifo["completed_calls"] == fifo["calls"]
    # headway-default refuses at arrival (deadline_unmeetable), never after a wait in its
    # line (a call that overruns its deadline in an engine is cancelled there: timed out,
    # dispatched) ...
    assert gate["accounting"]["shed_by_reason"].get("deadline_unmeetable", 0) > 0
    names = list(gate_records["outcome_names"])
    timed_out = gate_records["outcome"] == names.index("timed_out")
    assert not (timed_out & np.isnan(gate_records["dispatch_s"])).any()
    # ... so what it serves meets its SLO: more goodput, the critical class kept.
    assert gate["slo"]["goodput_per_s"] > 2 * fifo["slo"]["goodput_per_s"]
    assert _attainment(gate, "critical") >= 0.99 > _attainment(fifo, "critical")
    assert gate["latencies"]["ttft"]["p99_s"] < fifo["latencies"]["ttft"]["p99_s"]
    # The retry budget bounds the clients' retries to 10% of requests (plus a minimum).
    assert gate["accounting"]["amplification"] <= 1.2


def test_saturation_retry_after_is_finite_and_capped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, records = _simulate("headway-default", 5 * KNEE, tmp_path, capsys)
    _check_accounting(result, records)
    names = list(records["outcome_names"])
    reasons = list(records["shed_reason_names"])
    shed = records["outcome"] == names.index("shed")
    retry_after = records["retry_after_s"][shed]
    reason = records["shed_reason"][shed]
    # A full queue answers with a finite Retry-After from its drain rate, within the cap.
    full = reason == reasons.index("queue_full")
    assert full.any()
    assert np.isfinite(retry_after[full]).all()
    assert ((retry_after[full] >= 0) & (retry_after[full] <= MAX_RETRY_AFTER_S)).all()
    # Every Retry-After sent is within the cap; a missing one means no retry can help.
    sent = retry_after[np.isfinite(retry_after)]
    assert ((sent >= 0) & (sent <= MAX_RETRY_AFTER_S)).all()
    # Clients retried some refusals, within the budget (20% of requests, at least 3).
    assert 1.0 < result["accounting"]["amplification"] <= 1.2
    assert int(records["attempts"].max()) <= 3  # clients.retries.max_attempts
