"""An arrival trace held in memory: one row per request, columns as numpy arrays.

:class:`TraceData` is what every trace reader (:mod:`headway.trace.readers`) returns and what
statistics, fitting and replay consume. It is pure data: the readers do the I/O, and this
module only checks that the columns fit together (equal lengths, arrivals sorted, token
counts non-negative) so that later code can rely on it without re-checking.

Arrival times are seconds since the first arrival of the file (the first request arrives at
0.0). Optional columns are ``None`` when the source format has no such field, never filled
with made-up values, so a consumer can tell "no tenant in this trace" from "one tenant".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from headway.core.errors import TraceError

PRIORITIES = ("critical", "interactive", "background")
"""The priority classes a trace may name, most urgent first."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ObjectArray = npt.NDArray[np.object_]
TenantWork = tuple[list[str], IntArray, IntArray, FloatArray]
"""What :meth:`TraceData.tenant_work` returns: names, each request's tenant index, each
tenant's requests and token work."""

_TICK_MIN_FRAC_ZERO_GAPS = 0.5
_TICK_MAX_CV = 0.05


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TraceData:
    """A request trace: arrival times and token counts, plus whatever else the file had.

    Arrays are indexed by request, in arrival order. Construction validates the columns and
    raises :class:`~headway.core.errors.TraceError` when they do not fit together; integer
    token arrays are converted to ``int64`` and arrivals to ``float64``.
    """

    name: str
    """Short name of the trace, e.g. ``"azure_llm_2023_code"`` (the file name sans suffixes)."""
    kind: str
    """Source format: ``"azure"``, ``"mooncake"`` or ``"generic"``."""
    arrival_s: FloatArray
    """Arrival times in seconds since the first arrival of the file, ascending."""
    input_tokens: IntArray
    """Prompt (prefill) tokens per request."""
    output_tokens: IntArray
    """Generated (decode) tokens per request."""
    tenant: ObjectArray | None = None
    """Tenant name per request (``str``), or ``None`` when the trace has no tenant column."""
    priority: ObjectArray | None = None
    """Priority class per request, one of :data:`PRIORITIES`, or ``None``."""
    session_id: ObjectArray | None = None
    """Session (conversation) id per request, or ``None``."""
    prefix_id: ObjectArray | None = None
    """Shared-prefix id per request (e.g. a system prompt), or ``None``."""
    hash_ids: tuple[IntArray, ...] | None = None
    """Per request, the ids of its prompt's KV blocks in order (Mooncake), or ``None``.

    Two requests share a reusable KV prefix exactly as far as their leading ids agree.
    """
    hash_block_tokens: int | None = None
    """Tokens per ``hash_ids`` block (512 for Mooncake), or ``None`` without hashes."""
    first_timestamp: str | None = None
    """Wall-clock label of the first arrival as written in the file (Azure), for reports."""
    last_timestamp: str | None = None
    """Wall-clock label of the last arrival as written in the file (Azure), for reports."""
    tick_s: float | None = None
    """Timestamp quantisation detected by :func:`detect_tick_s` (e.g. ~3 s), else ``None``."""
    ignored_columns: tuple[str, ...] = ()
    """Columns (or keys) of the file that the reader did not use: a tenant column under
    another name is one (map it with the reader's ``columns``)."""

    def __post_init__(self) -> None:
        """Normalise dtypes and check that the columns describe one set of requests."""
        where = f"trace {self.name!r}"
        arrival_s = np.asarray(self.arrival_s)
        if arrival_s.ndim != 1 or arrival_s.dtype.kind not in "iuf":
            raise TraceError(f"{where}: arrival_s must be a 1-D array of seconds")
        arrival_s = arrival_s.astype(np.float64, copy=False)
        object.__setattr__(self, "arrival_s", arrival_s)
        n = arrival_s.shape[0]
        if not np.all(np.isfinite(arrival_s)):
            raise TraceError(f"{where}: arrival_s has a NaN or infinite time")
        if n > 1 and np.any(np.diff(arrival_s) < 0):
            bad = int(np.flatnonzero(np.diff(arrival_s) < 0)[0]) + 1
            raise TraceError(
                f"{where}: arrival_s is not sorted (request {bad} arrives at "
                f"{arrival_s[bad]!r} s, before {arrival_s[bad - 1]!r} s); sort by arrival first"
            )
        for field in ("input_tokens", "output_tokens"):
            object.__setattr__(self, field, _token_column(where, field, getattr(self, field), n))
        for field in ("tenant", "session_id", "prefix_id", "priority"):
            values = getattr(self, field)
            if values is not None:
                object.__setattr__(self, field, _label_column(where, field, values, n))
        if self.priority is not None:
            unknown = set(self.priority.tolist()) - set(PRIORITIES)
            if unknown:
                raise TraceError(
                    f"{where}: priority has {sorted(unknown)[0]!r}; expected one of "
                    f"{', '.join(PRIORITIES)}"
                )
        self._check_hash_ids(where, n)

    def _check_hash_ids(self, where: str, n: int) -> None:
        if self.hash_ids is None:
            if self.hash_block_tokens is not None:
                raise TraceError(f"{where}: hash_block_tokens is set but hash_ids is not")
            return
        if len(self.hash_ids) != n:
            raise TraceError(f"{where}: hash_ids has {len(self.hash_ids)} entries for {n} requests")
        if self.hash_block_tokens is None or self.hash_block_tokens <= 0:
            raise TraceError(f"{where}: hash_ids needs a positive hash_block_tokens")
        ids = tuple(np.asarray(row, dtype=np.int64).reshape(-1) for row in self.hash_ids)
        object.__setattr__(self, "hash_ids", ids)

    def __len__(self) -> int:
        """The number of requests."""
        return int(self.arrival_s.shape[0])

    def tenant_work(self) -> TenantWork:
        """Per tenant (sorted by name): its name, the index of each request's tenant into
        them, its requests and its token work (prompt plus output tokens). Raises
        :class:`~headway.core.errors.TraceError` for a trace without a tenant column."""
        if self.tenant is None:
            raise TraceError(f"trace {self.name!r} has no tenant column")
        names, index = np.unique(self.tenant.astype(str), return_inverse=True)
        requests = np.bincount(index, minlength=names.size).astype(np.int64)
        work = (self.input_tokens + self.output_tokens).astype(np.float64)
        tokens = np.bincount(index, weights=work, minlength=names.size).astype(np.float64)
        return [str(n) for n in names.tolist()], index.astype(np.int64), requests, tokens

    def select(self, mask_or_indices: npt.ArrayLike) -> TraceData:
        """The requests picked by a boolean mask or by integer indices, as a new trace.

        Arrival times are kept as they are (the subset's first arrival need not be 0.0), so
        subsets of one trace stay on one time axis. Indices are taken in ascending order
        (repeats allowed, e.g. for a bootstrap resample) so that the result stays sorted.
        Wall-clock labels are kept only where the subset still starts / ends at the same
        request as the whole trace.
        """
        pick = np.asarray(mask_or_indices)
        n = len(self)
        if pick.dtype == np.bool_:
            if pick.shape != (n,):
                raise TraceError(
                    f"trace {self.name!r}: a mask must have one entry per request "
                    f"({n}), got shape {pick.shape}"
                )
            index = np.flatnonzero(pick)
        elif pick.dtype.kind in "iu" or pick.size == 0:
            index = np.sort(pick.astype(np.int64).reshape(-1), kind="stable")
            if index.size and (index[0] < 0 or index[-1] >= n):
                raise TraceError(f"trace {self.name!r}: index out of range 0..{n - 1} in select()")
        else:
            raise TraceError(
                f"trace {self.name!r}: select() takes a boolean mask or integer indices, "
                f"got dtype {pick.dtype}"
            )

        def take(values: ObjectArray | None) -> ObjectArray | None:
            return None if values is None else values[index]

        keeps_first = index.size > 0 and int(index[0]) == 0
        keeps_last = index.size > 0 and int(index[-1]) == n - 1
        return replace(
            self,
            arrival_s=self.arrival_s[index],
            input_tokens=self.input_tokens[index],
            output_tokens=self.output_tokens[index],
            tenant=take(self.tenant),
            priority=take(self.priority),
            session_id=take(self.session_id),
            prefix_id=take(self.prefix_id),
            hash_ids=None if self.hash_ids is None else tuple(self.hash_ids[i] for i in index),
            first_timestamp=self.first_timestamp if keeps_first else None,
            last_timestamp=self.last_timestamp if keeps_last else None,
        )


