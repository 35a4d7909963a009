"""Summary statistics of a request trace, as printed by ``headway trace stats``.

The keys, definitions and rounding are those of ``shared/traces/trace_stats.json`` (see the
README beside it), so that the statistics of the shipped public traces can be checked
against that file:

- duration = last − first arrival; mean rate = (n − 1) / duration.
- peak rate over 1 s / 60 s = the largest count in aligned, non-overlapping bins of that
  width starting at the first arrival, divided by the width; the last, partial bin counts.
- index of dispersion = population variance / mean of those per-bin counts (Poisson = 1).
- IAT CV = population std / mean of the inter-arrival gaps (Poisson = 1).
- token percentiles are numpy linear-interpolation percentiles; Spearman uses average ranks
  for ties; the log correlation is the Pearson correlation of ``log1p`` of the counts.
- infinite-cache prefix hit (traces with ``hash_ids``): in arrival order, a request's leading
  block ids already seen in any earlier request are hits, up to the first miss; hit tokens =
  min(hits × block tokens, input tokens), summed and divided by the total input tokens.

Everything is vectorised with numpy; the four public traces take well under a second.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from headway.core.errors import TraceError
from headway.core.trace_data import TenantWork, TraceData

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

BIN_WIDTHS_S = (1, 60)
"""Widths of the counting bins for peak rates and dispersion, in seconds."""
_DENSE_BINS = 10_000_000
"""Bins counted densely; a longer span is counted from its non-empty bins."""

_LABEL = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?", re.ASCII)


def trace_stats(trace: TraceData) -> dict[str, object]:
    """The statistics of ``trace``, with the key names and rounding of ``trace_stats.json``.

    Values that are undefined for this trace (a rate over zero duration, a correlation of a
    constant column) are ``None``. Raises :class:`~headway.core.errors.TraceError` for a
    trace without requests.
    """
    n = len(trace)
    if n == 0:
        raise TraceError(f"trace {trace.name!r} has no requests; statistics need at least one")
    arrival_s = trace.arrival_s - trace.arrival_s[0]
    duration_s = float(arrival_s[-1])
    mean_rate_rps = (n - 1) / duration_s if duration_s > 0 else None
    stats: dict[str, object] = {
        "name": trace.name,
        "kind": trace.kind,
        "n_requests": n,
        "duration_s": round(duration_s, 3),
        "mean_rate_rps": _round(mean_rate_rps, 4),
    }
    stats.update(_bin_stats(arrival_s, mean_rate_rps))
    stats.update(_gap_stats(np.diff(arrival_s)))
    input_tokens, output_tokens = trace.input_tokens, trace.output_tokens
    stats["input_tokens"] = _token_summary(input_tokens)
    stats["output_tokens"] = _token_summary(output_tokens)
    stats["frac_output_zero"] = round(float(np.mean(output_tokens == 0)), 4)
    stats["frac_input_zero"] = round(float(np.mean(input_tokens == 0)), 4)
    x, y = input_tokens.astype(np.float64), output_tokens.astype(np.float64)
    stats["corr_in_out_pearson"] = _round(_pearson(x, y), 4)
    stats["corr_in_out_spearman"] = _round(_pearson(_average_ranks(x), _average_ranks(y)), 4)
    stats["corr_log_in_log_out_pearson"] = _round(_pearson(np.log1p(x), np.log1p(y)), 4)
    total_input_tokens = int(input_tokens.sum())
    total_output_tokens = int(output_tokens.sum())
    stats["total_input_tokens"] = total_input_tokens
    stats["total_output_tokens"] = total_output_tokens
    for key, total in (("input", total_input_tokens), ("output", total_output_tokens)):
        stats[f"mean_{key}_tok_per_s"] = _round(total / duration_s if duration_s > 0 else None, 1)
    if trace.first_timestamp is not None:
        stats["first_timestamp"] = format_timestamp_label(trace.first_timestamp)
    if trace.last_timestamp is not None:
        stats["last_timestamp"] = format_timestamp_label(trace.last_timestamp)
    if trace.hash_ids is not None and trace.hash_block_tokens is not None:
        stats.update(_prefix_stats(trace.hash_ids, trace.hash_block_tokens, input_tokens))
    if trace.tenant is not None:
        stats.update(tenant_stats(trace, arrival_s))
    return stats


LARGE_TENANTS = 10
"""Tenants described one by one: the largest by requests and by tokens, up to this many
of each (the rest are in the concentration figures)."""


def tenant_stats(trace: TraceData, arrival_s: FloatArray) -> dict[str, object]:
    """Per-tenant shares and concentration, and each large tenant's own rate, burstiness
    and lengths: a trace's aggregate hides a tenant of 1-token calls or one that bursts."""
    names, index, counts, tokens = trace.tenant_work()
    requests = counts.astype(np.float64)
    request_share = requests / requests.sum()
    total_tokens = float(tokens.sum())
    token_share: FloatArray = (
        tokens / total_tokens if total_tokens > 0 else np.zeros(len(names), dtype=np.float64)
    )

    def top(shares: FloatArray, k: int) -> float:
        return round(float(np.sort(shares)[::-1][:k].sum()), 4)

    out: dict[str, object] = {
        "n_tenants": len(names),
        "tenant_request_concentration": {f"top{k}": top(request_share, k) for k in (1, 5, 10)},
        "tenant_token_concentration": {f"top{k}": top(token_share, k) for k in (1, 5, 10)},
    }
    large = set(np.argsort(-requests, kind="stable")[:LARGE_TENANTS].tolist())
    large |= set(np.argsort(-tokens, kind="stable")[:LARGE_TENANTS].tolist())
    order = sorted(large, key=lambda i: (-requests[i], names[i]))
    out["tenants"] = tenant_figures(
        trace, arrival_s, [names[i] for i in order], by_tenant=(names, index, counts, tokens)
    )
    return out


