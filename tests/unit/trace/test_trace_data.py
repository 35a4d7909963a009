"""TraceData validates its columns, selects subsets, and detect_tick_s finds coarse clocks."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from headway.core.errors import TraceError
from headway.core.trace_data import TraceData, detect_tick_s


def _trace(**overrides: Any) -> TraceData:
    fields: dict[str, Any] = {
        "name": "t",
        "kind": "generic",
        "arrival_s": np.array([0.0, 1.0, 1.0, 2.5]),
        "input_tokens": np.array([10, 20, 30, 40]),
        "output_tokens": np.array([1, 2, 3, 4]),
    }
    fields.update(overrides)
    return TraceData(**fields)


def test_valid_trace_normalises_dtypes() -> None:
    trace = _trace(input_tokens=np.array([10, 20, 30, 40], dtype=np.int32))
    assert len(trace) == 4
    assert trace.input_tokens.dtype == np.int64
    assert trace.arrival_s.dtype == np.float64


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"input_tokens": np.array([1, 2, 3])}, "input_tokens has shape"),
        ({"output_tokens": np.array([1, 2, -3, 4])}, "output_tokens of request 2 is -3"),
        ({"output_tokens": np.array([1.0, 2.0, 3.0, 4.0])}, "must hold integers"),
        ({"arrival_s": np.array([0.0, 2.0, 1.0, 3.0])}, "not sorted (request 2"),
        ({"arrival_s": np.array([0.0, np.nan, 1.0, 3.0])}, "NaN"),
        ({"arrival_s": np.array(["a", "b", "c", "d"])}, "1-D array of seconds"),
        ({"tenant": np.array(["a", "b"], dtype=object)}, "tenant has shape"),
        ({"priority": np.array(["critical"] * 3 + ["urgent"], dtype=object)}, "'urgent'"),
        ({"hash_ids": (np.array([1]),)}, "hash_ids has 1 entries for 4 requests"),
        ({"hash_ids": tuple(np.array([i]) for i in range(4))}, "positive hash_block_tokens"),
        ({"hash_block_tokens": 512}, "hash_block_tokens is set but hash_ids is not"),
    ],
)
def test_invalid_columns_raise(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(TraceError, match="trace 't'") as info:
        _trace(**overrides)
    assert message in str(info.value)


def test_select_by_mask_keeps_times_and_labels_that_still_apply() -> None:
    trace = _trace(
        tenant=np.array(["a", "b", "a", "b"], dtype=object),
        hash_ids=tuple(np.array([0, i]) for i in range(4)),
        hash_block_tokens=512,
        first_timestamp="2023-11-16 18:00:00",
        last_timestamp="2023-11-16 18:00:02.5",
    )
    assert trace.tenant is not None
    mask = trace.tenant == "b"
    subset = trace.select(mask)
    assert len(subset) == 2
    np.testing.assert_array_equal(subset.arrival_s, [1.0, 2.5])
    np.testing.assert_array_equal(subset.input_tokens, [20, 40])
    assert subset.tenant is not None
    assert list(subset.tenant) == ["b", "b"]
    assert subset.hash_ids is not None
    assert [list(h) for h in subset.hash_ids] == [[0, 1], [0, 3]]
    assert subset.first_timestamp is None  # the subset no longer starts at the first request
    assert subset.last_timestamp == "2023-11-16 18:00:02.5"


def test_select_by_indices_sorts_and_allows_repeats() -> None:
    trace = _trace()
    subset = trace.select([3, 0, 3])
    np.testing.assert_array_equal(subset.arrival_s, [0.0, 2.5, 2.5])
    np.testing.assert_array_equal(subset.output_tokens, [1, 4, 4])
    assert len(trace.select(np.array([], dtype=np.int64))) == 0


@pytest.mark.parametrize(
    ("pick", "message"),
    [
        (np.array([True, False]), "one entry per request"),
        ([0, 4], "out of range"),
        ([-1], "out of range"),
        (np.array([0.5]), "boolean mask or integer indices"),
    ],
)
def test_select_rejects_bad_picks(pick: Any, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        _trace().select(pick)


def test_detect_tick_finds_quantised_clock() -> None:
    ticks_s = np.repeat(np.arange(50) * 3.0, 10)  # 90 % zero gaps, 3 s apart
    ticks_s[10:] += np.repeat(np.linspace(-0.003, 0.003, 49), 10)
    tick_s = detect_tick_s(np.sort(ticks_s))
    assert tick_s is not None
    assert tick_s == pytest.approx(3.0, abs=0.004)


@pytest.mark.parametrize(
    "arrival_s",
    [
        np.cumsum(np.random.default_rng(1).exponential(1.0, 500)),  # Poisson: no zero gaps
        np.repeat([0.0, 1.0, 5.0, 6.0, 20.0], 5),  # zero gaps, but uneven positive gaps
        np.zeros(10),  # no positive gap at all
        np.array([0.0]),
        np.array([0.0, 0.0, 1.0, 2.0, 3.0, 4.0]),  # only 20 % zero gaps
    ],
)
def test_detect_tick_returns_none(arrival_s: npt.NDArray[np.float64]) -> None:
    assert detect_tick_s(arrival_s) is None
