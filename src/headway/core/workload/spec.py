"""The workload file format, as types.

A workload says who sends what, when, and what they were promised:

* ``classes``: task classes. A task is one user action (seed 000's "run"); it makes one or
  more generation calls, possibly in parallel branches, with tool calls between them. Each
  class has its token distributions, priority, route and SLOs.
* ``sources``: arrival streams of tasks, each with an arrival process and a class mix.
* ``tenants``: who the traffic belongs to, with traffic shares and fairness weights.
* ``routes``: where calls go (a model and its capacity).
* ``clients``: how callers behave (retries, patience, duplicate submissions).
* ``planning``: what the analytic plan needs when nothing is simulated.

Every type here is a frozen ``msgspec.Struct`` that forbids unknown fields, so a typo in a
file is an error with its path (``$.classes.chat.input_tokens.cv``), never a silent default.
Field docstrings are the reference documentation (``docs/workload.md`` and the JSON Schema
are generated from them). Checks that involve several fields live in ``__post_init__``
(one struct) or in :func:`headway.core.workload.validate.validate_workload` (references
between sections).
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

FORMAT_VERSION = 1
"""The workload format version this code reads and writes."""

Priority = Literal["critical", "interactive", "background"]
"""Priority bands, most important first."""

PRIORITIES: tuple[Priority, ...] = ("critical", "interactive", "background")


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every workload type: frozen, keyword-only, typos rejected."""


