"""The drill catalog as Markdown (the generated part of ``docs/drills.md``), so the docs
say exactly what the drills do and expect."""

from __future__ import annotations

from headway.drill.catalog import DRILLS
from headway.drill.spec import Drill

__all__ = ["catalog_markdown"]


def _load(drill: Drill) -> str:
    load = drill.load
    parts = [
        f"{load.rate_per_s:g} calls/s for {load.duration_s:g} s",
        f"{load.stream_fraction:.0%} streaming",
        f"{load.prompt_words} prompt words",
        f"max_tokens {load.max_tokens}",
        f"retries `{load.retry}`",
    ]
    if load.deadline_ms is not None:
        parts.append(f"deadline {load.deadline_ms} ms")
    if load.cancel_fraction:
        parts.append(f"{load.cancel_fraction:.0%} abandoned")
    if load.slow_reader_fraction:
        parts.append(f"{load.slow_reader_fraction:.0%} slow readers")
    if len(load.tenants) > 1:
        parts.append("tenants " + ", ".join(f"`{k}` ×{v:g}" for k, v in load.tenants.items()))
    return ", ".join(parts)


def _stack(drill: Drill) -> str:
    stack = drill.stack
    parts = []
    if stack.gateways > 1:
        parts.append(f"{stack.gateways} gateways")
    if stack.redis:
        parts.append("Redis")
    if stack.num_kv_blocks:
        parts.append(f"{stack.num_kv_blocks} KV blocks per engine")
    if stack.gateway:
        parts.append(f"gateway config `{stack.gateway}`")
    return ", ".join(parts)


def catalog_markdown() -> str:
    """One section per drill: seed text, designed behaviour, load, faults, checks."""
    out: list[str] = []
    for d in DRILLS.values():
        out += [f"### `{d.name}`: {d.title}", "", f"*Seed:* “{d.seed_text}”", ""]
        out += [f"*Designed:* {d.designed}", "", f"*Load:* {_load(d)}.", ""]
        if d.faults:
            steps = []
            for f in d.faults:
                step = f"at {f.at_s:g} s `{f.action}`"
                if f.action.endswith(("engine", "faults")):
                    step += f" (engine {f.engine})"
                if f.params:
                    step += f" `{f.params}`"
                steps.append(step)
            out += ["*Faults:* " + "; ".join(steps) + ".", ""]
        stack = _stack(d)
        if stack:
            out += [f"*Stack:* {stack}.", ""]
        out += ["| figure | expected | why |", "| --- | --- | --- |"]
        out += [f"| `{e.figure}` | {e.op} {e.value:g} | {e.why} |" for e in d.expect]
        out.append("")
    return "\n".join(out)
