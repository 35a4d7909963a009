"""`headway plan` and `headway report` end to end through the CLI."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from headway import native
from headway.calibrate.profile import PROFILE_FORMAT
from headway.cli import main

WORKLOAD: dict[str, Any] = {
    "name": "small-plan",
    "duration_s": 100,
    "seed": 3,
    "classes": {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 1200, "cv": 0.8, "max": 8000},
            "output_tokens": {"dist": "lognormal", "mean": 200, "cv": 0.8, "max": 2000},
            "slo": {"ttft_s": 0.5, "tpot_s": 0.04, "attainment_target": 0.9},
        }
    },
    "sources": [
        {
            "name": "users",
            "arrivals": {
                "process": "poisson",
                "rate_per_s": 5,
                "bursts": [{"start_s": 50, "duration_s": 10, "rate_per_s": 20}],
            },
            "peak_rate_per_s": 10,
            "capacity_per_s": 12,
        }
    ],
    "routes": {
        "chat": {
            "model": "llama-3-8b",
            "replica": {"output_tokens_per_s": 1500, "price_per_hour": 3.0},
        }
    },
}
CLUSTER = {"replicas": 4, "model": "llama-3-8b", "gpu": "h100"}
QUICK = ["--seeds", "2", "--point-duration-s", "30"]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    w, c = tmp_path / "w.yaml", tmp_path / "c.yaml"
    w.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    c.write_text(yaml.safe_dump(CLUSTER), encoding="utf-8")
    return w, c


def test_plan_writes_plan_and_report_and_report_rerenders(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, c = files
    out = tmp_path / "out"
    assert (
        main(["plan", str(w), "--cluster", str(c), "--out", str(out), "--jobs", "1", *QUICK]) == 0
    )
    captured = capsys.readouterr()
    text = " ".join(captured.out.replace("│", " ").split())
    # Issue 17: with stderr not a terminal (a log, a pipe), progress is plain lines (rich's
    # bars printed nothing there for a 37-minute plan): each stage as it starts, its end.
    lines = [line for line in captured.err.splitlines() if line.startswith("plan: ")]
    assert any(re.fullmatch(r"plan: [\w ,()-]+: about \d+ points", line) for line in lines), lines
    assert any(re.fullmatch(r"plan: .+: \d+/\d+ points, \d+ s", line) for line in lines), lines
    # A roofline cluster is uncalibrated: the workload's measured 1,500 output tokens/s per
    # replica leads, and the simulation's own count follows, labelled.
    assert re.search(r"\d+ replicas? holds? the peak of 10 tasks/s, from the 1,500 output "
                     r"tokens/s per replica measured in routes.chat.replica", text)  # fmt: skip
    assert re.search(r"Uncalibrated, the simulation \(a roofline of Llama-3-8B on H100-SXM, "
                     r"[\d,]+ output tokens/s per replica at the knee, not your engine\) "
                     r"finds that \d+ replicas? of Llama-3-8B on H100-SXM holds? the peak",
                     text)  # fmt: skip
    assert "Replicas at the peak (10 tasks/s, steady; uncalibrated roofline, ◀ its count)" in text
    # The terminal wraps a long path anywhere (a space or a newline inside the name).
    assert "report.html" in "".join(text.split())
    plan = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    assert plan["schema"] == "headway.plan/1" and plan["complete"] is True
    assert plan["bad_days"]["schema"] == "headway.bad-days/1"
    sim = plan["simulated"]
    assert plan["answer"]["basis"] == "measured" and plan["answer"]["route"] == "chat"
    assert (
        plan["answer"]["replicas"]
        == plan["analytic"]["periods"][-1]["routes"][0]["sizing"]["replicas_with_failover"]
    )
    assert sim["cluster_source"].startswith(str(c))
    assert sim["knee"]["found"] and sim["cost"]["cost_per_successful_task"] > 0
    # Issue 17: the seeds' knees are their own crossings, so the interval has a width.
    knees = [s["knee_tasks_per_s"] for s in sim["knee"]["seeds"]]
    assert len(set(knees)) == len(knees) == 2, knees
    assert sim["knee"]["tasks_per_s_low"] < sim["knee"]["tasks_per_s_high"]
    # Issue 16, defect 14: the knee says which load it scaled (sweep's scales the file).
    knee_line = next(line for line in plan["summary"] if line.startswith("The knee of"))
    assert "a steady load at the peak's mix, bursts left out" in knee_line, knee_line
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and 'data-plot="attainment"' in page
    assert f"The plan leads with <b>{plan['answer']['replicas']}</b>" in page
    assert "In the uncalibrated (a roofline, not your engine) simulation" in page
    assert "retry-storm" in page  # the bad-day matrix is in the report
    again = tmp_path / "again.html"
    assert main(["report", str(out / "plan.json"), "--out", str(again)]) == 0
    assert again.read_text(encoding="utf-8") == page  # rendered from the JSON alone
    # Issue 16, defect 9: an analytic-only plan does not replace the simulated one.
    before = (out / "plan.json").read_bytes()
    assert main(["plan", str(w), "--analytic-only", "--out", str(out)]) == 2
    assert "holds a simulated plan" in capsys.readouterr().err
    assert (out / "plan.json").read_bytes() == before


def test_process_pool_gives_the_same_plan(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    w, _ = files
    plans = []
    for jobs in ("1", "2"):
        assert main(["plan", str(w), "--json", "--jobs", jobs, *QUICK]) == 0
        data = json.loads(capsys.readouterr().out)
        data.pop("created_at")
        plans.append(data)
    assert plans[0] == plans[1]
    assert plans[0]["simulated"]["cluster_source"].startswith("default cluster: llama-3-8b")
    assert any("No --cluster given" in line for line in plans[0]["summary"])


def test_a_profile_reaches_the_workers_of_a_compiled_process_pool(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --profile` and `sweep --profile` with two worker processes, as a vLLM user
    runs them after `calibrate`: compiled, the profile could not be unpickled in the
    workers (BrokenProcessPool). CI installs the compiled build, so this runs compiled
    there; the pool's answer equals the one computed in this process."""
    if os.environ.get("CI") == "true":
        assert native.status().compiled, native.status().reason
    w, _ = files
    profile = tmp_path / "profile.json"
    step_time = {"overhead_s": 0.006, "per_prefill_token_s": 5e-05, "per_decode_seq_s": 0.0003}
    profile.write_text(json.dumps({"format": PROFILE_FORMAT, "step_time": step_time,
                                   "model": "tiny", "engine": "vllm 0.32.0"}))  # fmt: skip
    plans = []
    for jobs in ("2", "1"):
        code = main(["plan", str(w), "--profile", str(profile), "--json", "--jobs", jobs,
                     "--seeds", "1", "--point-duration-s", "20"])  # fmt: skip
        plan = json.loads(capsys.readouterr().out)
        assert code == 0
        plan.pop("created_at")
        plans.append(plan)
    assert plans[0] == plans[1]
    assert plans[0]["simulated"]["cluster"]["profile"]["overhead_s"] == 0.006
    recommended = plans[0]["simulated"]["replica_search"]["recommended"]
    assert recommended >= 1
    # A calibrated profile leads, even though the route declares a capacity.
    assert plans[0]["answer"] == {
        "replicas": recommended,
        "holding_peak": plans[0]["simulated"]["replica_search"]["holding_peak"],
        "basis": "calibrated",
        "route": None,
    }
    # The replicas are the engine the profile measured, not the cluster's roofline model.
    head = plans[0]["summary"][0]
    assert head.startswith(f"Calibrated simulation: {recommended} replica")
    assert " of tiny (vllm 0.32.0) hold" in head and "Llama" not in head, head
    sweeps = []
    for jobs in ("2", "1"):
        code = main(["sweep", str(w), "--profile", str(profile), "--loads", "0.5,1",
                     "--json", "--jobs", jobs])  # fmt: skip
        assert code == 0
        sweeps.append(json.loads(capsys.readouterr().out))
    assert sweeps[0] == sweeps[1] and len(sweeps[0]["points"]) == 2