def _require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)``; msgspec attaches the key path when decoding."""
    if not condition:
        raise ValueError(message)


def _finite_nonneg(name: str, value: float | None) -> None:
    if value is not None:
        _require(
            math.isfinite(value) and value >= 0,
            f"`{name}` must be a finite number >= 0 (got {value})",
        )


def _positive(name: str, value: float | None) -> None:
    if value is not None:
        _require(
            math.isfinite(value) and value > 0,
            f"`{name}` must be a finite number > 0 (got {value})",
        )


# --------------------------------------------------------------------------------------
# Distributions of non-negative quantities (tokens, seconds, counts)
# --------------------------------------------------------------------------------------


class _Dist(_Spec, frozen=True, kw_only=True, tag_field="dist"):
    """A distribution; the ``dist`` key picks the family."""

    min: float | None = None
    """Values below this are raised to it (a cap from below)."""

    max: float | None = None
    """Values above this are lowered to it (a cap, such as a context limit)."""

    def _check_caps(self) -> None:
        _finite_nonneg("min", self.min)
        _finite_nonneg("max", self.max)
        if self.min is not None and self.max is not None:
            _require(
                self.min <= self.max,
                f"`min` ({self.min}) must be <= `max` ({self.max}); swap them",
            )


class Fixed(_Dist, frozen=True, kw_only=True, tag="fixed"):
    """Always ``value``. A bare number in a file means the same."""

    value: float
    """The value."""

    def __post_init__(self) -> None:
        _finite_nonneg("value", self.value)
        self._check_caps()


class Lognormal(_Dist, frozen=True, kw_only=True, tag="lognormal"):
    """Lognormal with the given mean and coefficient of variation (std / mean)."""

    mean: float
    """The mean."""
    cv: float
    """Coefficient of variation: standard deviation / mean."""

    def __post_init__(self) -> None:
        _positive("mean", self.mean)
        _finite_nonneg("cv", self.cv)
        self._check_caps()


class Gamma(_Dist, frozen=True, kw_only=True, tag="gamma"):
    """Gamma with the given mean and coefficient of variation (shape = 1 / cv²)."""

    mean: float
    """The mean."""
    cv: float
    """Coefficient of variation (shape = 1 / cv²)."""

    def __post_init__(self) -> None:
        _positive("mean", self.mean)
        _positive("cv", self.cv)
        self._check_caps()


class Exponential(_Dist, frozen=True, kw_only=True, tag="exponential"):
    """Exponential with the given mean (a gamma with cv 1)."""

    mean: float
    """The mean."""

    def __post_init__(self) -> None:
        _positive("mean", self.mean)
        self._check_caps()


class Uniform(_Dist, frozen=True, kw_only=True, tag="uniform"):
    """Uniform on ``[low, high]``."""

    low: float
    """Lowest value."""
    high: float
    """Highest value."""

    def __post_init__(self) -> None:
        _finite_nonneg("low", self.low)
        _finite_nonneg("high", self.high)
        _require(self.low <= self.high, f"`low` ({self.low}) must be <= `high` ({self.high})")
        self._check_caps()


class Poisson(_Dist, frozen=True, kw_only=True, tag="poisson"):
    """Poisson counts with the given mean (for calls per task, tool calls)."""

    mean: float
    """The mean count."""

    def __post_init__(self) -> None:
        _finite_nonneg("mean", self.mean)
        self._check_caps()


class Empirical(_Dist, frozen=True, kw_only=True, tag="empirical"):
    """Draw from observed values, optionally weighted.

    Give ``values`` inline, or ``trace`` and ``field`` to take them from a trace file when
    the workload is loaded (the file is read once; the package never needs it at run time
    once ``headway trace fit`` has inlined the values).
    """

    values: list[float] | None = None
    """The observed values."""

    weights: list[float] | None = None
    """Relative weight of each value (default: equal)."""

    trace: str | None = None
    """A trace file to take the values from (path relative to the workload file)."""

    field: Literal["input_tokens", "output_tokens"] = "input_tokens"
    """Which trace column to use with ``trace``."""

    def __post_init__(self) -> None:
        _require(
            (self.values is None) != (self.trace is None),
            "give exactly one of `values` (inline) or `trace` (a trace file)",
        )
        if self.values is not None:
            _require(len(self.values) > 0, "`values` must not be empty")
            _require(
                all(math.isfinite(v) and v >= 0 for v in self.values),
                "`values` must all be finite numbers >= 0",
            )
        if self.weights is not None:
            _require(self.values is not None, "`weights` needs inline `values`")
        if self.weights is not None and self.values is not None:
            _require(
                len(self.weights) == len(self.values),
                f"`weights` has {len(self.weights)} entries but `values` has "
                f"{len(self.values)}; give one weight per value",
            )
            _require(
                all(math.isfinite(w) and w >= 0 for w in self.weights) and sum(self.weights) > 0,
                "`weights` must be >= 0 with a positive sum",
            )
        self._check_caps()


Distribution = float | Fixed | Lognormal | Gamma | Exponential | Uniform | Poisson | Empirical
"""A number (fixed value) or a distribution with a ``dist`` key."""


def _check_bare(name: str, value: object) -> None:
    """A bare number standing for a distribution must be finite and >= 0."""
    if isinstance(value, float | int):
        _finite_nonneg(name, float(value))


class JointTokens(_Spec, frozen=True, kw_only=True):
    """Input and output tokens drawn together, keeping their correlation.

    ``pairs`` are observed ``[input_tokens, output_tokens]`` rows; each call draws one
    row. With ``trace``, the rows come from a trace file when the workload is loaded.
    """

    pairs: list[tuple[int, int]] | None = None
    """Observed ``[input_tokens, output_tokens]`` pairs."""

    weights: list[float] | None = None
    """Relative weight of each pair (default: equal)."""

    trace: str | None = None
    """A trace file whose rows supply the pairs (path relative to the workload file)."""

    max_input_tokens: int | None = None
    """Cap on input tokens (longer prompts are truncated to it)."""

    max_output_tokens: int | None = None
    """Cap on output tokens."""

    def __post_init__(self) -> None:
        _require(
            (self.pairs is None) != (self.trace is None),
            "give exactly one of `pairs` (inline) or `trace` (a trace file)",
        )
        if self.pairs is not None:
            _require(len(self.pairs) > 0, "`pairs` must not be empty")
            _require(
                all(i >= 0 and o >= 0 for i, o in self.pairs),
                "`pairs` must hold non-negative [input_tokens, output_tokens]",
            )
            if self.weights is not None:
                _require(
                    len(self.weights) == len(self.pairs),
                    f"`weights` has {len(self.weights)} entries but `pairs` has "
                    f"{len(self.pairs)}; give one weight per pair",
                )
        _positive("max_input_tokens", self.max_input_tokens)
        _positive("max_output_tokens", self.max_output_tokens)


# --------------------------------------------------------------------------------------
# Arrival processes (tasks per second)
# --------------------------------------------------------------------------------------


class Burst(_Spec, frozen=True, kw_only=True):
    """A window of extra or different load on top of an arrival process.

    Give exactly one of ``rate_per_s`` (the rate during the burst), ``add_rate_per_s``
    (added to the base rate) or ``multiplier`` (the base rate times this).
    """

    start_s: float
    """When the burst starts, seconds from the start of the run."""

    duration_s: float
    """How long it lasts."""

    rate_per_s: float | None = None
    """The arrival rate during the burst (replaces the base rate)."""

    add_rate_per_s: float | None = None
    """Added to the base rate during the burst."""

    multiplier: float | None = None
    """The base rate is multiplied by this during the burst."""

    every_s: float | None = None
    """Repeat the burst with this period (default: once)."""

    def __post_init__(self) -> None:
        _finite_nonneg("start_s", self.start_s)
        _positive("duration_s", self.duration_s)
        given = [
            n
            for n, v in (
                ("rate_per_s", self.rate_per_s),
                ("add_rate_per_s", self.add_rate_per_s),
                ("multiplier", self.multiplier),
            )
            if v is not None
        ]
        _require(
            len(given) == 1,
            "give exactly one of `rate_per_s`, `add_rate_per_s` or `multiplier` "
            f"(got {', '.join(given) or 'none'})",
        )
        _finite_nonneg("rate_per_s", self.rate_per_s)
        _finite_nonneg("add_rate_per_s", self.add_rate_per_s)
        _finite_nonneg("multiplier", self.multiplier)
        if self.every_s is not None:
            _require(
                self.every_s > self.duration_s,
                f"`every_s` ({self.every_s}) must exceed `duration_s` ({self.duration_s}) "
                "so that repeats do not overlap",
            )


class _Arrivals(_Spec, frozen=True, kw_only=True, tag_field="process"):
    """An arrival process; the ``process`` key picks it."""


class _RateArrivals(_Arrivals, frozen=True, kw_only=True):
    bursts: list[Burst] = []
    """Bursts layered on this process."""


class Constant(_RateArrivals, frozen=True, kw_only=True, tag="constant"):
    """Evenly spaced arrivals at ``rate_per_s``."""

    rate_per_s: float
    """Arrivals per second."""

    def __post_init__(self) -> None:
        _finite_nonneg("rate_per_s", self.rate_per_s)


class PoissonArrivals(_RateArrivals, frozen=True, kw_only=True, tag="poisson"):
    """Poisson arrivals at ``rate_per_s`` (exponential gaps, CV 1)."""

    rate_per_s: float
    """Arrivals per second."""

    def __post_init__(self) -> None:
        _finite_nonneg("rate_per_s", self.rate_per_s)


class GammaArrivals(_RateArrivals, frozen=True, kw_only=True, tag="gamma"):
    """Renewal arrivals with gamma gaps: ``cv`` > 1 is burstier than Poisson, < 1 smoother."""

    rate_per_s: float
    """Arrivals per second (mean)."""
    cv: float
    """Coefficient of variation of the gaps (1 = Poisson)."""

    def __post_init__(self) -> None:
        _finite_nonneg("rate_per_s", self.rate_per_s)
        _positive("cv", self.cv)


class OnOff(_RateArrivals, frozen=True, kw_only=True, tag="on_off"):
    """Alternating on and off periods, as in bursty coding traffic.

    During "on" periods arrivals come at ``on_rate_per_s``, during "off" periods at
    ``off_rate_per_s`` (default 0). Period lengths are drawn from their distributions.
    """

    on_rate_per_s: float
    """Arrivals per second during on periods."""
    off_rate_per_s: float = 0.0
    """Arrivals per second during off periods."""
    on_s: Distribution
    """Length of an on period, seconds."""
    off_s: Distribution
    """Length of an off period, seconds."""
    cv: float = 1.0
    """CV of the gaps inside a period (1 = Poisson, 0 = evenly spaced)."""
    start_on: bool = True
    """Whether the run starts in an on period."""

    def __post_init__(self) -> None:
        _check_bare("on_s", self.on_s)
        _check_bare("off_s", self.off_s)
        _finite_nonneg("on_rate_per_s", self.on_rate_per_s)
        _finite_nonneg("off_rate_per_s", self.off_rate_per_s)
        _finite_nonneg("cv", self.cv)


class Step(_Spec, frozen=True, kw_only=True):
    """One step of a piecewise-constant rate schedule."""

    duration_s: float
    """How long the step lasts."""

    rate_per_s: float
    """The arrival rate during the step."""

    def __post_init__(self) -> None:
        _positive("duration_s", self.duration_s)
        _finite_nonneg("rate_per_s", self.rate_per_s)


class Schedule(_RateArrivals, frozen=True, kw_only=True, tag="schedule"):
    """A piecewise-constant rate schedule, such as seed 002's minute-by-minute rates."""

    steps: list[Step]
    """The steps, in order."""
    cv: float = 1.0
    """CV of the gaps within the schedule (1 = Poisson, 0 = evenly spaced)."""
    repeat: bool = True
    """Start over after the last step (otherwise the rate stays at the last step's)."""

    def __post_init__(self) -> None:
        _require(len(self.steps) > 0, "`steps` must not be empty")
        _finite_nonneg("cv", self.cv)