PEAK_BIN_S = 10.0
"""Width of the bins of a tenant's peak rate."""


def tenant_figures(
    trace: TraceData,
    arrival_s: FloatArray,
    tenants: list[str],
    *,
    by_tenant: TenantWork | None = None,
) -> dict[str, dict[str, float | None]]:
    """For each of ``tenants`` (absent ones get zeros): its shares of the requests and of
    the token work, mean and peak rate (over :data:`PEAK_BIN_S` bins), IAT CV and length
    percentiles. ``arrival_s`` is the trace's arrivals from its first; ``by_tenant`` its
    :meth:`~TraceData.tenant_work`, when the caller has it already."""
    names, index, counts, tokens = trace.tenant_work() if by_tenant is None else by_tenant
    total_requests, total_tokens = float(counts.sum()), float(tokens.sum())
    span_s = float(arrival_s[-1] - arrival_s[0])
    position = {name: i for i, name in enumerate(names)}
    described: dict[str, dict[str, float | None]] = {}
    for name in tenants:
        i = position.get(name, -1)
        mine = index == i
        times = arrival_s[mine]
        figures: dict[str, float | None] = {
            "request_share": round(float(counts[i]) / total_requests, 4) if i >= 0 else 0.0,
            "token_share": (
                round(float(tokens[i]) / total_tokens, 4) if i >= 0 and total_tokens > 0 else 0.0
            ),
            "mean_rate_rps": _round((times.size - 1) / span_s if span_s > 0 else None, 4),
            "peak_rate_rps": _round(_peak_per_s(times - arrival_s[0], PEAK_BIN_S), 4),
            "iat_cv": _round(_cv(np.diff(times)), 4),
        }
        for column in ("input_tokens", "output_tokens"):
            values = getattr(trace, column)[mine]
            for q in (50, 95):
                figures[f"{column}_p{q}"] = float(np.percentile(values, q)) if values.size else None
        described[name] = figures
    return described


