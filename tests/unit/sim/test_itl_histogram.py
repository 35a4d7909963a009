"""The simulator bins token gaps as it records them: the counts must be exactly those of
``np.histogram`` over the same weighted gaps (the edges decide, not the log)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from headway.sim.recording import _ITL_EDGES, Recording

EDGES = _ITL_EDGES.tolist()

# Gaps on and next to the edges (the log's rounding is wrong there first), anywhere in
# and out of the range, and NaN.
on_edges = st.integers(0, len(EDGES) - 1).flatmap(
    lambda i: st.sampled_from(
        [EDGES[i], math.nextafter(EDGES[i], 0.0), math.nextafter(EDGES[i], math.inf)]
    )
)
gaps = st.one_of(
    on_edges,
    st.floats(1e-6, 2e3, allow_nan=False),
    st.sampled_from([0.0, -1.0, math.nan, math.inf, 1e-5, 1e3]),
)


def binned(values: list[tuple[float, int]]) -> list[int]:
    recording = Recording()
    recording._init_records(0)
    for gap, tokens in values:
        recording._count_itl(gap, tokens)
    return list(recording._itl_counts)


@given(st.lists(st.tuples(gaps, st.integers(1, 10**6)), max_size=200))
def test_counts_equal_numpys_weighted_histogram(values: list[tuple[float, int]]) -> None:
    expected = np.zeros(len(EDGES) - 1, dtype=np.int64)
    if values:
        counts, _ = np.histogram(
            np.array([g for g, _ in values]), _ITL_EDGES, weights=[float(w) for _, w in values]
        )
        expected = np.rint(counts).astype(np.int64)
    assert binned(values) == expected.tolist()


def test_every_edge_opens_its_own_bin_and_the_last_is_closed() -> None:
    counts = binned([(edge, 1) for edge in EDGES])
    assert counts[:-1] == [1] * (len(EDGES) - 2)
    assert counts[-1] == 2  # the last two edges both count in the last bin
