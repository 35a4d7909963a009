"""Per-call records of a bench run: columns in memory, a compact ``.npz`` on disk.

Times are seconds on the monotonic clock, relative to the run's start ``t0`` (the instant
the schedule's offset 0 maps to). NaN: the event did not happen. One row per call of the
compiled workload, in call order; calls that were never sent keep NaN times and the
error ``unsent`` or ``abandoned``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ERRORS = ("ok", "connect", "timeout", "status", "stream_error", "protocol", "abandoned", "unsent")
"""Error codes of the ``error`` column, by index."""
OK, CONNECT, TIMEOUT, STATUS, STREAM_ERROR, PROTOCOL, ABANDONED, UNSENT = range(len(ERRORS))

TIME_COLUMNS = ("scheduled_s", "sent_s", "first_byte_s", "first_token_s", "last_token_s", "end_s")
"""Timestamps of each call, in the order they happen."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Columns:
    """Record columns of one shard as Python lists (fast item assignment on the hot path).

    ``scheduled_s`` .. ``end_s`` are absolute monotonic seconds until :meth:`to_arrays`.
    """

    __slots__ = (
        "completion_tokens",
        "end_s",
        "error",
        "first_byte_s",
        "first_token_s",
        "itl_max_s",
        "last_token_s",
        "prompt_tokens",
        "scheduled_s",
        "sent_s",
        "status",
        "token_batches",
        "token_events",
        "usage",
    )

    def __init__(self, n: int) -> None:
        nan = math.nan
        self.scheduled_s = [nan] * n
        self.sent_s = [nan] * n
        self.first_byte_s = [nan] * n
        self.first_token_s = [nan] * n
        self.last_token_s = [nan] * n
        self.end_s = [nan] * n
        self.status = [0] * n
        """HTTP status (0: no response)."""
        self.error = [UNSENT] * n
        """Index into :data:`ERRORS`."""
        self.token_events = [0] * n
        """Streamed events that carried generated text."""
        self.token_batches = [0] * n
        """Socket reads that carried generated text (one timestamp each)."""
        self.itl_max_s = [nan] * n
        """Largest gap between two reads that carried generated text."""
        self.prompt_tokens = [-1] * n
        """From the server's ``usage`` (-1: not reported)."""
        self.completion_tokens = [-1] * n
        """From ``usage``, else the estimate (see ``usage``)."""
        self.usage = [False] * n
        """Whether the token counts came from the server's ``usage``."""

    def to_arrays(self, t0: float) -> dict[str, npt.NDArray[np.generic]]:
        """The columns as numpy arrays, times relative to ``t0``."""
        out: dict[str, npt.NDArray[np.generic]] = {}
        for name in TIME_COLUMNS:
            out[name] = np.asarray(getattr(self, name), dtype=np.float64) - t0
        out["itl_max_s"] = np.asarray(self.itl_max_s, dtype=np.float64)
        out["status"] = np.asarray(self.status, dtype=np.int16)
        out["error"] = np.asarray(self.error, dtype=np.int8)
        for name in ("token_events", "token_batches", "prompt_tokens", "completion_tokens"):
            out[name] = np.asarray(getattr(self, name), dtype=np.int32)
        out["usage"] = np.asarray(self.usage, dtype=np.bool_)
        return out


@dataclass(frozen=True, slots=True, eq=False)
class CallRecords:
    """Every call's record as numpy columns (see the module docstring)."""

    scheduled_s: FloatArray
    sent_s: FloatArray
    first_byte_s: FloatArray
    first_token_s: FloatArray
    last_token_s: FloatArray
    end_s: FloatArray
    itl_max_s: FloatArray
    status: npt.NDArray[np.int16]
    error: npt.NDArray[np.int8]
    token_events: npt.NDArray[np.int32]
    token_batches: npt.NDArray[np.int32]
    prompt_tokens: npt.NDArray[np.int32]
    completion_tokens: npt.NDArray[np.int32]
    usage: npt.NDArray[np.bool_]

    @classmethod
    def empty(cls, n: int) -> CallRecords:
        """``n`` unsent calls."""
        return cls.from_arrays(Columns(n).to_arrays(0.0))

    @classmethod
    def from_arrays(cls, arrays: dict[str, npt.NDArray[np.generic]]) -> CallRecords:
        """Build from a dict of columns (as :meth:`Columns.to_arrays` returns)."""
        return cls(**{name: arrays[name] for name in cls.__slots__})  # type: ignore[arg-type]

    def scatter(self, calls: IntArray, arrays: dict[str, npt.NDArray[np.generic]]) -> None:
        """Write one shard's columns into rows ``calls``."""
        for name in self.__slots__:
            getattr(self, name)[calls] = arrays[name]

    @property
    def completed(self) -> npt.NDArray[np.bool_]:
        """Calls that got a whole successful response."""
        return np.asarray(self.error == OK)


def write_records(
    path: Path,
    records: CallRecords,
    extra: dict[str, npt.NDArray[np.generic]],
) -> None:
    """Write the records (and ``extra`` columns such as task and class) as ``.npz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    columns: dict[str, Any] = {name: getattr(records, name) for name in CallRecords.__slots__}
    columns.update(extra, error_names=np.array(ERRORS))
    np.savez_compressed(tmp, **columns)
    tmp.replace(path)
