"""The trace of what a bench run really sent, and a workload that replays it in ``simulate``.

A workload asks for token counts; the server may count others (a chat template, a BOS,
a tokenizer that splits the filler differently). ``sent-trace.jsonl`` has one line per
sent call in headway's generic trace format: when it was sent (seconds from the first
send) and the tokens the server served (``usage``; the asked count where the server
reported none). ``sent-workload.yaml`` wraps it as a one-class trace replay, so
``headway simulate sent-workload.yaml --cluster C.yaml`` simulates exactly what the engine
got. When the calls carried prefix-block ids (a replayed Mooncake trace's ``hash_ids``),
the sent trace is in Mooncake's format instead (ms timestamps, ``input_length``,
``output_length``, ``hash_ids``), so the simulated prefix cache sees the same sharing.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import yaml

from headway.bench.records import CallRecords
from headway.core.workload.compile import CompiledWorkload
from headway.files.output import write_text_atomic
from headway.trace.readers import MOONCAKE_BLOCK_TOKENS

__all__ = ["SENT_TRACE", "SENT_WORKLOAD", "sent_rows", "write_sent_trace"]

SENT_TRACE = "sent-trace.jsonl"
SENT_WORKLOAD = "sent-workload.yaml"


Row = dict[str, float | int | list[int]]


def with_prefix_ids(w: CompiledWorkload) -> bool:
    """Whether every call carries Mooncake prefix-block ids (512-token blocks)."""
    return (
        bool(w.prefix_hash_ids)
        and bool((w.call_prefix_row >= 0).all())
        and all(tokens == MOONCAKE_BLOCK_TOKENS for _, tokens in w.prefix_hash_ids)
    )


def sent_rows(w: CompiledWorkload, r: CallRecords) -> list[Row]:
    """One row per sent call, by send time: ``timestamp_s``, served input and output tokens
    (Mooncake's keys and ``hash_ids`` when :func:`with_prefix_ids`)."""
    sent = np.flatnonzero(np.isfinite(r.sent_s))
    if sent.size == 0:
        return []
    sent = sent[np.argsort(r.sent_s[sent], kind="stable")]
    first = float(r.sent_s[sent[0]])
    served_in = np.where(r.prompt_tokens >= 0, r.prompt_tokens, w.call_input_tokens)
    served_out = np.where(r.completed, r.completion_tokens, w.call_output_tokens)
    if with_prefix_ids(w):
        return [
            {
                "timestamp": round((float(r.sent_s[j]) - first) * 1000.0, 6),
                "input_length": int(served_in[j]),
                "output_length": int(served_out[j]),
                "hash_ids": w.prefix_hash_ids[int(w.call_prefix_row[j])][0].tolist(),
            }
            for j in sent
        ]
    return [
        {
            "timestamp_s": round(float(r.sent_s[j]) - first, 9),
            "input_tokens": int(served_in[j]),
            "output_tokens": int(served_out[j]),
        }
        for j in sent
    ]


def write_sent_trace(directory: Path, w: CompiledWorkload, r: CallRecords) -> tuple[Path, Path]:
    """Write ``sent-trace.jsonl`` and ``sent-workload.yaml`` into ``directory``."""
    rows = sent_rows(w, r)
    trace = directory / SENT_TRACE
    write_text_atomic(trace, "".join(msgspec.json.encode(row).decode() + "\n" for row in rows))
    slos = {msgspec.json.encode(c.slo) for c in w.spec.classes.values()}
    cls: dict[str, object] = {"calls": 1}
    if len(slos) == 1:  # every class had the same SLO: keep it
        slo = msgspec.json.decode(slos.pop())
        cls["slo"] = {k: v for k, v in slo.items() if v is not None}
    mooncake = with_prefix_ids(w)
    span = 0.0
    if rows:
        last = rows[-1]
        span = float(last["timestamp"]) / 1000.0 if mooncake else float(last["timestamp_s"])  # type: ignore[arg-type]
    workload = {
        "name": f"{w.spec.name} (sent)",
        "duration_s": float(span) + 1.0,
        "classes": {"sent": cls},
        "sources": [
            {
                "name": "sent",
                "arrivals": {
                    "process": "trace",
                    "path": SENT_TRACE,
                    "format": "mooncake" if mooncake else "generic",
                },
            }
        ],
    }
    spec_path = directory / SENT_WORKLOAD
    write_text_atomic(spec_path, yaml.safe_dump(workload, sort_keys=False))
    return trace, spec_path