class Window(_Spec, frozen=True, kw_only=True):
    """A time window of a trace, seconds from its first arrival."""

    start_s: float = 0.0
    """Start of the window."""

    end_s: float | None = None
    """End of the window (default: the end of the trace)."""

    def __post_init__(self) -> None:
        _finite_nonneg("start_s", self.start_s)
        if self.end_s is not None:
            _require(
                self.end_s > self.start_s,
                f"`end_s` ({self.end_s}) must be after `start_s` ({self.start_s})",
            )


class TraceReplay(_Arrivals, frozen=True, kw_only=True, tag="trace"):
    """Replay a trace file with its own timestamps.

    Each trace row is one call (a one-call task). Timestamps are cropped to ``window``,
    shifted to start at 0, multiplied by ``time_scale``, then thinned or replicated to
    ``rate_scale``. Quantised timestamps (Mooncake's 3 s ticks) follow ``tick_policy``.
    """

    path: str
    """The trace file, relative to the workload file."""

    format: Literal["auto", "azure", "mooncake", "generic"] = "auto"
    """The trace format (``auto`` detects it from the name and first line)."""

    columns: dict[str, str] | None = None
    """The file's names for the generic format's fields, e.g. ``{arrival: arrival_s,
    tenant: client_id}`` (fields: arrival, input_tokens, output_tokens, tenant, priority,
    session_id, prefix_id); the file is then read as generic."""

    time_scale: float = 1.0
    """Multiply timestamps by this: 0.5 replays twice as fast."""

    rate_scale: float = 1.0
    """Keep this many requests per trace request: < 1 thins at random, > 1 replicates
    (each copy is shifted by a random offset within the trace's median gap)."""

    window: Window | None = None
    """Replay only this window of the trace."""

    tick_policy: Literal["auto", "literal", "spread"] = "auto"
    """Quantised timestamps: ``literal`` fires each tick's requests at once, ``spread``
    spreads them uniformly over the tick, ``auto`` spreads only when a tick is detected
    (most gaps exactly 0 and the rest nearly constant)."""

    lengths: Literal["trace", "class"] = "trace"
    """Take token counts from the trace (default) or draw them from the class."""

    def __post_init__(self) -> None:
        _positive("time_scale", self.time_scale)
        _positive("rate_scale", self.rate_scale)


