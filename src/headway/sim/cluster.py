"""The cluster file: replicas, their model and GPU, engine settings and the router.

```yaml
replicas: 4
model: llama-3-8b          # a catalog name, or one defined under `catalog.models`
gpu: h100
tensor_parallel: 1
engine: {max_num_seqs: 256, max_num_batched_tokens: 8192}
router: least_outstanding_requests
gateway: {preset: headway-default}   # default fifo-unbounded: no gateway
```

:func:`build_replica` turns the spec into a :class:`ReplicaModel` with a roofline step-time
model (or a measured profile) and a KV pool sized from GPU memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from headway.calibrate.profile import Profile, read_profile
from headway.core.engine.capacity import kv_capacity_tokens
from headway.core.engine.catalog import GpuSpec, ModelSpec, get_gpu, get_model
from headway.core.engine.efficiency import EfficiencyTable
from headway.core.engine.replica import ReplicaModel
from headway.core.engine.roofline import (
    DEFAULT_CUDA_GRAPH_MAX_TOKENS,
    CudaGraphMode,
    RooflineStepTime,
)
from headway.core.engine.scheduler import SchedulerConfig
from headway.core.engine.steptime import AffineStepTime, StepTimeModel
from headway.core.errors import ConfigError, config_error
from headway.core.policy.autoscaler import AutoscalerConfig
from headway.core.policy.fallback import FallbackConfig
from headway.core.policy.routing import RouterKind
from headway.sim.faults import Fault
from headway.sim.gateway import GatewayConfig


class Disaggregation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Prefill/decode disaggregation: separate pools, KV moved between them.

    The first ``prefill_replicas`` replicas only prefill (each call there emits its first
    token), the others only decode; a call's prompt KV moves between them in
    ``interconnect latency + prompt tokens × KV bytes per token per GPU / bandwidth``
    (``docs/simulate.md``).
    """

    prefill_replicas: int
    """Replicas that only prefill (the first ones; the rest of ``replicas`` only decode)."""

    kv_transfer_bandwidth_bytes_per_s: float | None = None
    """Per-GPU, one-direction bandwidth of the KV transfer (every GPU of a replica sends
    its shard of the KV at once). Default: half the GPU's interconnect bandwidth, which
    the catalog gives bidirectional, as marketed."""

    def __post_init__(self) -> None:
        if self.prefill_replicas < 1:
            raise ValueError(
                f"`disaggregation.prefill_replicas` must be >= 1 (got {self.prefill_replicas}); "
                "give at least one prefill replica, or remove `disaggregation`"
            )
        bandwidth = self.kv_transfer_bandwidth_bytes_per_s
        if bandwidth is not None and not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ValueError(
                f"`disaggregation.kv_transfer_bandwidth_bytes_per_s` must be > 0 (got "
                f"{bandwidth}); give bytes per second, e.g. 450e9 for NVLink 4, or omit it"
            )


