"""`headway simulate --bad-days` end to end: the matrix table, bad-days.json, determinism
and the errors for unknown names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headway.cli import main

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "examples" / "overload.yaml"
CLUSTER = ROOT / "examples" / "clusters" / "overload.yaml"
SCENARIOS = ["baseline", "replica-lost-decode", "long-prompts", "tenant-burst+cache-cold"]
PRESETS = ["fifo-unbounded", "headway-default"]


def _args(*extra: str) -> list[str]:
    return [
        "simulate", str(WORKLOAD), "--cluster", str(CLUSTER), "--bad-days",
        "--scenarios", ",".join(SCENARIOS), "--jobs", "2", "--duration-s", "60", *extra,
    ]  # fmt: skip


def test_bad_days_table_json_and_determinism(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(_args("--out", str(out))) == 0
    table = capsys.readouterr().out
    assert "overload: bad days at 1× load, 60 s" in table
    for name in [*SCENARIOS, *PRESETS, "goodput/s", "TTFT p99", "amplif", "$/task"]:
        assert name in table
    assert f"wrote {out / 'bad-days.json'}" in table
    written = (out / "bad-days.json").read_text()
    matrix = json.loads(written)
    assert matrix["schema"] == "headway.bad-days/1"
    assert matrix["presets"] == PRESETS
    assert [s["name"] for s in matrix["scenarios"]] == SCENARIOS
    cells = [(c["scenario"], c["preset"]) for c in matrix["cells"]]
    assert cells == [(s, p) for s in SCENARIOS for p in PRESETS]
    assert all(c["balanced"] for c in matrix["cells"])
    base = matrix["cells"][0]
    longer = matrix["cells"][SCENARIOS.index("long-prompts") * len(PRESETS)]
    assert longer["goodput_per_s"] < base["goodput_per_s"]  # twice the prompts, same replica

    assert main(_args("--json")) == 0  # the same seed: the same matrix, byte for byte
    assert capsys.readouterr().out == written


def test_unknown_names_exit_2_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", str(WORKLOAD), "--cluster", str(CLUSTER), "--bad-days"]
    assert main([*args, "--scenarios", "baseline,retry-strom"]) == 2
    assert "did you mean 'retry-storm'" in capsys.readouterr().err
    assert main([*args, "--presets", "fifo"]) == 2
    assert "did you mean 'fifo-unbounded'" in capsys.readouterr().err
    assert main(["simulate", str(WORKLOAD), "--scenarios", "baseline"]) == 2
    assert "add --bad-days" in capsys.readouterr().err


def test_executor_flags_are_checked_like_plans(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", str(WORKLOAD), "--cluster", str(CLUSTER)]
    for verb in (["plan", str(WORKLOAD)], [*args, "--bad-days"]):
        with pytest.raises(SystemExit) as exited:  # a usage error, found at parse
            main([*verb, "--executor", "dask"])
        assert exited.value.code == 2
        assert "argument --executor: invalid choice: 'dask'" in capsys.readouterr().err
    assert main([*args, "--executor", "ray"]) == 2
    assert "--executor only apply to the matrix; add --bad-days" in capsys.readouterr().err
    assert main([*args, "--bad-days", "--jobs", "0"]) == 2
    assert "--jobs must be >= 1 (got 0)" in capsys.readouterr().err