def _peak_per_s(arrival_s: FloatArray, width_s: float) -> float | None:
    """The largest count in aligned ``width_s`` bins from 0, per second (None: empty)."""
    if arrival_s.size == 0:
        return None
    counts = np.bincount((arrival_s // width_s).astype(np.int64))
    return float(counts.max()) / width_s


def format_timestamp_label(label: str) -> str:
    """A wall-clock label as ``YYYY-MM-DD HH:MM:SS[.ffffff[fff]]`` (pandas' way of printing).

    ``2023-11-16 18:17:03.9799600`` becomes ``2023-11-16 18:17:03.979960``: microseconds
    when the sub-microsecond digits are zero, nanoseconds otherwise, no fraction when it is
    zero. Labels in another layout are returned unchanged.
    """
    match = _LABEL.fullmatch(label.strip())
    if match is None:
        return label
    date, time_of_day, fraction = match.groups()
    nanos = (fraction or "").ljust(9, "0")
    if nanos == "000000000":
        return f"{date} {time_of_day}"
    return f"{date} {time_of_day}.{nanos[:6] if nanos.endswith('000') else nanos}"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


def _bin_stats(arrival_s: FloatArray, mean_rate_rps: float | None) -> dict[str, object]:
    """Peak rate, peak-to-mean and index of dispersion of counts in aligned bins."""
    out: dict[str, object] = {}
    for width_s in BIN_WIDTHS_S:
        bins = np.floor(arrival_s / width_s).astype(np.int64)
        num_bins = int(bins[-1]) + 1 if bins.size else 1
        if num_bins <= _DENSE_BINS:
            counts = np.bincount(bins)
            peak = float(counts.max())
            dispersion = float(counts.var() / counts.mean())
        else:  # a long, sparse trace: the same figures from the non-empty bins, exactly
            nonzero = np.unique(bins, return_counts=True)[1]
            n, sum_sq = int(bins.size), int(np.sum(nonzero.astype(np.int64) ** 2))
            peak = float(nonzero.max())
            dispersion = (sum_sq * num_bins - n * n) / (num_bins * n)
        peak_rate_rps = peak / width_s
        out[f"peak_rate_{width_s}s_rps"] = round(peak_rate_rps, 3)
        out[f"peak_to_mean_{width_s}s"] = _round(
            peak_rate_rps / mean_rate_rps if mean_rate_rps else None, 2
        )
        out[f"index_of_dispersion_{width_s}s"] = round(dispersion, 3)
    return out


def _gap_stats(gaps_s: FloatArray) -> dict[str, object]:
    """Coefficient of variation, zero gaps and percentiles of the inter-arrival gaps."""
    if gaps_s.size == 0:
        return {
            "iat_cv": None,
            "iat_frac_zero_gaps": None,
            "iat_cv_positive_gaps_only": None,
            "iat_p50_s": None,
            "iat_p99_s": None,
            "timestamp_resolution_note": "one request: no gaps",
        }
    positive_s = gaps_s[gaps_s > 0]
    p50_s, p99_s = np.percentile(gaps_s, [50, 99])
    return {
        "iat_cv": _round(_cv(gaps_s), 3),
        "iat_frac_zero_gaps": round(float(np.mean(gaps_s == 0)), 4),
        "iat_cv_positive_gaps_only": _round(_cv(positive_s), 3),
        "iat_p50_s": float(p50_s),
        "iat_p99_s": float(p99_s),
        "timestamp_resolution_note": (
            f"min positive gap {float(positive_s.min()):.6g} s"
            if positive_s.size
            else "no positive gap: all requests arrive at the same time"
        ),
    }


def _cv(values: FloatArray) -> float | None:
    """Population std / mean, or ``None`` when there is no value or the mean is zero."""
    if values.size == 0:
        return None
    mean = float(values.mean())
    return float(values.std()) / mean if mean > 0 else None


def _token_summary(tokens: IntArray) -> dict[str, float]:
    p50, p90, p99 = np.percentile(tokens, [50, 90, 99])
    return {
        "mean": round(float(tokens.mean()), 1),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(tokens.max()),
        "min": float(tokens.min()),
    }


def _pearson(x: FloatArray, y: FloatArray) -> float | None:
    """Pearson correlation, or ``None`` when either column is constant (or too short)."""
    if x.size < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    denominator = float(np.sqrt(np.dot(dx, dx) * np.dot(dy, dy)))
    return float(np.dot(dx, dy)) / denominator if denominator > 0 else None


def _average_ranks(values: FloatArray) -> FloatArray:
    """1-based ranks, ties getting the mean of the ranks they span (as scipy's rankdata)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_group = np.empty(values.size, dtype=bool)
    starts_group[:1] = True
    starts_group[1:] = ordered[1:] != ordered[:-1]
    starts = np.flatnonzero(starts_group)
    ends = np.append(starts[1:], values.size)
    group_rank = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = group_rank[np.cumsum(starts_group) - 1]
    return ranks


def _prefix_hits(hash_ids: tuple[IntArray, ...]) -> IntArray:
    """Per request, its leading blocks already seen in an earlier request (infinite cache)."""
    n = len(hash_ids)
    lengths = np.fromiter((ids.size for ids in hash_ids), dtype=np.int64, count=n)
    if lengths.sum() == 0:
        return lengths
    ids = np.concatenate(hash_ids)
    request = np.repeat(np.arange(n), lengths)
    _, first_index, inverse = np.unique(ids, return_index=True, return_inverse=True)
    seen_before = request[first_index][inverse] < request
    position = np.arange(ids.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    miss_request = request[~seen_before]
    missed, first_miss = np.unique(miss_request, return_index=True)
    hits = lengths.copy()
    hits[missed] = position[~seen_before][first_miss]
    return hits


def _prefix_stats(
    hash_ids: tuple[IntArray, ...], block_tokens: int, input_tokens: IntArray
) -> dict[str, object]:
    """Distinct blocks and the infinite-cache prefix hit ratios, by blocks and by tokens."""
    hits = _prefix_hits(hash_ids)
    total_blocks = sum(ids.size for ids in hash_ids)
    unique_blocks = int(np.unique(np.concatenate(hash_ids)).size) if total_blocks else 0
    hit_tokens = int(np.minimum(hits * block_tokens, input_tokens).sum())
    total_input_tokens = int(input_tokens.sum())
    return {
        "hash_block_tokens": block_tokens,
        "unique_blocks": unique_blocks,
        "prefix_hit_ratio_blocks_infinite_cache": _round(
            int(hits.sum()) / total_blocks if total_blocks else None, 4
        ),
        "prefix_hit_ratio_tokens_infinite_cache": _round(
            hit_tokens / total_input_tokens if total_input_tokens else None, 4
        ),
        "frac_requests_with_any_prefix_hit": round(float(np.mean(hits > 0)), 4),
    }