Arrivals = Constant | PoissonArrivals | GammaArrivals | OnOff | Schedule | TraceReplay
"""An arrival process, picked by its ``process`` key."""


# --------------------------------------------------------------------------------------
# Classes, SLOs, sources, tenants, routes, clients, planning inputs
# --------------------------------------------------------------------------------------


class Slo(_Spec, frozen=True, kw_only=True):
    """What a class was promised. A request meets its SLO when it meets every named bound."""

    ttft_s: float | None = None
    """Time to first token, from arrival at the measured boundary."""

    tpot_s: float | None = None
    """Time per output token after the first: (e2e − TTFT) / (output tokens − 1)."""

    e2e_s: float | None = None
    """End-to-end latency of one call."""

    task_deadline_s: float | None = None
    """Deadline of the whole task (all its calls, branches and tool calls)."""

    attainment_target: float = 0.9
    """The fraction of requests that must meet the SLO; the knee is where this breaks."""

    placeholder: bool = False
    """``true``: a default that ``headway trace fit`` wrote, not a promise anyone made;
    ``workload check`` and ``plan`` say so until it is edited and this is removed."""

    @property
    def bounds_latency(self) -> bool:
        """True when a call can miss it: it names ``ttft_s``, ``tpot_s`` or ``e2e_s``
        (SLO attainment counts calls; ``task_deadline_s`` is judged per task)."""
        return self.ttft_s is not None or self.tpot_s is not None or self.e2e_s is not None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s", "task_deadline_s"):
            _positive(name, getattr(self, name))
        _require(
            0 < self.attainment_target <= 1,
            f"`attainment_target` must be in (0, 1] (got {self.attainment_target}); "
            "write 0.9 for 90%",
        )


