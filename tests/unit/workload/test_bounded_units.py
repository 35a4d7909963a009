"""Background work in bounded units (issue 19, deliverable 3; seed 000: "large backfill
requests divided into bounded units"): a call past ``max_unit_tokens`` becomes units of at
most that many tokens, run one after another, its tokens divided among them."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from headway.core.errors import WorkloadError
from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import ClusterSpec
from headway.sim.run import simulate


def _spec(**backfill: Any) -> Any:
    return parse_workload(
        {
            "name": "backfill",
            "duration_s": 60,
            "seed": 8,
            "classes": {
                "chat": {
                    "input_tokens": 300,
                    "output_tokens": 60,
                    "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
                },
                "backfill": {
                    "priority": "background",
                    "input_tokens": {"dist": "lognormal", "mean": 12000, "cv": 0.5},
                    "output_tokens": 400,
                    "tools_per_call": 1,
                    "tool_latency_s": 0.5,
                    "calls": 2,
                    **backfill,
                },
            },
            "sources": [
                {
                    "name": "users",
                    "arrivals": {"process": "poisson", "rate_per_s": 4},
                    "mix": {"chat": 1},
                },
                {
                    "name": "ingest",
                    "arrivals": {"process": "poisson", "rate_per_s": 0.5},
                    "mix": {"backfill": 1},
                },
            ],
        }
    )


def test_a_large_call_becomes_bounded_units_with_its_tokens() -> None:
    whole = compile_workload(_spec())
    split = compile_workload(_spec(max_unit_tokens=2048))
    k = whole.class_names.index("backfill")
    big, small = whole.task_class[whole.call_task] == k, split.task_class[split.call_task] == k
    tokens = split.call_input_tokens + split.call_output_tokens
    assert tokens[small].max() <= 2048 + 1  # evenly divided, a token of rounding at most
    assert small.sum() > 4 * big.sum()  # ~12,400 tokens a call: about 7 units each
    # Every token is still asked for: the units carry the call's prompt and output.
    assert split.call_input_tokens[small].sum() == whole.call_input_tokens[big].sum()
    assert split.call_output_tokens[small].sum() >= whole.call_output_tokens[big].sum()
    # One after another, the tool call after the last unit of each original call only.
    assert (split.call_branch[small] == 0).all()
    tools = split.call_tool_after_s[small]
    assert (tools > 0).sum() == (whole.call_tool_after_s[big] > 0).sum()
    # The interactive class is untouched.
    chat = whole.class_names.index("chat")
    same = whole.task_class[whole.call_task] == chat
    assert np.array_equal(
        whole.call_input_tokens[same],
        split.call_input_tokens[split.task_class[split.call_task] == chat],
    )


def test_bounded_units_keep_the_interactive_tail_lower() -> None:
    """The point of bounding them: no backfill prefill of 12k tokens in one step beside
    the interactive calls."""
    cluster = msgspec.convert(
        {"replicas": 1, "model": "llama-3-8b", "gpu": "h100",
         "engine": {"max_num_batched_tokens": 16384}}, ClusterSpec
    )  # fmt: skip
    whole, _, _ = simulate(_spec(), cluster)
    split, _, _ = simulate(_spec(max_unit_tokens=2048), cluster)

    def chat_ttft_p99(result: Any) -> float:
        return next(g for g in result.by_class if g.name == "chat").latencies.ttft.p99_s

    assert chat_ttft_p99(split) < chat_ttft_p99(whole)
    assert split.accounting.balanced and split.slo.tasks_completed > 0


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"max_unit_tokens": 1}, "`max_unit_tokens` must be >= 2"),
        ({"max_unit_tokens": 1000, "parallel_branches": 2}, "needs `parallel_branches: 1`"),
    ],
)
def test_bad_units_are_refused_by_name(extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(WorkloadError) as info:
        _spec(**extra)
    assert fragment in str(info.value)
