"""The gateway's config file (``gateway.yaml``): upstreams, tenants, models and policies.

Errors name the key path, the bad value and the fix (:class:`~headway.core.errors.ConfigError`).
The policy sections are the simulator's own config types (``admission``, ``queues``,
``retries``), so a policy tuned in ``headway simulate`` is pasted here unchanged.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import msgspec

from headway.core.errors import ConfigError, config_error
from headway.core.policy.admission import AdmissionConfig, TenantLimits
from headway.core.policy.autoscaler import AutoscalerConfig
from headway.core.policy.budgets import share_budgets
from headway.core.policy.deferral import DeferralConfig
from headway.core.policy.degraded import DegradedConfig
from headway.core.policy.fallback import FallbackConfig
from headway.core.policy.queues import BANDS, QueueConfig
from headway.core.policy.releases import ReleaseGuardConfig
from headway.core.policy.retries import RetryConfig
from headway.core.workload.spec import Priority

__all__ = [
    "GatewayFileConfig",
    "ReceiptsConfig",
    "RouteConfig",
    "TenantConfig",
    "UpstreamConfig",
    "load_config",
    "parse_config",
]


class UpstreamConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One OpenAI-compatible engine behind the gateway."""

    url: str
    """Its base URL, without ``/v1`` (e.g. ``http://10.0.0.5:8000``)."""

    revision: str | None = None
    """The model revision it serves (requests pinned to a revision reach only matching
    upstreams)."""

    slots: int | None = None
    """Requests the gateway keeps dispatched to it at once (None: ``slots_per_upstream``)."""

    api_key: str | None = None
    """Bearer token the gateway sends to it (clients' keys are never forwarded)."""

    fingerprint: str | None = None
    """With ``pool``: the expected probe answer (text or ``sha256:HEX``)."""

    model: str | None = None
    """With ``pool``: the catalog model a ``headway emulate`` upstream emulates (its
    fingerprint is then computed for ``revision``)."""

    served_model: str | None = None
    """With ``pool``: the ``model`` name the probe sends."""

    route: str | None = None
    """With ``routes``: the route (the ``model`` clients send) it serves; None: every
    route."""

    kv_blocks: int | None = None
    """Its KV blocks (vLLM's ``num_gpu_blocks``; default ``kv_blocks_per_upstream``, or
    what the pool scrapes from its ``/metrics``)."""

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(
                f"upstreams[].url must start with http:// or https:// (got {self.url!r}); "
                "write the engine's base URL, e.g. http://127.0.0.1:8000"
            )
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"upstreams[].slots must be >= 1 (got {self.slots}); or omit it")


class RouteConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One model route (a :class:`~headway.core.policy.fallback.RouteView`): what may stand
    in for it when none of its upstreams can take a call."""

    fallback: str | None = None
    """The route that may substitute (None: none; calls fail truthfully)."""

    data_policy: str = "default"
    """How the route handles data; a fallback must have the same (seed 000)."""

    quality_class: str = "default"
    """The quality class the route was evaluated in; a fallback must have the same."""

    slot_share: float | None = None
    """A strict share, in (0, 1], of the dispatch slots of the upstreams serving this
    route (those without a ``route`` serve every route, so routes can share them): its
    dispatched calls never exceed it, and with the shares of the routes on those
    upstreams adding up to at most 1 it is also a guarantee (seed 000: background work
    "in a separate or strictly controlled share"). None: no cap."""

    def __post_init__(self) -> None:
        share = self.slot_share
        if share is not None and not (math.isfinite(share) and 0.0 < share <= 1.0):
            raise ValueError(
                f"`slot_share` must be in (0, 1] (got {share}); a strict share is a "
                "fraction of the route's upstreams' slots, or null for none"
            )


class ReceiptsConfig(DeferralConfig, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Asynchronous receipts (the core's :class:`~headway.core.policy.deferral.DeferralConfig`:
    ``deferrable``, ``max_queued``, ``retention_s``; and where and how they run): a
    non-streaming request of a ``deferrable`` band that would be shed for a reason a wait
    can fix is answered ``202`` with a receipt, stored durably, run later in the
    ``background`` band, and its result fetched with ``GET /v1/receipts/{id}``."""

    path: str = "headway-receipts.sqlite3"
    """The SQLite file of the receipts (created ``0600``; it holds prompts until they
    run). With ``--redis URL`` they are kept in that Redis instead."""

    lease_s: float = 30.0
    """A running receipt's claim lasts this long and is renewed every third of it; a
    claim its instance stopped renewing (killed) is taken over once it lapses."""

    max_running: int = 8
    """Receipts this instance runs at once (each one request offered in ``background``;
    the band's ``background_max_share`` still caps their slots)."""

    poll_s: float = 1.0
    """How often the runner looks for work it was not told of (another instance's
    receipts, lapsed claims, expiry)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("lease_s", "poll_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"receipts.{name} must be seconds > 0 (got {value})")
        if self.max_running < 1:
            raise ValueError(f"receipts.max_running must be >= 1 (got {self.max_running}); use 8")
        if not self.path.strip():
            raise ValueError("receipts.path must name a file, e.g. headway-receipts.sqlite3")


class TenantConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One tenant, found by its API key."""

    name: str
    """The tenant's name (metrics, budgets, fair queuing)."""

    weight: float = 1.0
    """Fair-queuing weight within a band: weight 2 is owed twice the token service."""

    share: float = 0.0
    """Share of ``capacity_tokens_per_s`` the tenant's token budget gets (0: none)."""

    max_priority: Priority = "interactive"
    """The highest band its requests may ask for with ``x-headway-priority``; higher
    asks are lowered to it."""

    default_priority: Priority = "interactive"
    """Band of its requests without ``x-headway-priority`` (capped by ``max_priority``)."""

    token_rate_per_s: float | None = None
    """An explicit token budget (prompt + planned output per second); overrides ``share``."""

    burst_s: float = 10.0
    """Seconds of ``token_rate_per_s`` the bucket holds."""

    max_concurrency: int | None = None
    """Requests in flight (queued or running) at once; None: no limit."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"tenants.<key>.weight must be > 0 (got {self.weight}); use 1")
        if not (math.isfinite(self.share) and self.share >= 0):
            raise ValueError(f"tenants.<key>.share must be >= 0 (got {self.share}); use 0")


class GatewayFileConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole ``gateway.yaml``."""

    upstreams: list[UpstreamConfig]
    """The engines; at least one."""

    tenants: dict[str, TenantConfig] = msgspec.field(default_factory=dict)
    """Tenants by API key (the ``Authorization: Bearer KEY`` clients send). Empty: the
    gateway is open and every request is tenant ``anonymous``."""

    models: list[str] = msgspec.field(default_factory=list)
    """Model names clients may send in ``model`` (404 for others). Empty: any; ``/v1/models``
    is then relayed from an upstream."""

    routes: dict[str, RouteConfig] = msgspec.field(default_factory=dict)
    """Model routes by the ``model`` name clients send, with their fallbacks. Empty: one
    route; every upstream serves every call. With routes, an upstream's ``route`` says
    which calls it takes, and a call whose route has no routable upstream goes to its
    fallback when the core fallback policy allows it (same data policy and quality
    class, healthy), with its ``model`` rewritten and ``x-headway-route`` set."""

    fallback: FallbackConfig = FallbackConfig()
    """The fallback policy (the core's :class:`~headway.core.policy.fallback.FallbackConfig`:
    ``enabled``, ``max_hops``, ``min_health``)."""

    release_guard: ReleaseGuardConfig = ReleaseGuardConfig()
    """Route back to the last good release (the core's
    :class:`~headway.core.policy.releases.ReleaseGuardConfig`): when the upstreams of one
    ``revision`` answer with errors or latency that spike against another revision's,
    unpinned calls avoid them for ``hold_s`` (an event in the log, a metric)."""

    degraded: DegradedConfig = DegradedConfig()
    """Degraded modes by band (the core's :class:`~headway.core.policy.degraded.DegradedConfig`:
    ``modes.<name>`` with ``bands``, ``max_tokens``, ``context_tokens``, ``trim``,
    ``shed_optional``, ``enter``/``leave`` thresholds and ``min_on_s``): while a mode is on,
    its bands' requests are served shorter (``x-headway-degraded`` says how) or, marked
    ``x-headway-optional: true``, shed. Entered and left on the thresholds or by
    ``POST /admin/degraded/{mode}``; a reload keeps each mode's state. Empty: none."""

    receipts: ReceiptsConfig | None = None
    """Asynchronous receipts for deferrable bands (:class:`ReceiptsConfig`; None: every
    shed is answered 429/503)."""

    preset: Literal["headway-default"] = "headway-default"
    """The policy preset; ``admission``/``queues``/``retries`` override its settings."""

    admission: AdmissionConfig | None = None
    """Admission settings (the simulator's ``gateway.admission``); tenant budgets from
    ``tenants`` are added to its ``tenants``."""

    queues: QueueConfig | None = None
    """Queue settings (the simulator's ``gateway.queues``); weights from ``tenants``."""

    retries: RetryConfig = RetryConfig(max_attempts=2, backoff_base_s=0.0, backoff_max_s=1.0)
    """Retries to another upstream, only before the first byte and within the budget."""

    slots_per_upstream: int = 64
    """Requests dispatched to one upstream at once (the engine's ``max_num_seqs`` or the
    SLO's batch; a request beyond it would only wait inside the engine)."""

    kv_blocks_per_upstream: int = 1_000_000
    """KV blocks of one upstream for the KV projection (vLLM's ``num_gpu_blocks``); the
    default never binds."""

    p95_output_tokens: int = 512
    """Planned output of a request that sends no ``max_tokens``."""

    prompt_bytes_per_token: float = 4.0
    """Prompt tokens are estimated as request body bytes / this (about 1 µs; no tokenizer on
    the hot path). The body's JSON keys make it an over-estimate of a few tokens."""

    tpot_s: float | None = None
    """Time per output token of an upstream at its slot count (e.g. from ``headway
    calibrate``): the prior of the service estimate that refuses at arrival what cannot
    meet its deadline and computes Retry-After. None: from ``profile``, else from the
    engine model (``engine_model`` on ``engine_gpu``)."""

    prefill_tokens_per_s: float | None = None
    """Prompt tokens per second of one request's prefill, with ``tpot_s`` (None with
    ``tpot_s``: prefill counts as free, so the estimate is a lower bound)."""

    profile: str | None = None
    """A step-time profile written by ``headway calibrate --out`` (a path): without
    ``tpot_s``, the speeds it gives a full batch of ``slots_per_upstream`` are the prior."""

    engine_model: str = "llama-3-8b"
    """Catalog model of the engine-model prior (without ``tpot_s`` and ``profile``): the
    roofline's speeds for it at ``slots_per_upstream``. A fast-GPU prior errs fast, so it
    refuses at arrival only what even that engine could not serve in time; measurement
    corrects it within a few dozen answers."""

    engine_gpu: str = "h100"
    """Catalog GPU of the engine-model prior."""

    measure_speeds: bool = True
    """Refine the prior from the answers, streamed (time to first token, then per token)
    and not (their duration against the prediction for their tokens). False: the prior
    alone."""

    capacity_tokens_per_s: float | None = None
    """Planned capacity that tenants' ``share`` divides into token budgets (None: shares
    give no budgets)."""

    default_deadline_s: float | None = None
    """Deadline of a request without ``x-headway-deadline-ms`` (None: none)."""

    max_deadline_s: float | None = 600.0
    """Largest deadline a request may ask for (larger asks are clamped)."""

    pool: dict[str, Any] | None = None
    """Readiness probes of the upstreams (the settings of
    :class:`headway.gateway.pool.PoolConfig` but ``upstreams``: ``probe_interval_s``,
    ``warmup_probes``, ``fingerprints``, ...). An upstream then takes traffic only after
    its fingerprint probes pass. None: no probes; every upstream is routable."""

    shared: dict[str, Any] | None = None
    """With ``--redis URL``: how tenant budgets are shared across instances (the settings
    of :class:`headway.gateway.shared.SharedBudgetsConfig` but ``redis_url``: leases,
    ``fail_mode``, ...). None: their defaults."""

    admin_token: str | None = None
    """Bearer token of ``/admin/...`` (None: the admin API answers 403)."""

    eject_s: float = 5.0
    """After a connection failure, an upstream is not routed to for this long (passive
    health; the upstream pool's probes do better); each failure in a row doubles it, to
    at most 16×, until the upstream answers a call or its probes pass again."""

    connect_timeout_s: float = 5.0
    """Connecting to an upstream; past it the attempt fails (and may be retried)."""

    tenant_slot_headroom: float | None = 1.0
    """Per-tenant dispatch-slot share: while other tenants are active, a tenant holds at
    most ``ceil(its share / the active tenants' shares × ready slots × this)`` dispatched
    requests (its share: ``share`` when > 0, else ``weight``), so a light tenant always
    finds a slot beside a flood. Alone, a tenant may take every slot (work-conserving).
    Above 1 lends idle slots to the busy tenant at the cost of the light one's wait.
    None: no per-tenant cap."""

    tenant_active_s: float = 2.0
    """A tenant counts as active (holds its slot share against the others) while it has
    requests queued or in flight, and this long after its last request arrived."""

    shutdown_timeout_s: float = 30.0
    """On SIGTERM the gateway drains: ``/health`` answers 503 at once, new requests are
    refused (503 ``draining``, ``Retry-After: 0``: retry on a peer), and queued and
    in-flight requests finish for up to this long before the process exits (Kubernetes'
    ``terminationGracePeriodSeconds`` must exceed it plus any ``preStop`` sleep)."""

    header_timeout_s: float = 10.0
    """A client's request headers must arrive within this (from the connection's start, or
    from the first byte of a later request on it); past it the gateway answers 408 and
    closes the connection (slowloris)."""

    body_timeout_s: float = 30.0
    """A request's body must arrive within this after its headers (408 past it)."""

    idle_timeout_s: float = 75.0
    """An idle keep-alive client connection closes after this."""

    max_connections: int = 1000
    """Open client connections at once; one more is answered 503 and closed (keep it below
    the process's open-file limit, less the upstream connections)."""

    access_log: str | None = None
    """One JSON line per finished request on the ``headway.gateway.access`` logger, written
    by the gateway to this file (``-``: stderr) from a background thread. None: the gateway
    adds no handler (the logger still emits to whatever the host configured)."""

    log_content: bool = False
    """Put the request body and the answer's text into access-log lines and spans. Off:
    neither ever carries prompt or completion text."""

    metrics_token: str | None = None
    """``GET /metrics`` takes ``Authorization: Bearer <metrics_token>`` (or the
    ``admin_token``); 401 otherwise. Its labels name every tenant and its counts, so it is
    private by default: with neither token (and ``metrics_public`` false) it answers 403.
    A request carrying a tenant's API key is refused (403) in every case."""

    metrics_public: bool = False
    """True: ``GET /metrics`` is open to anyone who can reach the port, as vLLM's is (then
    keep the port inside the cluster network: every tenant's name and counts are in it)."""

    tenant_cache_salt: bool = True
    """With tenants: put ``"cache_salt": HMAC(tenant)`` into every relayed body, so engines
    that salt their prefix-cache block hashes (vLLM) never share cached prompt blocks
    between tenants (no cross-tenant timing probe of cached prompts). A client-sent
    ``cache_salt`` is then refused (400): it could name another tenant's salt."""

    cache_salt_key: str | None = None
    """The HMAC key of the tenants' cache salts. None: a random key per process (salts, and
    so cache hits across a restart or between instances, change); set it to keep them."""

    autoscaler: AutoscalerConfig | None = None
    """Recommend a replica count per pool (a route's upstreams, or ``default``): the core
    autoscaler (``kind: predictive`` combines the signals and forecasts offered load) on
    the gateway's counters, exported as ``headway_gateway_desired_replicas{pool}`` for KEDA
    or an HPA to act on (the gateway starts nothing). None: off."""

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("upstreams must list at least one engine, e.g. - url: http://...")
        for name, value in (
            ("slots_per_upstream", self.slots_per_upstream),
            ("kv_blocks_per_upstream", self.kv_blocks_per_upstream),
            ("p95_output_tokens", self.p95_output_tokens),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1 (got {value})")
        if not (math.isfinite(self.prompt_bytes_per_token) and self.prompt_bytes_per_token > 0):
            raise ValueError(
                f"prompt_bytes_per_token must be > 0 (got {self.prompt_bytes_per_token}); use 4"
            )
        for name, speed in (("tpot_s", self.tpot_s),
                            ("prefill_tokens_per_s", self.prefill_tokens_per_s)):  # fmt: skip
            if speed is not None and not (math.isfinite(speed) and speed > 0):
                raise ValueError(f"{name} must be > 0 (got {speed}); or null for unknown")
        headroom = self.tenant_slot_headroom
        if headroom is not None and not (math.isfinite(headroom) and headroom > 0):
            raise ValueError(
                f"tenant_slot_headroom must be > 0 (got {headroom}); use 1, or null for no cap"
            )
        if not (math.isfinite(self.shutdown_timeout_s) and self.shutdown_timeout_s >= 0):
            raise ValueError(
                f"shutdown_timeout_s must be >= 0 (got {self.shutdown_timeout_s}); use 30"
            )
        if not (math.isfinite(self.tenant_active_s) and self.tenant_active_s >= 0):
            raise ValueError(f"tenant_active_s must be >= 0 (got {self.tenant_active_s}); use 2")
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a number of seconds > 0 (got {value})")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1 (got {self.max_connections}); use 1000")
        if any(not key.strip() or key != key.strip() for key in self.tenants):
            raise ValueError(
                "tenants: every API key must be non-empty, without surrounding spaces "
                "(a request without a key would be that tenant)"
            )
        for name, token in (("admin_token", self.admin_token),
                            ("metrics_token", self.metrics_token)):  # fmt: skip
            if token is not None and token in self.tenants:
                raise ValueError(
                    f"{name} must differ from every tenant API key; a tenant could use it"
                )
        for name, route in self.routes.items():
            if route.fallback is not None and route.fallback not in self.routes:
                raise ValueError(
                    f"routes.{name}.fallback names {route.fallback!r}, which is not a route; "
                    f"use one of {sorted(self.routes)} or null"
                )
        for up in self.upstreams:
            if up.route is not None and up.route not in self.routes:
                raise ValueError(
                    f"upstreams[].route {up.route!r} (of {up.url}) is not in routes; "
                    f"add it to routes or use one of {sorted(self.routes) or 'no route'}"
                )
        reserved = self.queue_config().critical_reserved_slots
        for up in self.upstreams:
            if reserved is not None and (
                (up.slots or self.slots_per_upstream) * len(self.upstreams) <= reserved
            ):
                raise ValueError(
                    f"slots ({up.slots or self.slots_per_upstream} per upstream) must exceed "
                    f"queues.critical_reserved_slots ({reserved}); raise the slots or lower "
                    "the reserve"
                )

    def tenant_by_name(self) -> dict[str, TenantConfig]:
        """Tenants by name."""
        return {t.name: t for t in self.tenants.values()}

    def queue_config(self) -> QueueConfig:
        """``queues`` with the tenants' weights."""
        base = self.queues or QueueConfig()
        weights = {t.name: t.weight for t in self.tenants.values()}
        return msgspec.structs.replace(base, tenant_weights={**weights, **base.tenant_weights})

    def admission_config(self) -> AdmissionConfig:
        """``admission`` with the tenants' budgets (explicit rates, then shares)."""
        base = self.admission or AdmissionConfig()
        limits: dict[str, TenantLimits] = {}
        if self.capacity_tokens_per_s is not None:
            shares = {t.name: t.share for t in self.tenants.values()}
            limits.update(share_budgets(shares, self.capacity_tokens_per_s))
        for t in self.tenants.values():
            if t.token_rate_per_s is not None or t.max_concurrency is not None:
                old = limits.get(t.name)
                limits[t.name] = TenantLimits(
                    token_rate_per_s=t.token_rate_per_s
                    if t.token_rate_per_s is not None
                    else (old.token_rate_per_s if old else None),
                    burst_s=t.burst_s,
                    max_concurrency=t.max_concurrency,
                )
        return msgspec.structs.replace(base, tenants={**limits, **base.tenants})


def parse_config(data: object, source: str = "gateway config") -> GatewayFileConfig:
    """Decode a parsed YAML/JSON document; a ConfigError names the key path and fix."""
    if data is None:
        raise ConfigError(
            f"{source}: $: the file is empty; a gateway config needs at least `upstreams: "
            "[{url: http://HOST:PORT}]` (see docs/gateway.md)",
            path="$",
        )
    try:
        config = msgspec.convert(data, GatewayFileConfig, strict=False)
    except msgspec.ValidationError as error:
        raise config_error(
            error, source, root=GatewayFileConfig, data=data, docs="docs/gateway.md"
        ) from None
    for key, tenant in config.tenants.items():
        if tenant.max_priority not in BANDS:  # pragma: no cover - the Literal checks it
            raise ConfigError(f"{source}: tenants.{key}.max_priority {tenant.max_priority!r}")
    return config


def load_config(path: Path) -> GatewayFileConfig:
    """Read and check ``gateway.yaml`` (the workload files' hardened YAML reader: syntax
    errors name the line; alias bombs and invalid UTF-8 are refused)."""
    from headway.files.workload import read_yaml

    return parse_config(read_yaml(path), str(path))