class TaskClass(_Spec, frozen=True, kw_only=True):
    """A kind of task: how many calls it makes, how big they are, what it was promised."""

    calls: Distribution = 1.0
    """Generation calls per task, made one after another. A fractional number is a mean
    (7.5 gives 7 or 8 calls); a distribution is rounded to whole calls, at least 1."""

    parallel_branches: int = 1
    """Each call step fans out to this many parallel calls (1 = strictly sequential)."""

    branch_join: Literal["all", "first"] = "all"
    """A step with branches waits for ``all`` of them, or takes the ``first`` to finish
    and cancels the others."""

    cancel_losers_after_s: float = 0.0
    """With ``branch_join: first``: how long the losing branches keep running after the
    winner finished before the task cancels them (0: at once). An orchestrator that
    cancels late burns capacity after the user already has an answer (seed 002); the
    tokens they compute are wasted work."""

    tools_per_call: Distribution = 0.0
    """Tool calls after each generation call (except the last), sequential."""

    tool_latency_s: Distribution = 0.0
    """Latency of one tool call, seconds (ignored when ``tool_service`` is set)."""

    tool_service: str | None = None
    """The service (under ``services``) each tool call uses. When set, a tool call's
    latency is that service's queueing plus its ``service_time_s`` (a timeout or a
    refusal when the service says so) instead of ``tool_latency_s``; the calls of one
    step are made one after another. None: tool calls take ``tool_latency_s`` and share
    nothing."""

    input_tokens: Distribution = 1000.0
    """Prompt tokens per call."""

    output_tokens: Distribution = 200.0
    """Generated tokens per call."""

    joint_tokens: JointTokens | None = None
    """Draw input and output tokens together (overrides ``input_tokens``/``output_tokens``)."""

    max_tokens: int | None = None
    """The ``max_tokens`` each call sends (None: calls send none, and admission uses the
    class's p95 output instead)."""

    priority: Priority = "interactive"
    """The priority band of the class's calls."""

    route: str | None = None
    """The route its calls go to (default: the first route)."""

    slo: Slo = Slo()
    """What the class was promised."""

    retry_multiplier: float = 1.0
    """Planning only: measured calls per call including retries and fallbacks (seed 002's
    1.15). The simulator models retries from ``clients.retries`` instead."""

    mean_residence_s: float | None = None
    """Planning only: measured mean time a task spends in the system, for Little's law."""

    mean_call_s: float | None = None
    """Planning only: measured mean time a call spends in the system, for Little's law."""

    idempotent: bool = True
    """Whether a call may be retried safely (a refund is not)."""

    optional: bool = False
    """Its calls are optional or speculative (a prefetch, a suggestion): a degraded mode
    with ``shed_optional`` sheds them (live: they carry ``x-headway-optional: true``)."""

    verification_calls: int = 0
    """Calls after the task's own that check its result (drawn like its other calls);
    seed 002's verified outcome: an answer counts once something accepted it."""

    acceptance_probability: float = 1.0
    """The chance a finished task's outcome is accepted (its verification passes). A
    rejected outcome is retried (its calls and verification again, up to
    ``max_task_attempts`` in all); only an accepted outcome within the task's deadline
    counts as verified-outcome goodput."""

    max_task_attempts: int = 1
    """Attempts at the task in all when outcomes are rejected (1: a rejected outcome is
    not retried)."""

    max_unit_tokens: int | None = None
    """Background work in bounded units (seed 000: "large backfill requests divided into
    bounded units"): a call whose prompt plus output exceeds this is split into units of
    at most this many tokens, its prompt and output divided evenly among them, run one
    after another (None: calls are not split). Needs ``parallel_branches: 1``."""

    @property
    def expected_attempts(self) -> float:
        """Mean attempts per task: 1 + (1 − p) + ... + (1 − p)^(m − 1) for acceptance
        probability p and at most m attempts."""
        q = 1.0 - self.acceptance_probability
        return sum(q**k for k in range(self.max_task_attempts))

    def __post_init__(self) -> None:
        for name in ("calls", "tools_per_call", "tool_latency_s", "input_tokens", "output_tokens"):
            _check_bare(name, getattr(self, name))
        _require(
            1 <= self.parallel_branches <= 64,
            f"`parallel_branches` must be between 1 and 64 (got {self.parallel_branches})",
        )
        _require(
            math.isfinite(self.cancel_losers_after_s) and self.cancel_losers_after_s >= 0,
            f"`cancel_losers_after_s` must be a finite number of seconds >= 0 (got "
            f"{self.cancel_losers_after_s})",
        )
        _require(
            0 <= self.verification_calls <= 16,
            f"`verification_calls` must be between 0 and 16 (got {self.verification_calls})",
        )
        _require(
            0 < self.acceptance_probability <= 1,
            f"`acceptance_probability` must be in (0, 1] (got {self.acceptance_probability}); "
            "write 0.8 for 80% of outcomes accepted",
        )
        _require(
            self.max_unit_tokens is None or self.max_unit_tokens >= 2,
            f"`max_unit_tokens` must be >= 2 (got {self.max_unit_tokens}): a unit holds at "
            "least one prompt and one output token",
        )
        _require(
            self.max_unit_tokens is None or self.parallel_branches == 1,
            f"`max_unit_tokens` splits a call into units run one after another; it needs "
            f"`parallel_branches: 1` (got {self.parallel_branches})",
        )
        _require(
            1 <= self.max_task_attempts <= 10,
            f"`max_task_attempts` must be between 1 and 10 (got {self.max_task_attempts})",
        )
        _require(
            self.cancel_losers_after_s == 0 or self.branch_join == "first",
            f"`cancel_losers_after_s` ({self.cancel_losers_after_s}) applies to "
            "`branch_join: first` only (with `all` no branch loses); remove it or set "
            "`branch_join: first`",
        )
        _require(
            math.isfinite(self.retry_multiplier) and self.retry_multiplier >= 1,
            f"`retry_multiplier` must be >= 1 (got {self.retry_multiplier}); "
            "1.15 means 15% extra calls from retries and fallbacks",
        )
        _positive("max_tokens", self.max_tokens)
        _positive("mean_residence_s", self.mean_residence_s)
        _positive("mean_call_s", self.mean_call_s)


