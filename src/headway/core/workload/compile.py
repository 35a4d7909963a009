"""Compile a workload spec and a seed into a deterministic, columnar stream of tasks and calls.

The result is a :class:`CompiledWorkload`: one row per task (arrival, class, tenant,
source, priority, number of call steps) and one row per call (its task, step, branch,
tokens, tool time after its step, route), calls ordered by task, then step, then branch.
It says *what* is asked; *when* a task's later calls start depends on how fast earlier
ones finish, which the simulator decides. Columns are numpy arrays so a million-request
workload compiles in about a second.

Determinism: every draw comes from a stream named after what it decides
(``arrivals/<source>``, ``mix/<source>``, ``tenants/<source>``,
``calls/<source>/<class>``, ``tokens/<source>/<class>``, ``tools/<source>/<class>``,
``tool_service/<source>/<class>``), so the same seed gives the same stream, and editing
one source does not change another's.

Tool calls through a service (a class with ``tool_service``): the step's tool-call count
comes from ``tools/...`` as before, and each tool call's service time from
``tool_service/...`` (the service's ``service_time_s``; ``tool_latency_s`` is not drawn).
``call_tool_after_s`` is then the sum of those service times, the step's tool time with
no queueing; a simulator that models the service replaces it with each tool call's
queueing plus service (:class:`headway.core.downstream.DownstreamService`), one call
after another, from ``tool_service_s[call_tool_first : call_tool_first + call_tool_count]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from headway.core.errors import WorkloadError
from headway.core.seeding import stream
from headway.core.trace_data import TraceData
from headway.core.workload import arrivals as arrival_processes
from headway.core.workload import distributions
from headway.core.workload.spec import (
    PRIORITIES,
    Arrivals,
    OnOff,
    Schedule,
    Service,
    Source,
    TaskClass,
    TraceReplay,
    WorkloadSpec,
)
from headway.core.workload.validate import validate_workload

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
_ClassCalls = tuple[
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    FloatArray,
    IntArray,
    IntArray,
    FloatArray,
    npt.NDArray[np.bool_],
]
"""What :func:`_class_calls` returns (see its docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One generation call of a task (a row view of the call columns)."""

    index: int
    task: int
    step: int
    branch: int
    input_tokens: int
    output_tokens: int
    tool_after_s: float
    route: str
    tool_service: str | None = None
    """The service its step's tool calls use (None: they take ``tool_latency_s``)."""
    tool_service_s: tuple[float, ...] = ()
    """Service times of its step's tool calls through ``tool_service``, in order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One task (a row view of the task columns) with its calls."""

    index: int
    arrival_s: float
    task_class: str
    tenant: str
    source: str
    priority: str
    num_steps: int
    calls: tuple[Call, ...]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CompiledWorkload:
    """Tasks and calls of one run, as columns (see the module docstring)."""

    spec: WorkloadSpec
    seed: int
    duration_s: float
    class_names: tuple[str, ...]
    tenant_names: tuple[str, ...]
    source_names: tuple[str, ...]
    route_names: tuple[str, ...]
    service_names: tuple[str, ...]
    """Names of ``spec.services``, in file order (indexed by :attr:`call_tool_service`)."""

    task_arrival_s: FloatArray
    task_class: IntArray
    task_tenant: IntArray
    task_source: IntArray
    task_priority: IntArray
    """Index into :data:`headway.core.workload.spec.PRIORITIES`."""
    task_num_steps: IntArray
    task_first_call: IntArray
    task_num_calls: IntArray

    call_task: IntArray
    call_step: IntArray
    call_branch: IntArray
    call_input_tokens: IntArray
    call_output_tokens: IntArray
    call_tool_after_s: FloatArray
    """Tool time after the call's step, before the next step (0 after the last)."""
    call_route: IntArray
    call_tool_service: IntArray
    """Per call: index into :attr:`service_names` of the service its step's tool calls
    use (-1: none; they take ``tool_latency_s``)."""
    call_tool_count: IntArray
    """Per call: tool calls after its step (0 after the last step); a step's branches
    share them."""
    call_tool_first: IntArray
    """Per call: index into :attr:`tool_service_s` of its step's first tool call (-1:
    no tool call, or no service)."""
    tool_service_s: FloatArray
    """Service times of tool calls made through a service, each step's calls contiguous
    (see the module docstring)."""
    call_prefix_row: IntArray
    """Per call: index into :attr:`prefix_hash_ids` (-1: the call carries no prefix ids)."""
    prefix_hash_ids: tuple[tuple[IntArray, int], ...] = ()
    """Prefix-block ids of replayed trace rows (Mooncake ``hash_ids``) and the tokens each
    id covers; the engine maps them to its own blocks (``kv.expand_block_hashes``)."""
    task_accepted: npt.NDArray[np.bool_] = field(
        default_factory=lambda: np.empty(0, dtype=np.bool_)
    )
    """Per task: whether its last attempt's outcome is accepted (its class's
    ``acceptance_probability``, drawn once; empty: every outcome is)."""

    @property
    def num_tasks(self) -> int:
        """Tasks in the run."""
        return int(self.task_arrival_s.size)

    @property
    def num_calls(self) -> int:
        """Calls in the run (before retries and duplicates, which happen at run time)."""
        return int(self.call_task.size)

    def task(self, index: int) -> Task:
        """Task ``index`` as a value, with its calls."""
        first = int(self.task_first_call[index])
        calls = tuple(
            Call(
                index=j,
                task=index,
                step=int(self.call_step[j]),
                branch=int(self.call_branch[j]),
                input_tokens=int(self.call_input_tokens[j]),
                output_tokens=int(self.call_output_tokens[j]),
                tool_after_s=float(self.call_tool_after_s[j]),
                route=self.route_names[int(self.call_route[j])],
                tool_service=self._tool_service(j)[0],
                tool_service_s=self._tool_service(j)[1],
            )
            for j in range(first, first + int(self.task_num_calls[index]))
        )
        return Task(
            index=index,
            arrival_s=float(self.task_arrival_s[index]),
            task_class=self.class_names[int(self.task_class[index])],
            tenant=self.tenant_names[int(self.task_tenant[index])],
            source=self.source_names[int(self.task_source[index])],
            priority=PRIORITIES[int(self.task_priority[index])],
            num_steps=int(self.task_num_steps[index]),
            calls=calls,
        )

    def _tool_service(self, call: int) -> tuple[str | None, tuple[float, ...]]:
        """The service of call ``call``'s tool calls and their service times."""
        service = int(self.call_tool_service[call])
        first = int(self.call_tool_first[call])
        if service < 0:
            return None, ()
        if first < 0:
            return self.service_names[service], ()
        times = self.tool_service_s[first : first + int(self.call_tool_count[call])]
        return self.service_names[service], tuple(float(t) for t in times)

    def tasks(self) -> Iterator[Task]:
        """All tasks in arrival order."""
        for i in range(self.num_tasks):
            yield self.task(i)

    def calls_trace(self) -> TraceData:
        """The run's calls as a trace, each stamped with its task's arrival: what
        ``headway workload compile`` writes and what a fit is checked against."""
        task = self.call_task
        return TraceData(
            name=self.spec.name,
            kind="generic",
            arrival_s=self.task_arrival_s[task],
            input_tokens=self.call_input_tokens,
            output_tokens=self.call_output_tokens,
            tenant=np.array([self.tenant_names[i] for i in self.task_tenant[task]], dtype=object),
            priority=np.array([PRIORITIES[i] for i in self.task_priority[task]], dtype=object),
            session_id=np.array([f"task-{i}" for i in task.tolist()], dtype=object),
        )


@dataclass(slots=True)
class _SourceTasks:
    """Tasks of one source before merging: task columns and per-task call columns."""

    arrival_s: FloatArray
    task_class: IntArray
    tenant: IntArray
    num_steps: IntArray
    num_calls: IntArray
    input_tokens: IntArray
    output_tokens: IntArray
    step: IntArray
    branch: IntArray
    tool_after_s: FloatArray
    route: IntArray
    trace_row: IntArray
    """Per call: the row of the replayed trace it came from (-1: not from a trace)."""
    tool_count: IntArray
    tool_first: IntArray
    """Per call: index into :attr:`tool_service_s` (-1: none)."""
    tool_service: IntArray
    tool_service_s: FloatArray
    prefix_hash_ids: tuple[tuple[IntArray, int], ...] = ()
    """The replayed trace's prefix-block ids and their block size in tokens, by row."""
    accepted: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, dtype=np.bool_))
    """Per task: whether its last attempt's outcome is accepted."""


