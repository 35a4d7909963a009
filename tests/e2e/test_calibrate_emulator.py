"""`headway calibrate` against `headway emulate`: it recovers the emulator's step-time
parameters, and `simulate` and `emulate` accept the profile it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from headway.calibrate.profile import PROFILE_FORMAT, read_profile
from headway.cli import main
from headway.emulate.parity import emulator_lag_max_s
from headway.emulate.process import EmulatorProcess

MAX_LAG_S = 0.03
"""Wall seconds the emulator may fall behind real time for its timings to be the model's."""

TRUTH = {
    "overhead_s": 0.005,
    "per_prefill_token_s": 6e-05,
    "per_prefill_pair_s": 2e-09,
    "per_decode_seq_s": 0.00025,
    "per_decode_kv_token_s": 3e-07,
}
"""A Llama-3-8B-like H100 profile: every term matters somewhere in the probe plan."""

WORKLOAD = {
    "name": "tiny",
    "duration_s": 20,
    "seed": 1,
    "classes": {
        "chat": {
            "input_tokens": 500,
            "output_tokens": 50,
        }
    },
    "sources": [{"name": "users", "arrivals": {"process": "poisson", "rate_per_s": 2}}],
}


@pytest.fixture
def truth_file(tmp_path: Path) -> Path:
    path = tmp_path / "truth.json"
    path.write_text(json.dumps({"format": PROFILE_FORMAT, "step_time": TRUTH}), encoding="utf-8")
    return path


def _calibrate(truth_file: Path, out: Path) -> float:
    """Calibrate against an emulator of ``truth_file``; returns the emulator's largest lag
    behind real time (a busy machine delays its tokens, which the fit then reads as
    slower steps)."""
    with EmulatorProcess(["--profile", str(truth_file), "--speedup", "4"]) as emu:
        code = main(["calibrate", "--target", emu.url, "--out", str(out),
                     "--decode-concurrency", "2,4,8", "--json"])  # fmt: skip
        lag_s = emulator_lag_max_s(emu.url)
    assert code == 0
    return lag_s


def test_calibration_recovers_the_emulator_parameters(
    truth_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "profile.json"
    if _calibrate(truth_file, out) > MAX_LAG_S:  # the machine was busy: once more
        capsys.readouterr()
        _calibrate(truth_file, out)
    printed = json.loads(capsys.readouterr().out)
    profile = read_profile(out)
    assert printed["step_time"] == json.loads(out.read_text())["step_time"]
    assert profile.model == "llama-3-8b" and profile.engine.startswith("headway-emulate")
    assert profile.fit.time_scale == 4 and profile.created_utc.endswith("Z")
    errors = {
        name: abs(getattr(profile.step_time, name) - value) / value for name, value in TRUTH.items()
    }
    # Wall-clock probes on a shared machine: the test allows 15% so a busy CI host does
    # not fail it; benchmarks/parity.py measures the 5% target (0.4-0.7% when quiet).
    assert max(errors.values()) <= 0.15, errors

    # The profile drives the simulator (a cluster file naming it) and the emulator.
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"profile": "profile.json"}), encoding="utf-8")
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    assert main(["simulate", str(workload), "--cluster", str(cluster), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["calls"] > 10
    with EmulatorProcess(["--profile", str(out), "--speedup", "50"]) as again:
        assert again.url.startswith("http://127.0.0.1:")


def test_unreachable_target_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["calibrate", "--target", "http://127.0.0.1:9", "--out",
                 str(tmp_path / "p.json")])  # fmt: skip
    assert code == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


def test_a_bad_profile_file_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": PROFILE_FORMAT, "step_time": {"overhead_s": -1}}))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"profile": str(bad)}), encoding="utf-8")
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    assert main(["simulate", str(workload), "--cluster", str(cluster)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "overhead_s" in err


def test_simulate_and_plan_take_a_profile_flag(
    truth_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    assert main(["simulate", str(workload), "--json"]) == 0
    roofline = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(workload), "--profile", str(truth_file), "--json"]) == 0
    profiled = json.loads(capsys.readouterr().out)
    # The same calls, other step times: the profile replaced the roofline.
    assert profiled["calls"] == roofline["calls"]
    assert profiled["latencies"]["tpot"]["p50_s"] != roofline["latencies"]["tpot"]["p50_s"]
    code = main(["plan", str(workload), "--profile", str(truth_file), "--json",
                 "--seeds", "1", "--point-duration-s", "20", "--jobs", "1"])  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and "profile" in plan["simulated"]["cluster_source"]
    assert plan["simulated"]["cluster"]["step_time"] == "profile"
    missing = main(["simulate", str(workload), "--profile", str(tmp_path / "nope.json")])
    assert missing == 2