def _token_column(where: str, field: str, values: Any, n: int) -> IntArray:
    array = np.asarray(values)
    if array.ndim != 1 or array.shape[0] != n:
        raise TraceError(f"{where}: {field} has shape {array.shape}; expected ({n},)")
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise TraceError(f"{where}: {field} must hold integers, got dtype {array.dtype}")
    tokens = array.astype(np.int64, copy=False)
    if np.any(tokens < 0):
        bad = int(np.flatnonzero(tokens < 0)[0])
        raise TraceError(f"{where}: {field} of request {bad} is {tokens[bad]}; expected >= 0")
    return tokens


def _label_column(where: str, field: str, values: Any, n: int) -> ObjectArray:
    array = np.asarray(values, dtype=object)
    if array.ndim != 1 or array.shape[0] != n:
        raise TraceError(f"{where}: {field} has shape {array.shape}; expected ({n},)")
    return array


def detect_tick_s(arrival_s: npt.ArrayLike) -> float | None:
    """The timestamp quantum of a trace whose arrivals were rounded to a coarse clock.

    Returns the median positive gap when at least half of the inter-arrival gaps are exactly
    zero and the positive gaps are nearly constant (coefficient of variation below 0.05),
    e.g. ~3.0 s for the Mooncake conversation trace; otherwise ``None``. Statistics below
    that scale (1 s peaks, IAT CV) then describe the rounding, not the traffic.
    """
    times = np.asarray(arrival_s, dtype=np.float64)
    if times.size < 2:
        return None
    gaps_s = np.diff(times)
    positive_s = gaps_s[gaps_s > 0]
    if positive_s.size == 0 or np.mean(gaps_s == 0) < _TICK_MIN_FRAC_ZERO_GAPS:
        return None
    if float(np.std(positive_s)) >= _TICK_MAX_CV * float(np.mean(positive_s)):
        return None
    return float(np.median(positive_s))