def test_a_workload_without_a_latency_slo_is_refused_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a latency bound every load meets the SLO: `plan` searched for a knee that
    does not exist, doubling the load up to 4096x (over 10 minutes, no output)."""
    unbounded = {**WORKLOAD, "classes": {"chat": {**WORKLOAD["classes"]["chat"]}}}
    unbounded["classes"]["chat"]["slo"] = {"task_deadline_s": 30}
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(unbounded), encoding="utf-8")
    assert main(["plan", str(w), "--jobs", "1", *QUICK]) == 2
    err = capsys.readouterr().err
    assert "$.classes: no class names a latency SLO" in err
    assert "classes.chat.slo: {ttft_s: 2.0, tpot_s: 0.1}" in err and len(err.splitlines()) == 1
    assert main(["sweep", str(w), "--search", "--jobs", "1"]) == 2
    assert "`sweep --search` has no knee to find" in capsys.readouterr().err
    assert main(["workload", "check", str(w)]) == 0
    assert "warning: classes.chat.slo names no latency bound" in capsys.readouterr().err
    # The analytic plan needs no SLO.
    assert main(["plan", str(w), "--analytic-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == "--analytic-only was given"


def test_a_knee_search_that_the_slo_never_stops_ends_at_saturation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An SLO too loose to break: the search stops once doubling the load adds no
    throughput, and says so, instead of doubling to 4096x."""
    loose = {**WORKLOAD, "duration_s": 20, "classes": {"chat": {**WORKLOAD["classes"]["chat"]}}}
    loose["classes"]["chat"]["slo"] = {"e2e_s": 1e6}
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(loose), encoding="utf-8")
    c = tmp_path / "c.yaml"
    c.write_text(yaml.safe_dump({"replicas": 1, "model": "llama-3-8b", "gpu": "h100"}))
    assert main(["sweep", str(w), "--cluster", str(c), "--search", "--jobs", "1", "--json"]) == 0
    knee = json.loads(capsys.readouterr().out)["knee"]
    assert knee["stopped"] == "saturated" and knee["saturation_calls_per_s"] > 0
    assert knee["load_factor"] < 4096
    assert main(["sweep", str(w), "--cluster", str(c), "--search", "--jobs", "1"]) == 0
    assert "no knee: attainment stays >= 90% up to saturation" in capsys.readouterr().out
    code = main(["plan", str(w), "--cluster", str(c), "--json", "--jobs", "1", "--seeds", "1",
                 "--point-duration-s", "20"])  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["simulated"]["knee"]["seeds"][0]["knee"]["stopped"] == "saturated"
    assert any(
        line.startswith("The SLO does not limit 1 replica: attainment stays at target")
        for line in plan["summary"]
    ), plan["summary"]