class Source(_Spec, frozen=True, kw_only=True):
    """A stream of task arrivals with its class mix."""

    name: str
    """A unique name for reports."""

    arrivals: Arrivals
    """The arrival process of tasks."""

    mix: dict[str, float] | None = None
    """Share of each class in this source's tasks (normalised; default: one class, which
    must then be the only class)."""

    tenants: dict[str, float] | None = None
    """Share of each tenant in this source (normalised; default: the tenants' ``share``)."""

    busy_rate_per_s: float | None = None
    """Planning only: the busy-period task rate (default: the process's mean rate)."""

    peak_rate_per_s: float | None = None
    """Planning only: the peak task rate (default: the process's highest rate)."""

    capacity_per_s: float | None = None
    """Planning only: tasks per second the system completes for this source, for the fluid
    burst model (default: from the route's ``requests_per_s``, else from sized replicas)."""

    def __post_init__(self) -> None:
        _require(bool(self.name), "`name` must not be empty")
        _positive("busy_rate_per_s", self.busy_rate_per_s)
        _positive("peak_rate_per_s", self.peak_rate_per_s)
        _positive("capacity_per_s", self.capacity_per_s)
        for label, shares in (("mix", self.mix), ("tenants", self.tenants)):
            if shares is not None:
                _require(len(shares) > 0, f"`{label}` must not be empty")
                _require(
                    all(math.isfinite(v) and v >= 0 for v in shares.values())
                    and sum(shares.values()) > 0,
                    f"`{label}` shares must be >= 0 with a positive sum",
                )


class Tenant(_Spec, frozen=True, kw_only=True):
    """A customer or workload owner."""

    share: float = 1.0
    """Share of traffic (normalised across tenants) when a source names no tenants."""

    weight: float = 1.0
    """Fairness weight: a tenant with weight 2 is owed twice the token service of weight 1."""

    max_priority: Priority = "interactive"
    """The most important priority this tenant's requests may ask for."""

    attainment_target: float | None = None
    """The share of this tenant's calls that must meet their class's SLO. ``plan`` sizes
    for every tenant with a target as for the overall one (the worst decides), reports
    each beside the overall attainment and names those that miss. None: the tenant counts
    only in the overall attainment (a tenant's misses hide in it otherwise: 98.6% overall
    with a bursty tenant at 76.7%)."""

    def __post_init__(self) -> None:
        _finite_nonneg("share", self.share)
        _positive("weight", self.weight)
        _require(
            self.attainment_target is None or 0 < self.attainment_target <= 1,
            f"`attainment_target` must be in (0, 1] (got {self.attainment_target}); "
            "e.g. 0.95 for 95% of the tenant's calls within their SLO",
        )


class ReplicaCapacity(_Spec, frozen=True, kw_only=True):
    """Measured capacity of one replica of a route at its SLO, for the analytic plan."""

    output_tokens_per_s: float | None = None
    """Output (decode) tokens per second one replica sustains within the SLO."""

    input_tokens_per_s: float | None = None
    """Input (prefill) tokens per second one replica sustains within the SLO."""

    price_per_hour: float | None = None
    """What one replica costs per hour, for cost per successful task."""

    def __post_init__(self) -> None:
        _positive("output_tokens_per_s", self.output_tokens_per_s)
        _positive("input_tokens_per_s", self.input_tokens_per_s)
        _finite_nonneg("price_per_hour", self.price_per_hour)


