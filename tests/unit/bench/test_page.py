"""The HTML pages render any result, escape names, and draw the series."""

from __future__ import annotations

from headway.bench.page import render_run, render_sweep
from headway.bench.records import OK, CallRecords
from headway.bench.series import per_second
from headway.bench.summary import Budgets, Cost, Outcomes, summarize_run
from headway.core.workload.compile import compile_workload
from headway.files.jsonout import to_builtins
from headway.files.workload import parse_workload


def _result() -> tuple[dict[str, object], CallRecords]:
    spec = parse_workload(
        {
            "name": "<script>x</script>",
            "duration_s": 3,
            "classes": {"c": {"input_tokens": 5, "output_tokens": 4, "slo": {"ttft_s": 1}}},
            "sources": [{"name": "u", "arrivals": {"process": "constant", "rate_per_s": 5}}],
        }
    )
    w = compile_workload(spec)
    r = CallRecords.empty(w.num_calls)
    r.scheduled_s[:] = w.task_arrival_s
    r.sent_s[:] = r.scheduled_s + 0.001
    r.first_byte_s[:] = r.first_token_s[:] = r.scheduled_s + 0.01
    r.last_token_s[:] = r.end_s[:] = r.scheduled_s + 0.02
    r.error[:] = OK
    r.error[0] = 3  # one refused call: no latencies of its own
    r.completion_tokens[:] = 4
    cost = Cost(workers=1, loop="uvloop", connections_prefilled=2, run_cpu_s=0.1,
                cpu_ms_per_request=None, total_cpu_s=0.2, startup_s=0.3, wall_s=3.0)  # fmt: skip
    outcomes = Outcomes(calls=w.num_calls, by_error={"ok": w.num_calls - 1, "status": 1},
                        by_status={"200": w.num_calls - 1, "429": 1}, connects=2,
                        connect_errors=0, resent=0, max_open_connections=2)  # fmt: skip
    res = summarize_run(w, r, target="http://t", model="m", endpoint="chat", load_factor=1.0,
                        cost=cost, outcomes=outcomes, budgets=Budgets())  # fmt: skip
    return to_builtins(res), r


def test_run_page_escapes_and_draws() -> None:
    result, records = _result()
    series = per_second(records)
    assert sum(series["scheduled"]) == len(records.scheduled_s)
    page = render_run(result, series)
    assert "<script>x</script>" not in page and "&lt;script&gt;" in page
    assert page.count("<svg") == 2 and "HTTP 429" in page
    assert "<svg" not in render_run(result, {})  # no series: a note instead of a chart


def test_sweep_page_states_the_knee() -> None:
    points = [
        {"load_factor": f, "offered_calls_per_s": 10 * f, "slo_attainment": a,
         "goodput_per_s": 9 * f, "ttft_p99_s": None, "lateness_p99_s": 0.001,
         "sender_ok": True}
        for f, a in ((1.0, 1.0), (2.0, 0.95), (4.0, 0.2))
    ]  # fmt: skip
    knee = {"target": 0.9, "load_factor": 2.0, "upper_load_factor": 4.0,
            "offered_calls_per_s": 20.0, "offered_tasks_per_s": 20.0, "found": True}  # fmt: skip
    page = render_sweep(
        {"workload": "w", "target": "t", "points": points, "knee": knee, "sender_limited": True}
    )
    assert "knee at ×2" in page and "generator" in page
