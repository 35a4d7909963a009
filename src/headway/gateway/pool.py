"""The gateway's upstream pool: readiness by fingerprint, warm-up, drain and engine load.

Each upstream is probed on a fixed schedule (every ``probe_interval_s``) in a reserved
lane: its own aiohttp session and connection, its own deadline, a fixed greedy prompt
whose answer must equal the expected fingerprint of the model revision
(:mod:`headway.gateway.probe`). The verdicts move the upstream's health:

=============  ==========================================================  ==========
health         entered when                                                 routable
=============  ==========================================================  ==========
``warming``    at start; after a pass while excluded or unreachable; after  no
               :meth:`UpstreamPool.undrain`
``ready``      ``warmup_probes`` passes in a row (no wrong or failed probe  yes
               between them); a pass while busy
``busy``       a probe timed out or got 429/503 while ready                 yes
``excluded``   a complete answer that differs (``fingerprint mismatch``)    no
               or a contract refusal: fail closed until it matches again
``unreachable``  ``unreachable_after_probes`` probes in a row got no answer  no
=============  ==========================================================  ==========

A busy probe never excludes (a loaded replica's output is not wrong); while warming, it
neither counts nor resets the warm-up. ``draining`` is the admin's: a draining upstream
is not routable whatever its health, its in-flight requests finish (the gateway cancels
what is left at the deadline), and probes go on so that :meth:`UpstreamPool.undrain`
knows its health; re-admission then waits for the warm-up again.

Load comes from two sides: the gateway's own counters (:meth:`Upstream.started`,
:meth:`Upstream.finished`, exact and current) and the engine's ``/metrics`` scraped
every ``metrics_interval_s`` with vLLM's names (running, waiting, KV usage and, when
``vllm:cache_config_info`` is exposed, the KV block count).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import aiohttp
import msgspec

from headway.core.errors import ConfigError, config_error
from headway.gateway.probe import (
    DEFAULT_PROBE_PROMPT,
    TOKEN_IDS_PREFIX,
    EngineMetrics,
    ProbeOutcome,
    ProbeResult,
    logprob_checksum,
    probe_session,
    run_probe,
    scrape_metrics,
)

__all__ = [
    "NOMINAL_KV_BLOCKS",
    "PoolConfig",
    "PoolConfigError",
    "PoolUpstreamConfig",
    "Upstream",
    "UpstreamHealth",
    "UpstreamPool",
    "UpstreamStateName",
    "parse_pool_config",
]

_log = logging.getLogger("headway.gateway.pool")

UpstreamHealth = Literal["warming", "ready", "busy", "excluded", "unreachable"]
"""What the probes say about an upstream."""

UpstreamStateName = Literal["warming", "ready", "busy", "excluded", "unreachable", "draining"]
""":attr:`Upstream.state`: the health, or ``draining`` while the admin drains it."""

NOMINAL_KV_BLOCKS: Final = 10_000
"""Scale of :attr:`Upstream.free_kv_blocks` when the engine's block count is unknown
(neither ``vllm:cache_config_info`` nor ``kv_blocks``): a relative figure, so that
``kv_aware`` routing still prefers the emptier replica."""

_ROUTABLE: Final = frozenset({"ready", "busy"})


class PoolConfigError(ConfigError, ValueError):
    """A pool config field is invalid; the message names the field, the value and a fix.

    Also a ``ValueError``, so that msgspec, decoding a config file, reports it with the
    key path."""


def _require(ok: bool, field: str, value: object, fix: str) -> None:
    if not ok:
        raise PoolConfigError(f"{field} is invalid (got {value!r}): {fix}", path=f"$.{field}")


class PoolUpstreamConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One engine of the pool and how to tell that it serves the right thing."""

    url: str
    """Its base URL, without ``/v1`` (e.g. ``http://10.0.0.5:8000``)."""

    revision: str | None = None
    """The model revision it serves; requests pinned to a revision reach only upstreams
    with that revision."""

    fingerprint: str | None = None
    """The expected probe answer: the completion text of the fixed greedy prompt,
    ``sha256:HEX`` of it, or ``token_ids:PROMPT/OUTPUT`` (the ids vLLM returns with
    ``return_token_ids``: :func:`headway.gateway.probe.token_ids_fingerprint`).
    Default: ``fingerprints[revision]``, else computed from
    ``model``."""

    model: str | None = None
    """For ``headway emulate`` upstreams: the catalog model it emulates; the expected
    fingerprint is then computed for ``revision`` (see
    :func:`headway.emulate.tokens.fingerprint`)."""

    served_model: str | None = None
    """The name the probe sends in ``model``. Default: ``model``, else the first id of the
    upstream's ``/v1/models`` (asked once)."""

    kv_blocks: int | None = None
    """Its KV blocks (vLLM's ``num_gpu_blocks``), when ``/metrics`` does not say."""

    api_key: str | None = None
    """Bearer token sent with probes and scrapes."""

    def __post_init__(self) -> None:
        _require(
            self.url.startswith(("http://", "https://")) and len(self.url.rstrip("/")) > 8,
            "upstreams[].url",
            self.url,
            "write the engine's base URL, e.g. http://127.0.0.1:8000",
        )
        _require(
            not self.url.rstrip("/").endswith("/v1"),
            "upstreams[].url",
            self.url,
            "leave out /v1: the pool adds /v1/completions and /metrics itself",
        )
        _require(
            self.kv_blocks is None or self.kv_blocks >= 1,
            "upstreams[].kv_blocks",
            self.kv_blocks,
            "a block count >= 1 (vLLM logs it as '# GPU blocks'), or omit it",
        )
        _require(
            self.fingerprint is None or self.fingerprint != "",
            "upstreams[].fingerprint",
            self.fingerprint,
            "the expected completion text of the probe, sha256:HEX of it, or token_ids:P,../O,..",
        )
        if self.fingerprint is not None and self.fingerprint.startswith(TOKEN_IDS_PREFIX):
            try:
                checksum = logprob_checksum(self.fingerprint)
            except ValueError:
                checksum = None
                _require(
                    False, "upstreams[].fingerprint", self.fingerprint,
                    "after ;logprob_sum: a number, optionally ~ and a tolerance "
                    "(e.g. ;logprob_sum:-3.25~0.05)",
                )  # fmt: skip
            plain = self.fingerprint if checksum is None else checksum[0]
            ids = plain[len(TOKEN_IDS_PREFIX) :].split("/")
            _require(
                len(ids) == 2 and all(i.isdigit() for part in ids for i in part.split(",")),
                "upstreams[].fingerprint",
                self.fingerprint,
                "token_ids: then the prompt's ids, a slash and the answer's ids, each "
                "comma-separated (e.g. token_ids:12,7/44,5), then optionally "
                ";logprob_sum:X",
            )
        if self.fingerprint is not None and self.fingerprint.startswith("sha256:"):
            digest = self.fingerprint[len("sha256:") :]
            _require(
                len(digest) == 64 and all(c in "0123456789abcdefABCDEF" for c in digest),
                "upstreams[].fingerprint",
                self.fingerprint,
                "sha256: followed by 64 hex digits",
            )
        if self.model is not None:
            _require(
                self.revision is not None,
                "upstreams[].revision",
                self.revision,
                f"set the revision the emulator serves (its --revision, default r1): the "
                f"fingerprint of model {self.model!r} depends on it",
            )
            from headway.core.engine.catalog import get_model

            try:
                get_model(self.model)
            except ConfigError as error:
                raise PoolConfigError(
                    f"upstreams[].model is invalid (got {self.model!r}): {error}",
                    path="$.model",
                ) from None

    @property
    def base_url(self) -> str:
        """``url`` without a trailing slash."""
        return self.url.rstrip("/")


class PoolConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The upstream pool: its engines, the readiness probe, warm-up and metrics scraping."""

    upstreams: tuple[PoolUpstreamConfig, ...]
    """The engines (at least one)."""

    fingerprints: dict[str, str] = msgspec.field(default_factory=dict)
    """Expected probe answer per revision (text or ``sha256:HEX``), for upstreams that do
    not give their own ``fingerprint``."""

    probe_prompt: str = DEFAULT_PROBE_PROMPT
    """The fixed prompt of the probe (sent with ``temperature: 0``)."""

    probe_max_tokens: int = 8
    """Tokens the probe asks for: enough to tell revisions apart, few enough to stay
    cheap on a loaded engine."""

    probe_interval_s: float = 2.0
    """Seconds between the starts of two probes of one upstream. A corrupted fingerprint
    is caught by the next probe: within this plus the probe's latency."""

    probe_deadline_s: float = 1.0
    """A probe not answered within this is ``busy`` (at most ``probe_interval_s``)."""

    warmup_probes: int = 2
    """Passing probes in a row before a new or re-admitted upstream takes traffic."""

    unreachable_after_probes: int = 3
    """Probes in a row without an answer (refused, reset) before it leaves rotation."""

    metrics_interval_s: float = 1.0
    """Seconds between two scrapes of an engine's ``/metrics``."""

    metrics_deadline_s: float = 0.5
    """A scrape not answered within this is skipped (at most ``metrics_interval_s``)."""

    def __post_init__(self) -> None:
        _require(
            len(self.upstreams) >= 1,
            "upstreams",
            list(self.upstreams),
            "list at least one engine, e.g. - url: http://127.0.0.1:8000",
        )
        seen: set[str] = set()
        for i, up in enumerate(self.upstreams):
            _require(
                up.base_url not in seen,
                f"upstreams[{i}].url",
                up.url,
                "list each engine once (a URL identifies an upstream)",
            )
            seen.add(up.base_url)
        for field, value in (
            ("probe_interval_s", self.probe_interval_s),
            ("probe_deadline_s", self.probe_deadline_s),
            ("metrics_interval_s", self.metrics_interval_s),
            ("metrics_deadline_s", self.metrics_deadline_s),
        ):
            _require(math.isfinite(value) and value > 0, field, value, "a number of seconds > 0")
        _require(
            self.probe_deadline_s <= self.probe_interval_s,
            "probe_deadline_s",
            self.probe_deadline_s,
            f"at most probe_interval_s ({self.probe_interval_s:g}): one probe at a time",
        )
        _require(
            self.metrics_deadline_s <= self.metrics_interval_s,
            "metrics_deadline_s",
            self.metrics_deadline_s,
            f"at most metrics_interval_s ({self.metrics_interval_s:g})",
        )
        _require(
            1 <= self.probe_max_tokens <= 256,
            "probe_max_tokens",
            self.probe_max_tokens,
            "an integer in 1..256 (8 is plenty to tell revisions apart)",
        )
        _require(
            self.probe_prompt != "",
            "probe_prompt",
            self.probe_prompt,
            "a fixed non-empty text",
        )
        _require(self.warmup_probes >= 1, "warmup_probes", self.warmup_probes, "an integer >= 1")
        _require(
            self.unreachable_after_probes >= 1,
            "unreachable_after_probes",
            self.unreachable_after_probes,
            "an integer >= 1",
        )
        for i, up in enumerate(self.upstreams):
            _require(
                up.fingerprint is not None
                or up.model is not None
                or (up.revision is not None and up.revision in self.fingerprints),
                f"upstreams[{i}].fingerprint",
                None,
                f"{up.url} has no expected fingerprint, and the pool fails closed: set its "
                "fingerprint (the probe's completion text, or sha256:HEX of it), its model "
                "(a headway emulate catalog model), or fingerprints[REVISION]",
            )

    def expected_fingerprint(self, upstream: PoolUpstreamConfig) -> str:
        """The answer the probe of ``upstream`` must get (text or ``sha256:HEX``)."""
        if upstream.fingerprint is not None:
            return upstream.fingerprint
        if upstream.revision is not None and upstream.revision in self.fingerprints:
            return self.fingerprints[upstream.revision]
        assert upstream.model is not None  # checked by __post_init__
        assert upstream.revision is not None
        from headway.core.engine.catalog import get_model
        from headway.emulate.tokens import fingerprint

        vocab_size = get_model(upstream.model).vocab_size
        return fingerprint(upstream.revision, self.probe_prompt, self.probe_max_tokens, vocab_size)