def test_an_uncalibrated_count_says_so_in_the_headline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing measured and a default roofline: the count leads, marked uncalibrated."""
    unmeasured = {**WORKLOAD, "duration_s": 30, "routes": {"chat": {"model": "llama-3-8b"}}}
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(unmeasured), encoding="utf-8")
    code = main(["plan", str(w), "--json", "--jobs", "1", "--seeds", "1",
                 "--point-duration-s", "20"])  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    search = plan["simulated"]["replica_search"]
    assert plan["answer"]["basis"] == "uncalibrated"
    assert plan["answer"]["replicas"] == search["recommended"]
    head = f"Uncalibrated simulation: {search['recommended']} replica"
    assert plan["summary"][0].startswith(head)
    assert plan["summary"][1].startswith(
        "Its step times come from a roofline of Llama-3-8B on H100-SXM, not from your engine"
    )


def test_report_rejects_a_file_that_is_not_a_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "sweep.json"
    bad.write_text('{"schema": "headway.sweep/1"}', encoding="utf-8")
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "$.schema" in err and "headway.sweep/1" in err and "headway plan" in err


def test_plan_flags_are_checked(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    w, _ = files
    assert main(["plan", str(w), "--seeds", "0"]) == 2
    assert "--seeds must be >= 1" in capsys.readouterr().err
    assert main(["plan", str(w), "--point-duration-s", "-5"]) == 2
    assert "--point-duration-s must be > 0" in capsys.readouterr().err
    assert main(["plan", str(w), "--stages", "knee,typo"]) == 2
    err = capsys.readouterr().err
    assert "--stages: unknown stage 'typo'" in err and "replicas,knee,bursts,bad-days" in err


def test_stages_choose_what_the_plan_simulates(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--stages replicas,knee` (issue 17): the count and the knee, without the replay of
    the workload as written or the bad-day matrix; the plan says what it left out."""
    w, c = files
    out = tmp_path / "out"
    args = ["plan", str(w), "--cluster", str(c), "--out", str(out), "--jobs", "1", *QUICK]
    assert main([*args, "--stages", "knee,replicas"]) == 0
    capsys.readouterr()
    plan = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    assert plan["complete"] is True
    sim = plan["simulated"]
    assert sim["replica_search"]["recommended"] >= 1 and sim["knee"]["found"]
    assert sim["replay"] is None and sim["bursts"] == [] and plan["bad_days"] is None
    assert (
        "Not run (--stages): bursts, bad-days; this plan holds the other stages only."
        in (plan["summary"])
    )
    assert (out / "report.html").read_text(encoding="utf-8").startswith("<!doctype html>")


REFERENCE = Path(__file__).resolve().parents[2] / "examples" / "reference-assistant.yaml"


def test_growth_names_the_first_resource_to_saturate_and_the_factor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 19, deliverable 6: `plan --growth 10` on the reference assistant names the
    first resource to saturate, the factor, and the replicas tenfold traffic needs."""
    assert main(["plan", str(REFERENCE), "--analytic-only", "--growth", "10", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    growth = plan["growth"]
    assert growth["factor"] == 10 and growth["binding"] == "decode (route assistant)"
    peak = plan["analytic"]["periods"][-1]["routes"][0]
    per_replica = 1200  # the file's routes.assistant.replica.output_tokens_per_s
    expected = peak["sizing"]["replicas"] * per_replica / peak["output_tokens_per_s"]
    assert growth["binding_growth"] == pytest.approx(expected)
    assert growth["routes"][0]["replicas"] == math.ceil(
        10 * peak["output_tokens_per_s"] / (per_replica * 0.7)
    )
    assert main(["plan", str(REFERENCE), "--analytic-only", "--growth", "10"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"decode (route assistant) saturates first, at {expected:.3g}×" in out
    assert f"At 10×: route assistant {growth['routes'][0]['replicas']} replicas" in out
    # Without the flag there is no what-if.
    assert main(["plan", str(REFERENCE), "--analytic-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["growth"] is None


@pytest.mark.parametrize("value", ["0", "-2", "ten", "nan", "inf"])
def test_a_bad_growth_factor_is_refused_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["plan", str(REFERENCE), "--analytic-only", "--growth", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --growth" in err and (repr(value) in err or f" {value} " in err)
    assert "use a growth factor > 0 (10 for tenfold traffic)" in err