class Route(_Spec, frozen=True, kw_only=True):
    """A model route: where calls go, what it can carry, and what may stand in for it."""

    model: str | None = None
    """The model served (a catalog name such as ``llama-3-8b``)."""

    revision: str | None = None
    """The model revision; requests pinned to it only reach matching replicas."""

    replica: ReplicaCapacity | None = None
    """Measured per-replica capacity, for replica sizing."""

    requests_per_s: float | None = None
    """Effective capacity of the whole route in requests per second at SLO, for the
    queueing models."""

    servers: int = 1
    """Servers behind ``requests_per_s`` for the M/M/c model (each serves
    ``requests_per_s / servers``)."""

    service_time_cv: float = 1.0
    """CV of the service time for the M/G/1 model (1 = exponential)."""

    fallback: str | None = None
    """A route that may take this route's calls when it cannot."""

    data_policy: str = "default"
    """Data-handling class; a fallback must have the same one."""

    quality_class: str = "default"
    """Evaluated quality class; a fallback must have the same one."""

    quota_requests_per_s: float | None = None
    """Planning only: the route's request quota, a fixed external limit such as a hosted
    API's rate limit (its requests per minute / 60). Adding replicas does not raise it;
    ``headway plan --growth`` reports the growth at which calls reach it."""

    quota_tokens_per_s: float | None = None
    """Planning only: the route's token quota (input plus output tokens per second; a
    hosted API's tokens per minute / 60), a fixed external limit like
    ``quota_requests_per_s``."""

    def __post_init__(self) -> None:
        _positive("requests_per_s", self.requests_per_s)
        _positive("quota_requests_per_s", self.quota_requests_per_s)
        _positive("quota_tokens_per_s", self.quota_tokens_per_s)
        _require(self.servers >= 1, f"`servers` must be >= 1 (got {self.servers})")
        _finite_nonneg("service_time_cv", self.service_time_cv)


class Retries(_Spec, frozen=True, kw_only=True):
    """How a client retries a failed or refused call."""

    max_attempts: int = 1
    """Attempts in all, including the first (1 = never retry)."""

    backoff_base_s: float = 0.5
    """First backoff; it doubles on each further attempt."""

    backoff_max_s: float = 30.0
    """Upper bound of one backoff."""

    jitter: Literal["full", "equal", "none"] = "full"
    """``full``: wait uniform(0, backoff); ``equal``: backoff/2 + uniform(0, backoff/2)."""

    honour_retry_after: bool = True
    """Wait at least the server's ``Retry-After`` when it sends one."""

    budget_ratio: float | None = 0.1
    """Retry budget: retries at most this fraction of the client's recent requests
    (``null``: no budget, every retry the attempts allow is sent). 0.1 is the per-client
    budget of Google's SRE book ("Handling Overload"): under a storm, load grows by at
    most 10%."""

    timeout_s: float | None = None
    """Per-attempt timeout: a client with no first token this long after sending an
    attempt abandons it (the attempt is cancelled, its KV freed) and retries under these
    rules (``null``: no timeout; ``patience_s`` may still give up). A stream that has
    started is never retried."""

    budget_window_s: float = 10.0
    """The sliding window over which the retry budget counts requests and retries."""

    def __post_init__(self) -> None:
        if self.budget_ratio is not None:
            _require(
                0 <= self.budget_ratio <= 1,
                f"`budget_ratio` must be in [0, 1] (got {self.budget_ratio}); 0.2 allows "
                "retries of 20% of recent requests, null turns the budget off",
            )
        _positive("budget_window_s", self.budget_window_s)
        _positive("timeout_s", self.timeout_s)
        _require(
            1 <= self.max_attempts <= 100,
            f"`max_attempts` must be between 1 and 100 (got {self.max_attempts})",
        )
        _finite_nonneg("backoff_base_s", self.backoff_base_s)
        _finite_nonneg("backoff_max_s", self.backoff_max_s)


class Clients(_Spec, frozen=True, kw_only=True):
    """How the people and programs behind a source behave while they wait."""

    retries: Retries = Retries()
    """How a failed or refused call is retried."""

    patience_s: Distribution | None = None
    """How long a client waits for the first token before giving up (cancelling)."""

    duplicate_after_s: float | None = None
    """A client still waiting this long may submit the same task again (seed 000)."""

    duplicate_probability: float = 0.0
    """The chance that a client waiting past ``duplicate_after_s`` resubmits."""

    def __post_init__(self) -> None:
        _check_bare("patience_s", self.patience_s)
        _positive("duplicate_after_s", self.duplicate_after_s)
        _require(
            0 <= self.duplicate_probability <= 1,
            f"`duplicate_probability` must be in [0, 1] (got {self.duplicate_probability})",
        )


class Autoscaling(_Spec, frozen=True, kw_only=True):
    """How fast capacity can be added, for the autoscaling check."""

    detection_s: float = 30.0
    """Time to notice overload."""

    startup_s: float = 120.0
    """Time for a new replica to become ready (model load, compilation, warm-up)."""

    def __post_init__(self) -> None:
        _finite_nonneg("detection_s", self.detection_s)
        _finite_nonneg("startup_s", self.startup_s)