class GpuPower(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One GPU's power draw, measured (``nvidia-smi``), to replace the catalog's."""

    idle_w: float
    """Watts drawn idle, the engine loaded."""
    max_w: float
    """Watts drawn stepping at full load."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.idle_w) and 0 <= self.idle_w <= self.max_w):
            raise ValueError(
                f"`gpu_power_w.idle_w` must be >= 0 and <= `max_w` (got {self.idle_w} and "
                f"{self.max_w})"
            )
        if not (math.isfinite(self.max_w) and self.max_w > 0):
            raise ValueError(f"`gpu_power_w.max_w` must be > 0 watts (got {self.max_w})")


class Pool(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Replicas that serve some of the workload's routes only, with their own model, GPU
    and engine settings where given (the cluster's otherwise). Seed 000: separate queues
    and worker pools for unlike work, so a bulk route cannot take an interactive one's
    replicas."""

    routes: list[str]
    """The workload routes whose calls go to this pool (and only here)."""

    replicas: int
    """Its replicas (the pools' replicas add up to the cluster's ``replicas``)."""

    model: str | None = None
    gpu: str | None = None
    tensor_parallel: int | None = None
    num_kv_blocks: int | None = None
    engine: SchedulerConfig | None = None
    shares: dict[str, float] = msgspec.field(default_factory=dict)
    """A pool shared by routes: each named route's strict share of the pool's dispatch
    slots (seed 000: background work "in a separate or strictly controlled share"). The
    gateway (``headway-default``) holds a route's dispatched calls within it, and with
    shares adding up to at most 1 each is also a guarantee: a flood of one route cannot
    take the slots of another. Routes not named share the pool's slots freely."""


MAX_REPLICAS: Final = 10_000
"""The most replicas one simulated cluster may hold (100,000 took 7.8 GB before they ran)."""


class ClusterSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A pool of identical replicas behind one router."""

    replicas: int = 1
    """How many replicas."""

    model: str = "llama-3-8b"
    """The model (a catalog name or one defined in ``catalog``)."""

    gpu: str = "h100"
    """The GPU (a catalog name or one defined in ``catalog``)."""

    tensor_parallel: int = 1
    """GPUs per replica."""

    cuda_graphs: CudaGraphMode = "full"
    """How the engine launches a step's kernels, for the roofline: ``full`` (vLLM V1's
    default: one graph for a decode-only batch, piecewise graphs for a mixed one),
    ``piecewise``, or ``eager`` (``--enforce-eager``; engines without CUDA graphs, such as
    vLLM before 0.2.6). Eager launches set a floor under small batches' steps
    (docs/engine-model.md)."""

    cuda_graph_max_tokens: int = DEFAULT_CUDA_GRAPH_MAX_TOKENS
    """The largest batch, in tokens, the engine has graphs for; larger ones run eager
    (vLLM's ``max_cudagraph_capture_size``)."""

    engine: SchedulerConfig = SchedulerConfig()
    """Scheduler and KV-cache settings (vLLM's names)."""

    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory the engine may use (vLLM's default 0.9)."""

    num_kv_blocks: int | None = None
    """Override the KV pool size in blocks (default: from memory)."""

    router: RouterKind = "least_outstanding_requests"
    """How the cluster's router picks a replica."""

    step_time: Literal["roofline", "profile"] = "roofline"
    """Predict step times from the roofline, or from a measured ``profile``."""

    profile: AffineStepTime | None = None
    """A measured step-time profile: inline coefficients, or in the file the path to a
    profile that ``headway calibrate`` wrote (relative to the cluster file; it implies
    ``step_time: profile``)."""

    profile_of: str = ""
    """What the profile measured, in words (a ``headway calibrate`` profile's model,
    engine and hardware; filled in from the profile file): the plan names the replicas
    by it, not by ``model`` and ``gpu``, whose roofline a profile replaces."""

    disaggregation: Disaggregation | None = None
    """Separate prefill and decode pools (None: every replica does both). Not simulated
    together with ``gateway: headway-default``, ``faults`` or ``autoscaler`` yet."""

    gateway: GatewayConfig = GatewayConfig()
    """What stands between the task calls and the router: ``fifo-unbounded`` (nothing;
    engines queue everything) or ``headway-default`` (admission, queues, shedding)."""

    faults: list[Fault] = msgspec.field(default_factory=list)
    """Faults injected during the run (:mod:`headway.sim.faults`): replicas lost, caches
    flushed, steps slowed down."""

    autoscaler: AutoscalerConfig | None = None
    """Add and remove replicas during the run (the core autoscaler); ``replicas`` is the
    starting count. None: a fixed pool."""

    price_per_replica_hour: float | None = None
    """What one replica costs per hour, for the cost per successful task (None: the
    workload's ``routes.<first>.replica.price_per_hour``, if any)."""

    gpu_power_w: GpuPower | None = None
    """Each GPU's power draw (idle and at full load) for the energy figures (None: the GPU
    catalog's: its maximum board power, and an idle draw assumed from it)."""

    pools: dict[str, Pool] = msgspec.field(default_factory=dict)
    """Separate pools of replicas per route (empty: one pool serves every route; a
    workload with two or more routes needs pools, not a silent merge). Each pool has its
    own router over its replicas; the first pool's replicas come first."""

    fallback: FallbackConfig = FallbackConfig()
    """With ``pools``: when a route's pool has no routable replica, the core fallback
    policy (the gateway file's ``fallback``, the same settings) may send its calls to the
    pool of the route's declared ``fallback`` (same ``data_policy`` and
    ``quality_class``, health at least ``min_health``)."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"`replicas` must be >= 1 (got {self.replicas})")
        if self.replicas > MAX_REPLICAS:
            raise ValueError(
                f"`replicas` must be <= {MAX_REPLICAS:,} (got {self.replicas:,}): each "
                "simulated replica holds its own engine state (about 80 KB), so a larger pool "
                "exhausts memory; simulate one shard of the fleet and scale its load"
            )
        if self.tensor_parallel < 1:
            raise ValueError(f"`tensor_parallel` must be >= 1 (got {self.tensor_parallel})")
        if self.cuda_graph_max_tokens < 0:
            raise ValueError(
                f"`cuda_graph_max_tokens` must be >= 0 (got {self.cuda_graph_max_tokens}); "
                f"vLLM captures up to {DEFAULT_CUDA_GRAPH_MAX_TOKENS}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"`gpu_memory_utilization` must be in (0, 1] (got {self.gpu_memory_utilization})"
            )
        price = self.price_per_replica_hour
        if price is not None and not (math.isfinite(price) and price >= 0):
            raise ValueError(f"`price_per_replica_hour` must be >= 0 (got {price})")
        if self.step_time == "profile" and self.profile is None:
            raise ValueError("`step_time: profile` needs a `profile`")
        if self.disaggregation is not None:
            self._check_disaggregation(self.disaggregation)
        if self.pools:
            self._check_pools()

    def _in_use(self, *features: str) -> list[str]:
        """Of ``features`` (``gateway``, ``faults``, ``autoscaler``, ``disaggregation``),
        those this cluster uses, named as the file writes them."""
        used = {
            "gateway": (
                "`gateway: {preset: headway-default}`",
                self.gateway.preset != "fifo-unbounded",
            ),
            "faults": ("`faults`", bool(self.faults)),
            "autoscaler": ("`autoscaler`", self.autoscaler is not None),
            "disaggregation": ("`disaggregation`", self.disaggregation is not None),
        }
        return [used[f][0] for f in features if used[f][1]]

    def _check_pools(self) -> None:
        total = 0
        seen: dict[str, str] = {}
        for name, pool in self.pools.items():
            if pool.replicas < 1:
                raise ValueError(f"`pools.{name}.replicas` must be >= 1 (got {pool.replicas})")
            if not pool.routes:
                raise ValueError(
                    f"`pools.{name}.routes` is empty: name the workload routes it serves"
                )
            for route in pool.routes:
                if route in seen:
                    raise ValueError(
                        f"route {route!r} is in `pools.{seen[route]}` and `pools.{name}`: "
                        "a route's calls go to one pool; keep it in one"
                    )
                seen[route] = name
            for route, share in pool.shares.items():
                if route not in pool.routes:
                    raise ValueError(
                        f"`pools.{name}.shares` names {route!r}, which is not in its "
                        f"routes {pool.routes}: give a share to a route of the pool"
                    )
                if not (math.isfinite(share) and 0.0 < share <= 1.0):
                    raise ValueError(
                        f"`pools.{name}.shares.{route}` must be in (0, 1] (got {share}); "
                        "a strict share is a fraction of the pool's slots"
                    )
            if sum(pool.shares.values()) > 1.0 + 1e-9:
                raise ValueError(
                    f"`pools.{name}.shares` add up to {sum(pool.shares.values()):g}: strict "
                    "shares of one pool must add up to at most 1"
                )
            if pool.shares and self.gateway.preset != "headway-default":
                raise ValueError(
                    f"`pools.{name}.shares` needs the gateway that holds them: add "
                    "`gateway: {preset: headway-default}` (without it every call goes "
                    "to the engines at once)"
                )
            total += pool.replicas
        if total != self.replicas:
            raise ValueError(
                f"the pools hold {total} replicas but `replicas` is {self.replicas}: set "
                f"`replicas: {total}` (the pools' sum)"
            )
        sizes = {(pool.engine or self.engine).block_size for pool in self.pools.values()}
        if len(sizes) > 1:
            raise ValueError(
                f"the pools' engines use block sizes {sorted(sizes)}: give them one "
                "`engine.block_size`"
            )
        unsupported = self._in_use("autoscaler", "disaggregation")
        if unsupported:
            raise ValueError(
                f"`pools` are not simulated together with {', '.join(unsupported)} yet; "
                "remove those or remove `pools`"
            )

    def _check_disaggregation(self, disagg: Disaggregation) -> None:
        if disagg.prefill_replicas >= self.replicas:
            raise ValueError(
                f"`disaggregation.prefill_replicas` must be < `replicas` ({self.replicas}) "
                f"(got {disagg.prefill_replicas}); at least one replica must decode: lower it "
                "or raise `replicas`"
            )
        unsupported = self._in_use("gateway", "faults", "autoscaler")
        if unsupported:
            raise ValueError(
                f"`disaggregation` is not simulated together with {', '.join(unsupported)} "
                "yet; remove those (gateway: {preset: fifo-unbounded}, no faults, no "
                "autoscaler) or remove `disaggregation`"
            )


def pool_cluster(spec: ClusterSpec, name: str) -> ClusterSpec:
    """The cluster of one pool: its replicas, and its model, GPU and engine where it
    names them (the cluster's otherwise)."""
    pool = spec.pools[name]
    return msgspec.structs.replace(
        spec,
        replicas=pool.replicas,
        model=pool.model or spec.model,
        gpu=pool.gpu or spec.gpu,
        tensor_parallel=pool.tensor_parallel or spec.tensor_parallel,
        num_kv_blocks=spec.num_kv_blocks if pool.num_kv_blocks is None else pool.num_kv_blocks,
        engine=pool.engine or spec.engine,
        pools={},
    )


def check_routes(spec: ClusterSpec, routes: Sequence[str]) -> None:
    """The workload's ``routes`` fit the cluster: one route on a single pool, or every
    route in exactly one pool. Raises :class:`ConfigError` naming the routes otherwise."""
    if not spec.pools:
        if len(routes) > 1:
            names = ", ".join(routes)
            raise ConfigError(
                f"the workload has {len(routes)} routes ({names}) but the cluster is one pool "
                "of replicas, which would merge them silently; give the cluster `pools:`, one "
                f"per route (e.g. pools: {{{routes[0]}: {{routes: [{routes[0]}], replicas: 1}}, "
                "...}), see docs/simulate.md",
                path="$.pools",
            )
        return
    try:  # the cluster may have been changed with structs.replace, which checks nothing
        spec._check_pools()
    except ValueError as error:
        raise ConfigError(str(error), path="$.pools") from None
    served = {route for pool in spec.pools.values() for route in pool.routes}
    unknown = sorted(served - set(routes))
    if unknown:
        raise ConfigError(
            f"`pools` name routes the workload does not have: {', '.join(unknown)} (its "
            f"routes: {', '.join(routes) or 'none'}); fix the names",
            path="$.pools",
        )
    missing = [route for route in routes if route not in served]
    if missing:
        raise ConfigError(
            f"no pool serves the workload's routes {', '.join(missing)}: add them to a "
            "pool's `routes`",
            path="$.pools",
        )


def pool_replicas(spec: ClusterSpec) -> dict[str, int]:
    """Each pool's replicas: the cluster's ``pools``, or a disaggregated cluster's
    ``prefill`` and ``decode`` (empty: one pool)."""
    if spec.pools:
        return {name: pool.replicas for name, pool in spec.pools.items()}
    if spec.disaggregation is not None:
        prefill = spec.disaggregation.prefill_replicas
        return {"prefill": prefill, "decode": spec.replicas - prefill}
    return {}


def with_pool_replicas(spec: ClusterSpec, counts: Sequence[int]) -> ClusterSpec:
    """``spec`` with each pool's replicas set, in :func:`pool_replicas`'s order (the
    pools' order; ``prefill`` then ``decode``); ``replicas`` their sum."""
    names = list(pool_replicas(spec))
    if len(counts) != len(names) or min(counts, default=0) < 1:
        raise ValueError(f"one count >= 1 per pool ({', '.join(names)}), got {list(counts)}")
    if spec.pools:
        pools = {
            name: msgspec.structs.replace(pool, replicas=n)
            for (name, pool), n in zip(spec.pools.items(), counts, strict=True)
        }
        return msgspec.structs.replace(spec, replicas=sum(counts), pools=pools)
    assert spec.disaggregation is not None
    prefill, decode = counts
    disagg = msgspec.structs.replace(spec.disaggregation, prefill_replicas=prefill)
    return msgspec.structs.replace(spec, replicas=prefill + decode, disaggregation=disagg)


def with_replicas(spec: ClusterSpec, replicas: int) -> ClusterSpec:
    """``spec`` with ``replicas`` in all; its pools keep their shares of them (largest
    remainder, at least one each)."""
    if not spec.pools:
        return msgspec.structs.replace(spec, replicas=replicas)
    names = list(spec.pools)
    replicas = max(replicas, len(names))
    whole = sum(p.replicas for p in spec.pools.values())
    exact = [spec.pools[n].replicas * replicas / whole for n in names]
    counts = [max(1, math.floor(x)) for x in exact]
    order = sorted(range(len(names)), key=lambda i: counts[i] - exact[i])
    i = 0
    while sum(counts) < replicas:
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts) > replicas:
        k = max((j for j in range(len(counts)) if counts[j] > 1), key=lambda j: counts[j])
        counts[k] -= 1
    pools = {
        n: msgspec.structs.replace(spec.pools[n], replicas=c)
        for n, c in zip(names, counts, strict=True)
    }
    return msgspec.structs.replace(spec, replicas=replicas, pools=pools)


def replica_power_w(spec: ClusterSpec) -> tuple[float, float] | None:
    """``(idle, full load)`` watts of one replica of ``spec`` (all its GPUs), from the
    cluster's ``gpu_power_w`` or the GPU catalog (None: not known)."""
    if spec.gpu_power_w is not None:
        idle, full = spec.gpu_power_w.idle_w, spec.gpu_power_w.max_w
    else:
        power = get_gpu(spec.gpu).power_w
        if power is None:
            return None
        idle, full = power
    return idle * spec.tensor_parallel, full * spec.tensor_parallel


def resolve_model_gpu(spec: ClusterSpec) -> tuple[ModelSpec, GpuSpec]:
    return get_model(spec.model), get_gpu(spec.gpu)


def kv_transfer_s_per_token(spec: ClusterSpec) -> float:
    """Seconds to move one token's KV from a prefill to a decode replica: its KV bytes on
    each GPU (``ModelSpec.kv_bytes_per_token`` at the cluster's tensor parallelism) over
    the per-GPU, one-direction bandwidth (``disaggregation.kv_transfer_bandwidth_bytes_per_s``,
    default half the GPU's bidirectional interconnect bandwidth)."""
    model, gpu = resolve_model_gpu(spec)
    bandwidth = gpu.interconnect_bandwidth_bytes_per_s / 2
    if spec.disaggregation is not None and spec.disaggregation.kv_transfer_bandwidth_bytes_per_s:
        bandwidth = spec.disaggregation.kv_transfer_bandwidth_bytes_per_s
    return model.kv_bytes_per_token(spec.tensor_parallel) / bandwidth


def num_kv_blocks(spec: ClusterSpec) -> int:
    """KV blocks per replica: the override, or memory × utilization − weights − reserve."""
    if spec.num_kv_blocks is not None:
        return spec.num_kv_blocks
    model, gpu = resolve_model_gpu(spec)
    tokens = kv_capacity_tokens(
        model,
        gpu,
        spec.tensor_parallel,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        block_size=spec.engine.block_size,
    )
    blocks = tokens // spec.engine.block_size
    if blocks < 1:
        raise ConfigError(
            f"{model.name} does not fit on {spec.tensor_parallel} × {gpu.name} with "
            f"gpu_memory_utilization {spec.gpu_memory_utilization}: no memory is left for "
            "the KV cache; raise tensor_parallel or use a GPU with more memory",
            path="$.tensor_parallel",
        )
    return blocks


def step_time_model(spec: ClusterSpec, efficiency: EfficiencyTable) -> StepTimeModel:
    """The step-time model the cluster's replicas use."""
    if spec.step_time == "profile" and spec.profile is not None:
        return spec.profile
    model, gpu = resolve_model_gpu(spec)
    return RooflineStepTime(
        model=model,
        gpu=gpu,
        efficiency=efficiency.profile_for(gpu),
        tensor_parallel=spec.tensor_parallel,
        cuda_graphs=spec.cuda_graphs,
        cuda_graph_max_tokens=spec.cuda_graph_max_tokens,
    )


def build_replica(spec: ClusterSpec, step_time: StepTimeModel) -> ReplicaModel:
    """One idle replica of the cluster."""
    return ReplicaModel(spec.engine, num_kv_blocks(spec), step_time)


def _with_profile_file(data: dict[str, object], source: str) -> dict[str, object]:
    """``profile: FILE`` (relative to the cluster file): the file's ``step_time``, and
    ``step_time: profile`` unless the cluster says otherwise."""
    raw = str(data["profile"])
    path = Path(raw)
    if not path.is_absolute() and not source.startswith("<"):
        path = Path(source).parent / path
    fields = _profile_fields(read_profile(path))
    return {**fields, **data, "profile": msgspec.to_builtins(fields["profile"])}


def _profile_fields(profile: Profile) -> dict[str, Any]:
    """The cluster fields a calibrated profile sets."""
    return {"step_time": "profile", "profile": profile.step_time,
            "profile_of": measured_engine(profile)}  # fmt: skip


def measured_engine(profile: Profile) -> str:
    """A profile's engine in words: ``tiny (vllm 0.32.0, CPU)``."""
    details = ", ".join(x for x in (profile.engine, profile.hardware) if x)
    name = profile.model or "the calibrated engine"
    return f"{name} ({details})" if details else name


def parse_cluster(data: object, source: str = "<cluster>") -> ClusterSpec:
    """Validate already-parsed data as a cluster; errors name the key path. ``profile``
    may name a profile file that ``headway calibrate`` wrote."""
    if data is None:
        data = {}
    if isinstance(data, dict) and isinstance(data.get("profile"), str):
        data = _with_profile_file(data, source)
    try:
        return msgspec.convert(data, ClusterSpec)
    except msgspec.ValidationError as error:
        raise config_error(error, source, root=ClusterSpec, data=data,
                           docs="docs/simulate.md") from None  # fmt: skip


def replicas_needed_hint(tokens_per_s: float, per_replica_tokens_per_s: float) -> int:
    """A first guess of replicas for a token rate (used to seed searches)."""
    if per_replica_tokens_per_s <= 0:
        return 1
    return max(1, math.ceil(tokens_per_s / per_replica_tokens_per_s))


def with_profile(spec: ClusterSpec, path: Path) -> ClusterSpec:
    """``spec`` predicting step times from the profile file at ``path`` (``--profile``,
    what ``headway calibrate`` writes) instead of its own step-time model."""
    return msgspec.structs.replace(spec, **_profile_fields(read_profile(path)))