def _shares(names: tuple[str, ...], shares: Mapping[str, float]) -> FloatArray:
    weights = np.array([shares.get(n, 0.0) for n in names], dtype=np.float64)
    normalised: FloatArray = weights / weights.sum()
    return normalised


def _choose(
    n: int, names: tuple[str, ...], shares: Mapping[str, float], rng: np.random.Generator
) -> IntArray:
    probs = _shares(names, shares)
    return rng.choice(len(names), size=n, p=probs).astype(np.int64)


def _call_layout(num_calls: IntArray) -> tuple[IntArray, IntArray]:
    """For tasks with ``num_calls`` calls each: owner index and position of every call."""
    owner = np.repeat(np.arange(num_calls.size, dtype=np.int64), num_calls)
    starts = np.cumsum(num_calls) - num_calls
    position = np.arange(owner.size, dtype=np.int64) - np.repeat(starts, num_calls)
    return owner, position


def _draw_tokens(cls: TaskClass, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
    if cls.joint_tokens is not None:
        joint = cls.joint_tokens
        if joint.pairs is None:
            raise WorkloadError(
                "joint_tokens still refers to a trace file; load the workload with "
                "headway.files.workload.load_workload, which reads it"
            )
        pairs = np.asarray(joint.pairs, dtype=np.int64)
        probs = None
        if joint.weights is not None:
            w = np.asarray(joint.weights, dtype=np.float64)
            probs = w / w.sum()
        rows = pairs[rng.choice(pairs.shape[0], size=n, p=probs)]
        inp, out = rows[:, 0].copy(), rows[:, 1].copy()
        if joint.max_input_tokens is not None:
            np.minimum(inp, joint.max_input_tokens, out=inp)
        if joint.max_output_tokens is not None:
            np.minimum(out, joint.max_output_tokens, out=out)
        return np.maximum(inp, 1), np.maximum(out, 1)
    inp = np.rint(distributions.sample(cls.input_tokens, n, rng)).astype(np.int64)
    out = np.rint(distributions.sample(cls.output_tokens, n, rng)).astype(np.int64)
    return np.maximum(inp, 1), np.maximum(out, 1)


def _tool_times(
    cls: TaskClass,
    n_steps: int,
    rng: np.random.Generator,
    service: Service | None,
    service_rng: np.random.Generator,
) -> tuple[FloatArray, IntArray, FloatArray]:
    """Tool time after each of ``n_steps`` steps (a sum of ``tools_per_call`` latencies),
    tool calls per step, and each tool call's service time (empty without ``service``).

    Without a service the draws are exactly those made before services existed."""
    counts = distributions.whole_counts(cls.tools_per_call, n_steps, rng, minimum=0)
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(n_steps), counts, np.zeros(0)
    if service is not None:
        latencies = distributions.sample(service.service_time_s, total, service_rng)
        per_call = latencies
    else:
        latencies = distributions.sample(cls.tool_latency_s, total, rng)
        per_call = np.zeros(0)
    owner = np.repeat(np.arange(n_steps), counts)
    step_tool = np.bincount(owner, weights=latencies, minlength=n_steps).astype(np.float64)
    return step_tool, counts, per_call.astype(np.float64)


def _class_calls(
    spec: WorkloadSpec,
    source: Source,
    cls_name: str,
    n_tasks: int,
    seed: int,
    trace_tokens: tuple[IntArray, IntArray] | None,
) -> _ClassCalls:
    """Steps per task, calls per task, per-call columns for ``n_tasks`` of one class, and
    the class's tool-call service times (indexed by the per-call ``tool_first``)."""
    cls = spec.classes[cls_name]
    key = f"{source.name}/{cls_name}"
    accepted = np.ones(n_tasks, dtype=np.bool_)
    if trace_tokens is not None:
        steps = np.ones(n_tasks, dtype=np.int64)
    else:
        steps = distributions.whole_counts(
            cls.calls, n_tasks, stream(seed, f"calls/{key}"), minimum=1
        )
        steps, accepted = _attempted_steps(cls, steps, stream(seed, f"accept/{key}"))
    num_calls = steps * cls.parallel_branches
    owner, position = _call_layout(num_calls)
    step = position // cls.parallel_branches
    branch = position % cls.parallel_branches
    if trace_tokens is not None:
        inp, out = trace_tokens
    else:
        inp, out = _draw_tokens(cls, int(num_calls.sum()), stream(seed, f"tokens/{key}"))
    # One tool time per task step, shared by the step's branches; none after the last step.
    service = spec.services[cls.tool_service] if cls.tool_service is not None else None
    step_tool, step_count, service_s = _tool_times(
        cls,
        int(steps.sum()),
        stream(seed, f"tools/{key}"),
        service,
        stream(seed, f"tool_service/{key}"),
    )
    step_index = (np.cumsum(steps) - steps)[owner] + step
    tool_after = step_tool[step_index]
    last = step == steps[owner] - 1
    tool_after[last] = 0.0
    tool_count = step_count[step_index]
    tool_count[last] = 0
    tool_first = np.full(step_index.size, -1, dtype=np.int64)
    if service is not None:
        tool_first = (np.cumsum(step_count) - step_count)[step_index]
        tool_first[tool_count == 0] = -1
    if cls.max_unit_tokens is not None:
        steps, inp, out, step, tool_after, tool_count, tool_first = _split_units(
            cls.max_unit_tokens, owner, n_tasks, inp, out, tool_after, tool_count, tool_first
        )
        num_calls = steps
        branch = np.zeros(step.size, dtype=np.int64)
    return (
        steps, num_calls, inp, out, step, branch, tool_after, tool_count, tool_first, service_s,
        accepted,
    )  # fmt: skip


def _split_units(
    max_unit_tokens: int,
    owner: IntArray,
    n_tasks: int,
    inp: IntArray,
    out: IntArray,
    tool_after: FloatArray,
    tool_count: IntArray,
    tool_first: IntArray,
) -> tuple[IntArray, IntArray, IntArray, IntArray, FloatArray, IntArray, IntArray]:
    """Each call of a one-branch class split into ``ceil((prompt + output) / max)`` units
    run one after another, its prompt and output divided evenly (at least one of each
    per unit); the tool calls after a call follow its last unit. Returns the steps per
    task and the per-unit columns (prompt, output, step, tool time, tool count, first
    tool call)."""
    units = np.maximum(-(-(inp + out) // max_unit_tokens), 1)
    source = np.repeat(np.arange(inp.size, dtype=np.int64), units)
    starts = np.cumsum(units) - units
    part = np.arange(source.size, dtype=np.int64) - starts[source]
    k = units[source]

    def divided(total: IntArray) -> IntArray:
        t = total[source]
        share: IntArray = np.maximum(t // k + (part < t % k), 1).astype(np.int64)
        return share

    last = part == k - 1
    steps = np.bincount(owner[source], minlength=n_tasks).astype(np.int64)
    _, step = _call_layout(steps)
    return (
        steps,
        divided(inp),
        divided(out),
        step,
        np.where(last, tool_after[source], 0.0),
        np.where(last, tool_count[source], 0),
        np.where(last, tool_first[source], -1),
    )


def _attempted_steps(
    cls: TaskClass, steps: IntArray, rng: np.random.Generator
) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Steps of each task with its verification calls and its attempts (a rejected
    outcome runs the task again, up to ``max_task_attempts``); and whether its last
    attempt's outcome was accepted. The attempts until the first acceptance are
    geometric in ``acceptance_probability``, drawn once per task (seeded)."""
    per_attempt = steps + cls.verification_calls
    p = cls.acceptance_probability
    if p >= 1.0:
        return per_attempt, np.ones(steps.size, dtype=np.bool_)
    tries = rng.geometric(p, steps.size).astype(np.int64)
    attempts = np.minimum(tries, cls.max_task_attempts)
    return per_attempt * attempts, tries <= cls.max_task_attempts


def _source_tasks(
    spec: WorkloadSpec,
    source: Source,
    names: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
    seed: int,
    duration_s: float,
    traces: Mapping[str, TraceData],
) -> _SourceTasks:
    class_names, tenant_names, route_names = names
    rng_arrivals = stream(seed, f"arrivals/{source.name}")
    trace_rows: IntArray | None = None
    trace: TraceData | None = None
    if isinstance(source.arrivals, TraceReplay):
        trace = traces.get(source.arrivals.path)
        if trace is None:
            raise WorkloadError(
                f"source `{source.name}` replays {source.arrivals.path!r}, which was not "
                "loaded; load the workload with headway.files.workload.load_workload"
            )
        replayed = arrival_processes.replay(source.arrivals, trace, duration_s, rng_arrivals)
        arrival_s, trace_rows = replayed.arrival_s, replayed.row
    else:
        arrival_s = arrival_processes.generate(source.arrivals, duration_s, rng_arrivals)
    n = arrival_s.size
    mix = source.mix if source.mix is not None else {class_names[0]: 1.0}
    task_class = _choose(n, class_names, mix, stream(seed, f"mix/{source.name}"))
    tenant_shares = source.tenants or {k: t.share for k, t in spec.tenants.items()}
    tenant = _choose(n, tenant_names, tenant_shares, stream(seed, f"tenants/{source.name}"))
    if trace is not None and trace.tenant is not None and trace_rows is not None:
        tenant = _trace_tenants(trace.tenant, trace_rows, tenant_names, source.name)
    use_trace_tokens = (
        trace is not None
        and isinstance(source.arrivals, TraceReplay)
        and source.arrivals.lengths == "trace"
    )
    num_steps = np.zeros(n, dtype=np.int64)
    num_calls = np.zeros(n, dtype=np.int64)
    accepted = np.ones(n, dtype=np.bool_)
    per_class: dict[int, tuple[IntArray, ...]] = {}
    tools: dict[int, FloatArray] = {}
    service_times: list[FloatArray] = []
    service_offset = 0
    for ci, cls_name in enumerate(class_names):
        idx = np.flatnonzero(task_class == ci)
        if idx.size == 0:
            continue
        tokens = None
        if use_trace_tokens and trace is not None and trace_rows is not None:
            rows = trace_rows[idx]
            tokens = (
                np.maximum(trace.input_tokens[rows].astype(np.int64), 1),
                np.maximum(trace.output_tokens[rows].astype(np.int64), 1),
            )
        steps, calls, inp, out, step, branch, tool_after, tool_count, tool_first, svc_s, ok = (
            _class_calls(spec, source, cls_name, idx.size, seed, tokens)
        )
        num_steps[idx], num_calls[idx], accepted[idx] = steps, calls, ok
        row = np.full(int(calls.sum()), -1, dtype=np.int64)
        if tokens is not None and trace_rows is not None:
            row = trace_rows[idx]  # one call per task (validated: no branches)
        tool_first[tool_first >= 0] += service_offset
        service_offset += svc_s.size
        service_times.append(svc_s)
        per_class[ci] = (inp, out, step, branch, tool_count, row, tool_first)
        tools[ci] = tool_after
    assembled = _assemble(
        spec,
        arrival_s,
        task_class,
        tenant,
        num_steps,
        num_calls,
        per_class,
        tools,
        class_names,
        route_names,
    )
    assembled.tool_service_s = np.concatenate([np.zeros(0), *service_times])
    assembled.accepted = accepted
    if use_trace_tokens and trace is not None and trace.hash_ids is not None:
        block_tokens = trace.hash_block_tokens or 512
        assembled.prefix_hash_ids = tuple((ids, block_tokens) for ids in trace.hash_ids)
    else:
        assembled.trace_row[:] = -1
    return assembled


def _trace_tenants(
    trace_tenant: npt.NDArray[np.object_],
    rows: IntArray,
    tenant_names: tuple[str, ...],
    source: str,
) -> IntArray:
    values = trace_tenant[rows]
    index = {name: i for i, name in enumerate(tenant_names)}
    unknown = sorted({str(v) for v in values if v not in index})
    if unknown:
        raise WorkloadError(
            f"source `{source}`: the trace names tenants {', '.join(unknown[:5])} that "
            "`tenants` does not define; add them under `tenants`"
        )
    return np.array([index[v] for v in values], dtype=np.int64)


def _assemble(
    spec: WorkloadSpec,
    arrival_s: FloatArray,
    task_class: IntArray,
    tenant: IntArray,
    num_steps: IntArray,
    num_calls: IntArray,
    per_class: Mapping[int, tuple[IntArray, ...]],
    tools: Mapping[int, FloatArray],
    class_names: tuple[str, ...],
    route_names: tuple[str, ...],
) -> _SourceTasks:
    """Scatter per-class call columns into task order."""
    total = int(num_calls.sum())
    owner, _ = _call_layout(num_calls)
    cols = [np.zeros(total, dtype=np.int64) for _ in range(5)]
    cols += [np.full(total, -1, dtype=np.int64) for _ in range(2)]
    tool_after = np.zeros(total)
    route = np.zeros(total, dtype=np.int64)
    service = np.full(total, -1, dtype=np.int64)
    service_names = list(spec.services)
    call_class = task_class[owner]
    for ci, columns in per_class.items():
        where = np.flatnonzero(call_class == ci)
        for col, values in zip(cols, columns, strict=True):
            col[where] = values
        tool_after[where] = tools[ci]
        route_name = spec.classes[class_names[ci]].route or route_names[0]
        route[where] = route_names.index(route_name)
        tool_service = spec.classes[class_names[ci]].tool_service
        if tool_service is not None:
            service[where] = service_names.index(tool_service)
    inp, out, step, branch, tool_count, trace_row, tool_first = cols
    return _SourceTasks(
        arrival_s,
        task_class,
        tenant,
        num_steps,
        num_calls,
        inp,
        out,
        step,
        branch,
        tool_after,
        route,
        trace_row,
        tool_count,
        tool_first,
        service,
        np.zeros(0),
    )


def compile_workload(
    spec: WorkloadSpec,
    *,
    seed: int | None = None,
    duration_s: float | None = None,
    traces: Mapping[str, TraceData] | None = None,
) -> CompiledWorkload:
    """Turn ``spec`` into the tasks and calls of one run.

    Args:
        spec: the workload.
        seed: the run seed (default: ``spec.seed``).
        duration_s: the run length (default: ``spec.duration_s``).
        traces: trace files the spec replays, already read, keyed by the path written in
            the spec (``headway.files.workload.load_workload`` supplies them).
    """
    validate_workload(spec)
    seed = spec.seed if seed is None else seed
    duration_s = spec.duration_s if duration_s is None else duration_s
    if not duration_s > 0:
        raise WorkloadError(f"duration_s must be > 0 (got {duration_s})", path="$.duration_s")
    check_size(spec, duration_s)
    class_names = tuple(spec.classes)
    tenant_names = tuple(spec.tenants)
    route_names = tuple(spec.routes)
    names = (class_names, tenant_names, route_names)
    parts = [
        _source_tasks(spec, src, names, seed, duration_s, traces or {}) for src in spec.sources
    ]
    source_of = np.concatenate(
        [np.full(p.arrival_s.size, i, dtype=np.int64) for i, p in enumerate(parts)]
    )
    arrival_s = np.concatenate([p.arrival_s for p in parts])
    order = np.lexsort((source_of, arrival_s))  # by time, then source index
    num_calls_unsorted = np.concatenate([p.num_calls for p in parts])
    # Calls follow their tasks: gather each task's call block in the new task order.
    first_unsorted = np.cumsum(num_calls_unsorted) - num_calls_unsorted
    num_calls = num_calls_unsorted[order]
    owner, position = _call_layout(num_calls)
    gather = first_unsorted[order][owner] + position

    def cat_tasks(name: str) -> IntArray:
        column: IntArray = np.concatenate([getattr(p, name) for p in parts])
        ordered: IntArray = column[order]
        return ordered

    def cat_calls(name: str) -> npt.NDArray[np.generic]:
        column: npt.NDArray[np.generic] = np.concatenate([getattr(p, name) for p in parts])
        gathered: npt.NDArray[np.generic] = column[gather]
        return gathered

    offsets = np.cumsum([0] + [len(p.prefix_hash_ids) for p in parts[:-1]])
    for part, offset in zip(parts, offsets.tolist(), strict=True):
        part.trace_row[part.trace_row >= 0] += offset
    tool_offsets = np.cumsum([0] + [p.tool_service_s.size for p in parts[:-1]])
    for part, offset in zip(parts, tool_offsets.tolist(), strict=True):
        part.tool_first[part.tool_first >= 0] += offset
    task_class = cat_tasks("task_class")
    priority_index = np.array(
        [PRIORITIES.index(spec.classes[c].priority) for c in class_names], dtype=np.int64
    )
    return CompiledWorkload(
        spec=spec,
        seed=seed,
        duration_s=duration_s,
        class_names=class_names,
        tenant_names=tenant_names,
        source_names=tuple(s.name for s in spec.sources),
        route_names=route_names,
        service_names=tuple(spec.services),
        task_arrival_s=arrival_s[order],
        task_class=task_class,
        task_tenant=cat_tasks("tenant"),
        task_source=source_of[order],
        task_priority=priority_index[task_class],
        task_num_steps=cat_tasks("num_steps"),
        task_first_call=(np.cumsum(num_calls) - num_calls).astype(np.int64),
        task_num_calls=num_calls,
        call_task=owner,
        call_step=cat_calls("step").astype(np.int64),
        call_branch=cat_calls("branch").astype(np.int64),
        call_input_tokens=cat_calls("input_tokens").astype(np.int64),
        call_output_tokens=cat_calls("output_tokens").astype(np.int64),
        call_tool_after_s=cat_calls("tool_after_s").astype(np.float64),
        call_route=cat_calls("route").astype(np.int64),
        call_tool_service=cat_calls("tool_service").astype(np.int64),
        call_tool_count=cat_calls("tool_count").astype(np.int64),
        call_tool_first=cat_calls("tool_first").astype(np.int64),
        tool_service_s=np.concatenate([p.tool_service_s for p in parts]).astype(np.float64),
        call_prefix_row=cat_calls("trace_row").astype(np.int64),
        prefix_hash_ids=tuple(ids for p in parts for ids in p.prefix_hash_ids),
        task_accepted=np.concatenate([p.accepted for p in parts])[order],
    )


MAX_EXPECTED_CALLS = 20_000_000
"""The most calls one run may be expected to compile to (a million take about 0.9 GB)."""


def _peak_rate_per_s(arrivals: Arrivals) -> float:
    """The highest nominal rate of a rate-based process, bursts included (0 for a trace:
    its rows bound it)."""
    if isinstance(arrivals, TraceReplay):
        return 0.0
    if isinstance(arrivals, Schedule):
        rate = max(step.rate_per_s for step in arrivals.steps)
    elif isinstance(arrivals, OnOff):
        rate = max(arrivals.on_rate_per_s, arrivals.off_rate_per_s)
    else:
        rate = arrivals.rate_per_s
    for burst in arrivals.bursts:
        rate = max(rate, burst.rate_per_s or 0.0, rate * (burst.multiplier or 1.0))
        rate += burst.add_rate_per_s or 0.0
    return rate


def check_size(spec: WorkloadSpec, duration_s: float) -> None:
    """Refuse, before allocating anything, a run expected to exceed
    :data:`MAX_EXPECTED_CALLS` (rates × duration × calls per task)."""
    calls_per_task = max(
        (
            (max(distributions.mean(c.calls), 1.0) + c.verification_calls)
            * c.expected_attempts
            * c.parallel_branches
            for c in spec.classes.values()
        ),
        default=1.0,
    )
    expected = sum(_peak_rate_per_s(s.arrivals) for s in spec.sources) * duration_s
    expected *= calls_per_task
    if not expected <= MAX_EXPECTED_CALLS:  # also catches NaN and infinity
        raise WorkloadError(
            f"$.duration_s: the workload would compile to about {expected:.3g} calls "
            f"(peak rates × duration_s {duration_s:g} × up to {calls_per_task:g} calls per "
            f"task); one run holds at most {MAX_EXPECTED_CALLS:,}. Shorten duration_s or "
            "lower the rates (sweep load factors instead of one huge run)",
            path="$.duration_s",
        )