class Service(_Spec, frozen=True, kw_only=True):
    """A capacity-limited dependency that tool calls queue for: a database connection
    pool (``servers`` connections) or an external API with a rate limit. Calls are served
    first come, first served; a call that times out while running keeps its connection
    until its work finishes (seed 000: more workers in front of a fixed pool only add
    waiting and retries)."""

    servers: int = 1
    """Calls served at once: connections in the pool, or the API's concurrency."""

    service_time_s: Distribution = 0.05
    """Time one call holds a connection, seconds (drawn per tool call)."""

    rate_limit_per_s: float | None = None
    """Calls the service accepts per second (a token bucket); null: no rate limit."""

    burst: float = 1.0
    """Calls that may start at once after an idle spell (the bucket's size); only used
    with ``rate_limit_per_s``."""

    queue_limit: int | None = None
    """Calls that may wait at once; one more is refused at once (null: no limit)."""

    timeout_s: float | None = None
    """The caller's timeout on wait plus service (null: none). A call still waiting when
    it fires never runs; a running one keeps its connection until it finishes."""

    def __post_init__(self) -> None:
        _check_bare("service_time_s", self.service_time_s)
        _require(self.servers >= 1, f"`servers` must be >= 1 (got {self.servers})")
        _positive("rate_limit_per_s", self.rate_limit_per_s)
        _require(
            math.isfinite(self.burst) and self.burst >= 1,
            f"`burst` must be >= 1 (got {self.burst}); 1 spaces calls evenly at the rate",
        )
        if self.queue_limit is not None:
            _require(
                self.queue_limit >= 0,
                f"`queue_limit` must be >= 0 or null (got {self.queue_limit})",
            )
        _positive("timeout_s", self.timeout_s)


class Planning(_Spec, frozen=True, kw_only=True):
    """Inputs of the analytic plan that are not part of the traffic."""

    planning_factor: float = 0.7
    """Plan each replica at this fraction of its measured capacity (headroom is a latency
    feature; 0.7 is seed 000's provisional choice, not a universal optimum)."""

    failures_tolerated: int = 0
    """Replicas that may be lost while the rest still hold the peak."""

    autoscaling: Autoscaling | None = None
    """Add the autoscaling check."""

    def __post_init__(self) -> None:
        _require(
            0 < self.planning_factor <= 1,
            f"`planning_factor` must be in (0, 1] (got {self.planning_factor}); write 0.7 for 70%",
        )
        _require(
            self.failures_tolerated >= 0,
            f"`failures_tolerated` must be >= 0 (got {self.failures_tolerated})",
        )


class WorkloadSpec(_Spec, frozen=True, kw_only=True):
    """A whole workload file."""

    name: str
    """A short name for reports."""

    version: int = FORMAT_VERSION
    """The format version (currently 1)."""

    description: str = ""
    """Free text for reports."""

    seed: int = 0
    """The run seed: every random stream derives from it."""

    duration_s: float = 600.0
    """How long a compiled run lasts (trace replays: at most this long)."""

    classes: dict[str, TaskClass]
    """Task classes by name."""

    sources: list[Source]
    """Arrival streams of tasks."""

    tenants: dict[str, Tenant] = msgspec.field(default_factory=lambda: {"default": Tenant()})
    """Tenants by name (default: one tenant called ``default``)."""

    routes: dict[str, Route] = msgspec.field(default_factory=lambda: {"default": Route()})
    """Routes by name (default: one route called ``default``)."""

    clients: Clients = Clients()
    """How clients behave while they wait."""

    services: dict[str, Service] = msgspec.field(default_factory=dict)
    """Downstream services by name (database pools, external APIs) that tool calls queue
    for; a class names one with ``tool_service``."""

    planning: Planning = Planning()
    """Inputs of the analytic plan."""

    def __post_init__(self) -> None:
        _require(
            self.version == FORMAT_VERSION,
            f"`version` {self.version} is not supported; this headway reads version "
            f"{FORMAT_VERSION}",
        )
        _require(self.seed >= 0, f"`seed` must be >= 0 (got {self.seed})")
        _positive("duration_s", self.duration_s)
        _require(len(self.classes) > 0, "`classes` must define at least one class")
        _require(len(self.sources) > 0, "`sources` must define at least one source")
        _require(len(self.tenants) > 0, "`tenants` must define at least one tenant")
        _require(len(self.routes) > 0, "`routes` must define at least one route")