def parse_pool_config(data: object, source: str = "<pool>") -> PoolConfig:
    """Validate already-parsed data (a mapping) as a :class:`PoolConfig`.

    Raises:
        ConfigError: naming the key path, the value and the fix.
    """
    try:
        return msgspec.convert(data, PoolConfig)
    except msgspec.ValidationError as error:
        raise config_error(error, source, root=PoolConfig, data=data,
                           docs="docs/gateway.md") from None  # fmt: skip


class Upstream:
    """One engine of the pool: its health, the admin's drain, and its load.

    It is a :class:`~headway.core.policy.routing.LoadView`: routers read it directly.
    """

    __slots__ = (
        "_busy_since_s",
        "_routable",
        "_served_model",
        "api_key",
        "busy_probes",
        "config",
        "consecutive_failures",
        "consecutive_passes",
        "drain_deadline_at_s",
        "draining",
        "expected_fingerprint",
        "free_kv_blocks",
        "health",
        "inflight_requests",
        "inflight_tokens",
        "kv_blocks_total",
        "kv_usage_fraction",
        "last_probe",
        "last_probe_at_s",
        "metrics_at_s",
        "metrics_error",
        "probe_counts",
        "reason",
        "revision",
        "running_requests",
        "since_s",
        "since_unix_s",
        "url",
        "waiting_requests",
    )

    def __init__(self, config: PoolUpstreamConfig, expected_fingerprint: str) -> None:
        self.config = config
        self.url: str = config.base_url
        self.revision: str | None = config.revision
        self.api_key = config.api_key
        self.expected_fingerprint = expected_fingerprint
        self._served_model: str | None = config.served_model or config.model
        self.health: UpstreamHealth = "warming"
        """What the probes say (see the module's table)."""
        self.reason = "warming up: no probe yet"
        """Why it is in its state (``fingerprint mismatch``, ``timeout after 1 s``, ...)."""
        self.since_s = time.monotonic()
        """When it entered its state (``time.monotonic()`` seconds)."""
        self.since_unix_s = time.time()
        """The same moment, Unix seconds."""
        self._busy_since_s: float | None = None
        self.draining = False
        """The admin drains it: no new request."""
        self.drain_deadline_at_s: float | None = None
        """``time.monotonic()`` by which in-flight requests should be done."""
        self._routable = False
        self.consecutive_passes = 0
        self.consecutive_failures = 0
        self.busy_probes = 0
        """Busy probes in a row."""
        self.probe_counts: dict[ProbeOutcome, int] = {"pass": 0, "wrong": 0, "busy": 0, "error": 0}
        self.last_probe: ProbeResult | None = None
        self.last_probe_at_s: float | None = None
        self.inflight_requests = 0
        """Requests the gateway dispatched to it and not yet finished."""
        self.inflight_tokens = 0
        """Their tokens (as the gateway counted them at dispatch)."""
        self.running_requests = 0
        """``vllm:num_requests_running`` at the last scrape."""
        self.waiting_requests = 0
        """``vllm:num_requests_waiting`` at the last scrape (a LoadView field)."""
        self.kv_usage_fraction: float | None = None
        """``vllm:kv_cache_usage_perc`` at the last scrape (0-1), None before one."""
        self.kv_blocks_total: int | None = config.kv_blocks
        """Its KV blocks (``vllm:cache_config_info`` or the config), None if unknown."""
        self.free_kv_blocks: int = config.kv_blocks or NOMINAL_KV_BLOCKS
        """KV blocks free at the last scrape (a LoadView field; see NOMINAL_KV_BLOCKS)."""
        self.metrics_at_s: float | None = None
        """``time.monotonic()`` of the last successful scrape."""
        self.metrics_error = ""
        """Why the last scrape failed (empty when it worked)."""

    # ----------------------------------------------------------------- LoadView

    @property
    def ready(self) -> bool:
        """Routable: ready or busy, and not draining."""
        return self._routable

    @property
    def outstanding_requests(self) -> int:
        """Requests on it: the gateway's in-flight count, or the engine's running plus
        waiting when that is larger (other gateways, direct clients)."""
        scraped = self.running_requests + self.waiting_requests
        return self.inflight_requests if self.inflight_requests >= scraped else scraped

    @property
    def outstanding_tokens(self) -> int:
        """Tokens of the requests the gateway dispatched to it and not yet finished."""
        return self.inflight_tokens

    @property
    def state(self) -> UpstreamStateName:
        """``draining`` while drained by the admin, else its health."""
        return "draining" if self.draining else self.health

    @property
    def busy(self) -> bool:
        """The last probe was busy (timeout, 429 or 503)."""
        return self.busy_probes > 0

    @property
    def drained(self) -> bool:
        """Draining and nothing the gateway dispatched is still in flight."""
        return self.draining and self.inflight_requests == 0

    # ----------------------------------------------------------------- counters

    def started(self, tokens: int = 0) -> None:
        """The gateway dispatched a request of ``tokens`` (prompt + expected output)."""
        self.inflight_requests += 1
        self.inflight_tokens += tokens

    def finished(self, tokens: int = 0) -> None:
        """A dispatched request of ``tokens`` finished, failed or was cancelled."""
        self.inflight_requests = max(0, self.inflight_requests - 1)
        self.inflight_tokens = max(0, self.inflight_tokens - tokens)

    # ----------------------------------------------------------------- transitions

    def _enter(self, health: UpstreamHealth, reason: str, now_s: float) -> bool:
        changed = health != self.health or reason != self.reason
        if health != self.health:
            self.since_s = now_s
            self.since_unix_s = time.time()
        self.health = health
        self.reason = reason
        self._routable = not self.draining and health in _ROUTABLE
        return changed

    def _apply_probe(self, result: ProbeResult, now_s: float, warmup: int, limit: int) -> bool:
        """Move the health for a probe's verdict; True if the state or reason changed."""
        self.last_probe = result
        self.last_probe_at_s = now_s
        self.probe_counts[result.outcome] += 1
        outcome = result.outcome
        if outcome == "pass":
            self.consecutive_failures = 0
            self.busy_probes = 0
            self._busy_since_s = None
            if self.health in ("ready", "busy"):
                return self._enter("ready", "probes pass", now_s)
            self.consecutive_passes += 1
            if self.consecutive_passes >= warmup:
                return self._enter("ready", "probes pass", now_s)
            return self._enter(
                "warming", f"warming up: {self.consecutive_passes}/{warmup} probes passed", now_s
            )
        if outcome == "wrong":
            self.consecutive_passes = 0
            self.consecutive_failures = 0
            self.busy_probes = 0
            return self._enter("excluded", result.reason, now_s)
        if outcome == "busy":
            self.consecutive_failures = 0
            self.busy_probes += 1
            if self._busy_since_s is None:
                self._busy_since_s = now_s
            if self.health in _ROUTABLE:
                return self._enter("busy", f"busy: {result.reason}", now_s)
            return False  # busy says nothing about the output: nothing else moves
        self.consecutive_failures += 1
        self.consecutive_passes = 0
        self.busy_probes = 0
        if self.consecutive_failures >= limit:
            return self._enter("unreachable", f"unreachable: {result.reason}", now_s)
        return False

    def _apply_metrics(self, metrics: EngineMetrics, now_s: float) -> None:
        self.metrics_at_s = now_s
        self.metrics_error = ""
        if metrics.running_requests is not None:
            self.running_requests = metrics.running_requests
        if metrics.waiting_requests is not None:
            self.waiting_requests = metrics.waiting_requests
        if metrics.kv_blocks_total is not None:
            self.kv_blocks_total = metrics.kv_blocks_total
        if metrics.kv_usage_fraction is not None:
            self.kv_usage_fraction = metrics.kv_usage_fraction
            total = self.kv_blocks_total or NOMINAL_KV_BLOCKS
            self.free_kv_blocks = round((1.0 - metrics.kv_usage_fraction) * total)

    def snapshot(self, now_s: float | None = None) -> dict[str, Any]:
        """Its state as JSON-ready values (for ``/metrics`` and the admin API)."""
        now = time.monotonic() if now_s is None else now_s
        last = self.last_probe

        def age(at: float | None) -> float | None:
            return None if at is None else round(now - at, 3)

        return {
            "url": self.url,
            "revision": self.revision,
            "state": self.state,
            "health": self.health,
            "reason": self.reason,
            "ready": self._routable,
            "since_s": round(now - self.since_s, 3),
            "since_unix_s": round(self.since_unix_s, 3),
            "busy": self.busy,
            "busy_for_s": age(self._busy_since_s),
            "draining": self.draining,
            "drain_deadline_in_s": (
                None
                if self.drain_deadline_at_s is None
                else round(self.drain_deadline_at_s - now, 3)
            ),
            "drained": self.drained,
            "consecutive_passes": self.consecutive_passes,
            "consecutive_failures": self.consecutive_failures,
            "probes": dict(self.probe_counts),
            "last_probe": None
            if last is None
            else {
                "outcome": last.outcome,
                "reason": last.reason,
                "detail": last.detail,
                "latency_s": round(last.latency_s, 6),
                "age_s": age(self.last_probe_at_s),
            },
            "inflight_requests": self.inflight_requests,
            "inflight_tokens": self.inflight_tokens,
            "outstanding_requests": self.outstanding_requests,
            "running_requests": self.running_requests,
            "waiting_requests": self.waiting_requests,
            "kv_usage_fraction": self.kv_usage_fraction,
            "kv_blocks_total": self.kv_blocks_total,
            "free_kv_blocks": self.free_kv_blocks,
            "metrics_age_s": age(self.metrics_at_s),
            "metrics_error": self.metrics_error,
        }

    def __repr__(self) -> str:
        return f"Upstream({self.url!r}, revision={self.revision!r}, state={self.state!r})"


