"""The send schedule of a compiled workload, split into shards for worker processes.

A task's first step is sent at the task's arrival time (its branches at once). Each
later step is sent when every call of the step before it has finished, plus that
step's tool time: agent tasks run their calls in order, as a client would, so only
first steps are on the fixed schedule. Tasks go to shards round-robin in arrival order;
a task's calls all stay in one shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headway.core.workload.compile import CompiledWorkload

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, eq=False)
class ShardPlan:
    """The calls one worker sends. Local call ``j`` is global call ``calls[j]``."""

    calls: IntArray
    input_tokens: list[int]
    output_tokens: list[int]
    static_calls: list[int]
    """Local calls sent on the fixed schedule (first steps), in time order."""
    static_offset_s: list[float]
    """Their scheduled times, seconds after the run's start."""
    follow_ups: FollowUps | None
    """How later steps follow earlier ones; None when every task has one step."""

    @property
    def num_calls(self) -> int:
        """Calls in the shard."""
        return int(self.calls.size)


@dataclass(frozen=True, slots=True, eq=False)
class FollowUps:
    """Per local call: where its step group and its task end, and the tool time after it."""

    group_end: list[int]
    task_end: list[int]
    task: list[int]
    """Local task index."""
    group_size: list[int]
    """Calls in the call's step group."""
    tool_after_s: list[float]
    num_tasks: int


def _segment_ends(new_segment: npt.NDArray[np.bool_]) -> IntArray:
    """For each position, the index one past the end of its segment."""
    starts = np.flatnonzero(new_segment)
    ends = np.append(starts[1:], new_segment.size)
    ends_of: IntArray = ends[np.cumsum(new_segment) - 1]
    return ends_of


def shard_plans(w: CompiledWorkload, workers: int) -> list[ShardPlan]:
    """Split ``w`` into ``workers`` shards (tasks round-robin)."""
    plans = []
    task_ids = np.arange(w.num_tasks, dtype=np.int64)
    for shard in range(workers):
        tasks = task_ids[task_ids % workers == shard]
        counts = w.task_num_calls[tasks]
        starts = np.cumsum(counts) - counts
        owner = np.repeat(np.arange(tasks.size), counts)
        position = np.arange(owner.size, dtype=np.int64) - starts[owner]
        calls = (w.task_first_call[tasks][owner] + position).astype(np.int64)
        step = w.call_step[calls]
        first = step == 0
        static = np.flatnonzero(first)
        offsets = w.task_arrival_s[tasks][owner[static]]
        order = np.argsort(offsets, kind="stable")
        follow_ups = None
        if calls.size and int(step.max()) > 0:
            new_task = np.ones(calls.size, dtype=bool)
            new_task[1:] = owner[1:] != owner[:-1]
            new_group = new_task.copy()
            new_group[1:] |= step[1:] != step[:-1]
            group_end = _segment_ends(new_group)
            group_start = np.flatnonzero(new_group)[np.cumsum(new_group) - 1]
            follow_ups = FollowUps(
                group_end=group_end.tolist(),
                task_end=_segment_ends(new_task).tolist(),
                task=owner.tolist(),
                group_size=(group_end - group_start).tolist(),
                tool_after_s=w.call_tool_after_s[calls].tolist(),
                num_tasks=int(tasks.size),
            )
        plans.append(
            ShardPlan(
                calls=calls,
                input_tokens=w.call_input_tokens[calls].tolist(),
                output_tokens=w.call_output_tokens[calls].tolist(),
                static_calls=static[order].tolist(),
                static_offset_s=offsets[order].tolist(),
                follow_ups=follow_ups,
            )
        )
    return plans


def peak_rate_per_s(offsets_s: FloatArray, window_s: float = 1.0) -> float:
    """The most sends in any ``window_s`` window, per second (sliding over the sends)."""
    if offsets_s.size == 0:
        return 0.0
    times = np.sort(offsets_s)
    ends = np.searchsorted(times, times + window_s, side="left")
    return float((ends - np.arange(times.size)).max()) / window_s
