"""trace_stats reproduces shared/traces/trace_stats.json; small cases checked by hand."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats

from headway.cli import main
from headway.core.errors import TraceError
from headway.core.trace_data import TraceData
from headway.trace.readers import read_trace
from headway.trace.stats import format_timestamp_label, trace_stats
from shared_data import TRACES, require_shared

TRACES_DIR = TRACES

# trace_stats.json name -> shipped file (TraceData.name drops a trailing "_trace", as the
# json does).
TRACE_FILES = {
    "azure_llm_2023_code": "azure_llm_2023_code.csv.gz",
    "azure_llm_2023_conv": "azure_llm_2023_conv.csv.gz",
    "mooncake_fast25_conversation": "mooncake_fast25_conversation_trace.jsonl.gz",
    "mooncake_fast25_synthetic": "mooncake_fast25_synthetic_trace.jsonl.gz",
}
EXACT_KEYS = {
    "kind", "n_requests", "total_input_tokens", "total_output_tokens", "unique_blocks",
    "hash_block_tokens", "timestamp_resolution_note", "first_timestamp", "last_timestamp",
}  # fmt: skip
# Values that may sit near zero: compared with an absolute tolerance as well.
NEAR_ZERO_KEYS = {
    "corr_in_out_pearson", "corr_in_out_spearman", "corr_log_in_log_out_pearson",
    "iat_frac_zero_gaps", "frac_output_zero", "frac_input_zero", "iat_cv_positive_gaps_only",
}  # fmt: skip


def _traces_dir() -> Path:
    require_shared(TRACES_DIR / "trace_stats.json")
    return TRACES_DIR


@functools.cache
def _expected() -> dict[str, dict[str, object]]:
    rows = json.loads((TRACES_DIR / "trace_stats.json").read_text("utf-8"))
    return {row["name"]: row for row in rows}


@functools.cache
def _computed(name: str) -> dict[str, object]:
    return trace_stats(read_trace(TRACES_DIR / TRACE_FILES[name]))


def _close(key: str, got: object, want: object) -> bool:
    if not isinstance(got, int | float) or not isinstance(want, int | float):
        return False
    abs_tol = 0.005 if key in NEAR_ZERO_KEYS else 1e-12
    return math.isclose(float(got), float(want), rel_tol=0.005, abs_tol=abs_tol)


@pytest.mark.parametrize("name", sorted(TRACE_FILES))
def test_stats_reproduce_trace_stats_json(name: str) -> None:
    _traces_dir()
    want, got = _expected()[name], _computed(name)
    assert list(got) == list(want), "keys or key order differ"
    problems = []
    for key, want_value in want.items():
        got_value = got[key]
        if key in EXACT_KEYS or key == "name":
            ok = got_value == want_value
        elif isinstance(want_value, dict):
            assert isinstance(got_value, dict)
            ok = got_value.keys() == want_value.keys() and all(
                _close(key, got_value[k], v) for k, v in want_value.items()
            )
        else:
            ok = _close(key, got_value, want_value)
        if not ok:
            problems.append(f"{key}: got {got_value!r}, trace_stats.json has {want_value!r}")
    assert not problems, "\n".join(problems)


def test_cli_json_on_shipped_trace(capsys: pytest.CaptureFixture[str]) -> None:
    path = _traces_dir() / TRACE_FILES["mooncake_fast25_synthetic"]
    assert main(["trace", "stats", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = _expected()["mooncake_fast25_synthetic"]
    assert out["n_requests"] == want["n_requests"] == 3993
    assert out["unique_blocks"] == want["unique_blocks"]
    assert out["prefix_hit_ratio_tokens_infinite_cache"] == pytest.approx(0.6512, abs=1e-4)


# --- hand-checked small traces ---------------------------------------------------------------


def _trace(arrival_s: list[float], **extra: Any) -> TraceData:
    n = len(arrival_s)
    fields: dict[str, Any] = {
        "input_tokens": np.full(n, 100, dtype=np.int64),
        "output_tokens": np.arange(n, dtype=np.int64),
    }
    fields.update(extra)
    return TraceData(name="t", kind="generic", arrival_s=np.array(arrival_s), **fields)


def test_bins_gaps_and_rates_by_hand() -> None:
    # 1 s bins [0,1) [1,2) [2,3): counts 3, 1, 1 (the last bin is partial and counts).
    stats = trace_stats(_trace([0.0, 0.5, 0.9, 1.2, 2.5]))
    assert stats["duration_s"] == 2.5
    assert stats["mean_rate_rps"] == 1.6  # (5 - 1) / 2.5
    assert stats["peak_rate_1s_rps"] == 3.0
    assert stats["peak_to_mean_1s"] == 1.88  # 3 / 1.6
    assert stats["index_of_dispersion_1s"] == 0.533  # population var 8/9 over mean 5/3
    assert stats["peak_rate_60s_rps"] == round(5 / 60, 3)
    assert stats["index_of_dispersion_60s"] == 0.0
    assert stats["iat_frac_zero_gaps"] == 0.0
    assert stats["iat_p50_s"] == pytest.approx(0.45)  # gaps 0.5 0.4 0.3 1.3
    assert stats["timestamp_resolution_note"] == "min positive gap 0.3 s"
    assert stats["input_tokens"] == {
        "mean": 100.0, "p50": 100.0, "p90": 100.0, "p99": 100.0, "max": 100.0, "min": 100.0,
    }  # fmt: skip
    assert stats["corr_in_out_pearson"] is None  # constant input: undefined, not NaN
    assert stats["total_output_tokens"] == 10
    assert stats["mean_output_tok_per_s"] == 4.0
    assert "first_timestamp" not in stats
    assert "unique_blocks" not in stats


def test_prefix_hits_by_hand() -> None:
    hash_ids = tuple(np.array(ids) for ids in ([0, 1, 2], [0, 1, 5], [0, 9], [7], [4, 4]))
    trace = _trace(
        [0.0, 1.0, 2.0, 3.0, 4.0],
        input_tokens=np.array([1500, 1200, 600, 100, 1024]),
        hash_ids=hash_ids,
        hash_block_tokens=512,
    )
    stats = trace_stats(trace)
    # hits per request: 0, 2 (0 1, then 5 misses), 1 (0, then 9), 0, 0 (4 is new to all
    # earlier requests, even though the request repeats it)
    assert stats["unique_blocks"] == 7
    assert stats["prefix_hit_ratio_blocks_infinite_cache"] == round(3 / 11, 4)
    assert stats["prefix_hit_ratio_tokens_infinite_cache"] == round((1024 + 512) / 4424, 4)
    assert stats["frac_requests_with_any_prefix_hit"] == 0.4


def test_spearman_uses_average_ranks_like_scipy() -> None:
    rng = np.random.default_rng(3)
    inputs = rng.integers(0, 20, 300)  # many ties
    outputs = inputs // 2 + rng.integers(0, 10, 300)
    trace = _trace(list(np.arange(300.0)), input_tokens=inputs, output_tokens=outputs)
    stats = trace_stats(trace)
    want = scipy_stats.spearmanr(inputs, outputs).statistic
    assert stats["corr_in_out_spearman"] == round(float(want), 4)
    assert stats["corr_in_out_pearson"] == round(float(np.corrcoef(inputs, outputs)[0, 1]), 4)


def test_single_request_and_empty_trace() -> None:
    stats = trace_stats(_trace([0.0]))
    assert stats["duration_s"] == 0.0
    assert stats["mean_rate_rps"] is None
    assert stats["iat_cv"] is None
    assert stats["peak_rate_1s_rps"] == 1.0
    json.dumps(stats)  # every value is JSON-serialisable
    with pytest.raises(TraceError, match="no requests"):
        trace_stats(_trace([0.0]).select(np.array([False])))


@pytest.mark.parametrize(
    ("label", "shown"),
    [
        ("2023-11-16 18:17:03.9799600", "2023-11-16 18:17:03.979960"),
        ("2023-11-16 18:17:03.9799601", "2023-11-16 18:17:03.979960100"),
        ("2023-11-16T18:17:03.5", "2023-11-16 18:17:03.500000"),
        ("2023-11-16 18:17:03.0000000", "2023-11-16 18:17:03"),
        ("2023-11-16 18:17:03", "2023-11-16 18:17:03"),
        ("yesterday", "yesterday"),
    ],
)
def test_format_timestamp_label(label: str, shown: str) -> None:
    assert format_timestamp_label(label) == shown


# --- the CLI ---------------------------------------------------------------------------------


def _generic_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text("timestamp_s,input_tokens,output_tokens\n0,10,1\n0.5,20,2\n2,30,3\n")
    return path


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(_generic_file(tmp_path)), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert captured.out.startswith('{\n "name": "small",')  # indent 1, like trace_stats.json
    assert out["n_requests"] == 3
    assert out["duration_s"] == 2.0
    assert out["input_tokens"]["p50"] == 20.0


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(_generic_file(tmp_path)), "--format", "generic"]) == 0
    out = capsys.readouterr().out
    assert "small (generic)" in out
    assert "mean_rate_rps" in out
    assert "input_tokens.p50" in out


def test_cli_maps_trace_error_to_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp_s,input_tokens,output_tokens\n0,ten,1\n")
    assert main(["trace", "stats", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headway: error: ")
    assert "line 2: column `input_tokens` has 'ten'" in err


def test_per_tenant_shares_concentration_and_burstiness() -> None:
    """A dominant tenant of 1-token calls, a bursty heavy one, a tail of 20 small ones:
    `trace stats` reports each large tenant's shares, rate, CV and lengths, and the
    concentration of requests and tokens (the aggregate hid all three)."""
    rng = np.random.default_rng(3)
    light = np.sort(rng.uniform(0, 600, 6000))
    bursts = np.concatenate([rng.uniform(s, s + 5, 150) for s in range(0, 600, 100)])
    tail = rng.uniform(0, 600, 400)
    times = np.concatenate([light, bursts, tail])
    tenant = np.array(["light"] * light.size + ["bursty"] * bursts.size
                      + [f"t{i % 20}" for i in range(tail.size)], dtype=object)  # fmt: skip
    inputs = np.concatenate([np.full(light.size, 100), np.full(bursts.size, 4000),
                             np.full(tail.size, 500)])  # fmt: skip
    outputs = np.concatenate([np.full(light.size, 1), np.full(bursts.size, 400),
                              np.full(tail.size, 50)])  # fmt: skip
    order = np.argsort(times, kind="stable")
    trace = TraceData(
        name="mt",
        kind="generic",
        arrival_s=times[order] - times.min(),
        input_tokens=inputs[order].astype(np.int64),
        output_tokens=outputs[order].astype(np.int64),
        tenant=tenant[order],
    )
    stats = trace_stats(trace)
    assert stats["n_tenants"] == 22
    requests = stats["tenant_request_concentration"]
    assert isinstance(requests, dict) and requests["top1"] == round(6000 / 7300, 4)
    tokens = stats["tenant_token_concentration"]
    assert isinstance(tokens, dict) and tokens["top1"] > 0.8  # the bursty tenant's tokens
    tenants = stats["tenants"]
    assert isinstance(tenants, dict) and list(tenants)[:2] == ["light", "bursty"]
    light_t, bursty_t = tenants["light"], tenants["bursty"]
    assert light_t["output_tokens_p50"] == 1.0 and bursty_t["output_tokens_p50"] == 400.0
    assert bursty_t["iat_cv"] > 3 > light_t["iat_cv"]  # bursts of 150 in 5 s every 100 s
    assert abs(light_t["mean_rate_rps"] - 10.0) < 0.5
    assert len(tenants) == 10  # the 10 largest by requests (the same 10 by tokens)