class UpstreamPool:
    """The engines behind the gateway, probed and scraped in the background.

    ``await start()`` on the running loop, ``await stop()`` at the end (or ``async
    with``). The hot path reads :meth:`ready_for` and the :class:`Upstream` objects and
    calls :meth:`Upstream.started` / :meth:`Upstream.finished`; none of it awaits.
    """

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.upstreams: list[Upstream] = [
            Upstream(up, config.expected_fingerprint(up)) for up in config.upstreams
        ]
        self._by_url = {u.url: u for u in self.upstreams}
        self._ready_cache: dict[str | None, list[Upstream]] = {}
        self._listeners: list[Callable[[Upstream], None]] = []
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._probe_sessions: dict[str, aiohttp.ClientSession] = {}
        self._metrics_session: aiohttp.ClientSession | None = None
        self._running = False

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start one probe task and one metrics task per upstream on the running loop."""
        if self._running:
            return
        self._running = True
        self._metrics_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=1),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        for u in self.upstreams:
            self._watch(u)

    async def stop(self) -> None:
        """Cancel the background tasks and close their connections."""
        self._running = False
        for url in list(self._tasks):
            await self._unwatch(url)
        if self._metrics_session is not None:
            await self._metrics_session.close()
            self._metrics_session = None

    def _watch(self, u: Upstream) -> None:
        # The reserved lane: one connection of its own per upstream, never shared with
        # the data path, so a saturated relay cannot queue the probe.
        self._probe_sessions[u.url] = probe_session(connections=1)
        self._tasks[u.url] = [
            asyncio.create_task(self._probe_loop(u), name=f"probe {u.url}"),
            asyncio.create_task(self._metrics_loop(u), name=f"metrics {u.url}"),
        ]

    async def _unwatch(self, url: str) -> None:
        tasks = self._tasks.pop(url, [])
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        session = self._probe_sessions.pop(url, None)
        if session is not None:
            await session.close()

    async def reconfigure(self, config: PoolConfig) -> None:
        """Apply a new config without dropping anything that stays.

        An upstream whose URL stays keeps its state, counters and connections; if its
        revision or expected fingerprint changed it warms up again. New URLs start
        warming; removed ones stop being probed and leave :attr:`upstreams` (requests in
        flight on them still finish: the caller holds their :class:`Upstream`). Probe
        and scrape settings apply from each loop's next round.
        """
        now = time.monotonic()
        kept: list[Upstream] = []
        for up in config.upstreams:
            expected = config.expected_fingerprint(up)
            u = self._by_url.get(up.base_url)
            if u is None:
                u = Upstream(up, expected)
                if self._running:
                    self._watch(u)
            else:
                changed = up.revision != u.revision or expected != u.expected_fingerprint
                u.config = up
                u.api_key = up.api_key
                u._served_model = up.served_model or up.model or u._served_model
                if up.kv_blocks is not None:
                    u.kv_blocks_total = up.kv_blocks
                if changed:
                    u.revision = up.revision
                    u.expected_fingerprint = expected
                    u.consecutive_passes = 0
                    u._enter("warming", "warming up: new revision or fingerprint", now)
            kept.append(u)
        urls = {u.url for u in kept}
        for u in self.upstreams:
            if u.url not in urls:
                await self._unwatch(u.url)
        self.config = config
        self.upstreams = kept
        self._by_url = {u.url: u for u in kept}
        self._ready_cache.clear()
        for u in kept:
            self._changed_state(u)

    async def __aenter__(self) -> UpstreamPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----------------------------------------------------------------- hot path

    def ready_for(self, revision: str | None = None) -> list[Upstream]:
        """Routable upstreams serving ``revision`` (None: any revision), in config order."""
        cached = self._ready_cache.get(revision)
        if cached is None:
            cached = [
                u
                for u in self.upstreams
                if u._routable and (revision is None or u.revision == revision)
            ]
            self._ready_cache[revision] = cached
        return list(cached)

    def get(self, url: str) -> Upstream:
        """The upstream at ``url``.

        Raises:
            KeyError: naming the known URLs.
        """
        found = self._by_url.get(url.rstrip("/"))
        if found is None:
            known = ", ".join(self._by_url)
            raise KeyError(f"no upstream {url!r} in the pool; known: {known}")
        return found

    def subscribe(self, listener: Callable[[Upstream], None]) -> None:
        """Call ``listener(upstream)`` after each change of an upstream's state or reason
        (on the event loop; it must not raise or block)."""
        self._listeners.append(listener)

    # ----------------------------------------------------------------- admin

    def drain(self, url: str, deadline_s: float) -> Upstream:
        """Stop admitting to ``url``; its in-flight requests have ``deadline_s`` seconds to
        finish (:meth:`wait_drained`; the gateway cancels what is left)."""
        if not (math.isfinite(deadline_s) and deadline_s >= 0):
            raise ValueError(f"deadline_s must be a number of seconds >= 0 (got {deadline_s})")
        u = self.get(url)
        u.draining = True
        u.drain_deadline_at_s = time.monotonic() + deadline_s
        u.since_s = time.monotonic()
        u.since_unix_s = time.time()
        u._routable = False
        self._changed_state(u)
        return u

    def undrain(self, url: str) -> Upstream:
        """Admit to ``url`` again, after the warm-up probes pass (unless excluded or
        unreachable: then after it recovers)."""
        u = self.get(url)
        if not u.draining:
            return u
        u.draining = False
        u.drain_deadline_at_s = None
        now = time.monotonic()
        if u.health in _ROUTABLE:
            u.consecutive_passes = 0
            u._enter("warming", f"warming up after drain: 0/{self.config.warmup_probes}", now)
        else:
            u._enter(u.health, u.reason, now)
        u.since_s = now
        u.since_unix_s = time.time()
        self._changed_state(u)
        return u

    async def wait_drained(self, url: str, poll_s: float = 0.01) -> bool:
        """Wait until the draining upstream has nothing in flight (True) or its deadline
        passed (False)."""
        u = self.get(url)
        while u.draining and u.inflight_requests > 0:
            deadline = u.drain_deadline_at_s
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    async def wait_ready(
        self, count: int = 1, revision: str | None = None, timeout_s: float = 30.0
    ) -> bool:
        """Wait until ``count`` upstreams serve ``revision``; False at the timeout."""
        end = time.monotonic() + timeout_s
        while len(self.ready_for(revision)) < count:
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(0.01)
        return True

    def state(self) -> dict[str, Any]:
        """The pool as JSON-ready values (``/metrics``, the admin API)."""
        now = time.monotonic()
        ups = [u.snapshot(now) for u in self.upstreams]
        by_state: dict[str, int] = {}
        for u in self.upstreams:
            by_state[u.state] = by_state.get(u.state, 0) + 1
        return {
            "upstreams": ups,
            "ready": sum(1 for u in self.upstreams if u._routable),
            "by_state": by_state,
            "probe_interval_s": self.config.probe_interval_s,
            "probe_deadline_s": self.config.probe_deadline_s,
            "warmup_probes": self.config.warmup_probes,
        }

    def metric_series(self) -> dict[str, Callable[[], list[tuple[tuple[str, ...], float]]]]:
        """Scrape-time readers of the pool's metrics (``GATEWAY_POOL`` in
        :mod:`headway.metrics_catalog`), by name: ``(label values, value)`` per series."""
        states: Sequence[UpstreamStateName] = (
            "warming", "ready", "busy", "excluded", "unreachable", "draining",
        )  # fmt: skip

        def per_upstream(
            read: Callable[[Upstream], float | None],
        ) -> Callable[[], list[tuple[tuple[str, ...], float]]]:
            def series() -> list[tuple[tuple[str, ...], float]]:
                found = [((u.url, u.revision or ""), read(u)) for u in self.upstreams]
                return [(labels, float(v)) for labels, v in found if v is not None]

            return series

        def state() -> list[tuple[tuple[str, ...], float]]:
            return [((u.url, s), float(u.state == s)) for u in self.upstreams for s in states]

        def probes() -> list[tuple[tuple[str, ...], float]]:
            return [
                ((u.url, outcome), float(n))
                for u in self.upstreams
                for outcome, n in u.probe_counts.items()
            ]

        prefix = "headway_gateway_upstream_"
        return {
            f"{prefix}ready": per_upstream(lambda u: float(u._routable)),
            f"{prefix}state": state,
            f"{prefix}probes_total": probes,
            f"{prefix}inflight_requests": per_upstream(lambda u: u.inflight_requests),
            f"{prefix}running_requests": per_upstream(lambda u: u.running_requests),
            f"{prefix}waiting_requests": per_upstream(lambda u: u.waiting_requests),
            f"{prefix}kv_usage_ratio": per_upstream(lambda u: u.kv_usage_fraction),
            f"{prefix}probe_latency_seconds": per_upstream(
                lambda u: None if u.last_probe is None else u.last_probe.latency_s
            ),
        }

    # ----------------------------------------------------------------- background

    def _changed_state(self, u: Upstream) -> None:
        self._ready_cache.clear()
        for listener in self._listeners:
            listener(u)

    async def probe_now(self, url: str) -> ProbeResult:
        """Probe ``url`` once now and apply the verdict (the admin's "check again")."""
        return await self._probe_and_apply(self.get(url))

    async def _probe_and_apply(self, u: Upstream) -> ProbeResult:
        result = await self._probe(u)
        cfg = self.config
        before = u.state
        if u._apply_probe(
            result, time.monotonic(), cfg.warmup_probes, cfg.unreachable_after_probes
        ):
            if u.state != before:
                level = logging.WARNING if u.health in ("excluded", "unreachable") else logging.INFO
                _log.log(level, "upstream %s: %s -> %s (%s)", u.url, before, u.state, u.reason)
            self._changed_state(u)
        return result

    def _headers(self, u: Upstream) -> dict[str, str] | None:
        return None if u.api_key is None else {"Authorization": f"Bearer {u.api_key}"}

    async def _probe(self, u: Upstream) -> ProbeResult:
        session = self._probe_sessions.get(u.url)
        if session is None:
            raise RuntimeError("the pool is not started: await pool.start() first")
        cfg = self.config
        if u._served_model is None:
            found = await self._discover_model(session, u)
            if isinstance(found, ProbeResult):
                return found
            u._served_model = found
        return await run_probe(
            session,
            u.url,
            model=u._served_model,
            prompt=cfg.probe_prompt,
            max_tokens=cfg.probe_max_tokens,
            expected=u.expected_fingerprint,
            deadline_s=cfg.probe_deadline_s,
            headers=self._headers(u),
        )

    async def _discover_model(
        self, session: aiohttp.ClientSession, u: Upstream
    ) -> str | ProbeResult:
        deadline_s = self.config.probe_deadline_s
        try:
            async with (
                asyncio.timeout(deadline_s),
                session.get(f"{u.url}/v1/models", headers=self._headers(u)) as response,
            ):
                body = await response.json(content_type=None)
                status = response.status
        except TimeoutError:
            return ProbeResult("busy", f"timeout after {deadline_s:g} s (GET /v1/models)")
        except (aiohttp.ClientError, OSError) as error:
            return ProbeResult("error", f"connection failed ({type(error).__name__})", str(error))
        except ValueError as error:
            return ProbeResult("wrong", "malformed /v1/models answer", str(error))
        try:
            if status != 200:
                raise ValueError(f"HTTP {status}")
            name = body["data"][0]["id"]
            if not isinstance(name, str):
                raise TypeError("id is not a string")
        except (ValueError, KeyError, IndexError, TypeError) as error:
            return ProbeResult(
                "wrong", "malformed /v1/models answer", f"{type(error).__name__}: {error}"
            )
        return name

    async def _probe_loop(self, u: Upstream) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self._probe_and_apply(u)
            except (aiohttp.ClientError, OSError, ValueError):  # keep probing
                _log.exception("probe of %s failed", u.url)
            next_at += self.config.probe_interval_s
            now = loop.time()
            if next_at < now:  # a late probe: the schedule moves, never bunches
                next_at = now
            await asyncio.sleep(next_at - now)

    async def _metrics_loop(self, u: Upstream) -> None:
        while True:
            cfg = self.config
            session = self._metrics_session
            assert session is not None
            try:
                metrics = await scrape_metrics(
                    session, u.url, deadline_s=cfg.metrics_deadline_s, headers=self._headers(u)
                )
            except TimeoutError:
                u.metrics_error = f"timeout after {cfg.metrics_deadline_s:g} s"
            except (aiohttp.ClientError, OSError, ValueError) as error:
                u.metrics_error = f"{type(error).__name__}: {error}"
            else:
                u._apply_metrics(metrics, time.monotonic())
            await asyncio.sleep(cfg.metrics_interval_s)
