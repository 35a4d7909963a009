"""Readiness probes and engine metrics: what the upstream pool asks an engine, and how it
reads the answers.

A probe sends one fixed greedy prompt (``temperature: 0``, a few tokens) to
``/v1/completions`` and judges the answer against the expected *fingerprint* of the model
revision: the completion text, ``sha256:HEX`` of it, or ``token_ids:PROMPT/OUTPUT`` (the
prompt's and the answer's token ids, which vLLM returns with ``return_token_ids``: they
tell a changed tokenizer or weights apart even where the detokenized text would agree),
optionally with a logprob checksum, ``token_ids:PROMPT/OUTPUT;logprob_sum:X`` (the sum
of the greedy tokens' log-probabilities, asked with ``logprobs: 1``, equal within
``LOGPROB_SUM_TOLERANCE`` or an explicit ``~T``: a changed dtype or kernel moves the
logits before it changes a greedy token).
The verdicts keep "busy" apart from "wrong":

* ``pass``: a complete answer equal to the fingerprint;
* ``wrong``: a complete answer that differs (``fingerprint mismatch``), a malformed answer,
  or a 4xx refusal other than 429: the replica breaks the contract (fail closed);
* ``busy``: the probe's deadline passed with the connection open, or 429/503/504: the
  replica is loaded, which says nothing about its output;
* ``error``: no answer at all (connection refused or reset, connect timeout, other 5xx).

:func:`judge` and :func:`parse_engine_metrics` are pure; :func:`run_probe` and
:func:`scrape_metrics` do the HTTP on a session the caller reserves for them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Final, Literal

import aiohttp

__all__ = [
    "DEFAULT_PROBE_PROMPT",
    "EngineMetrics",
    "ProbeOutcome",
    "ProbeResult",
    "fingerprint_digest",
    "judge",
    "label_value",
    "logprob_checksum",
    "metric_samples",
    "parse_engine_metrics",
    "probe_session",
    "run_probe",
    "scrape_metrics",
    "token_ids_fingerprint",
]

ProbeOutcome = Literal["pass", "wrong", "busy", "error"]

DEFAULT_PROBE_PROMPT: Final = "The readiness probe says:"
"""The fixed prompt of the readiness probe (any fixed text works; the fingerprint is
recorded for it)."""

TOKEN_IDS_PREFIX: Final = "token_ids:"
"""The prefix of a fingerprint of token ids (see :func:`token_ids_fingerprint`)."""

LOGPROB_SUM: Final = ";logprob_sum:"
"""Where a token-id fingerprint's logprob checksum starts."""

LOGPROB_SUM_TOLERANCE: Final = 0.05
"""How far the greedy tokens' logprob sum may drift and still pass (nats, over the
probe's few tokens: batch-dependent kernels move a logprob by ~1e-3)."""

FINGERPRINT_MISMATCH: Final = "fingerprint mismatch"
"""The reason of a complete answer that differs from the expected fingerprint."""

_BUSY_STATUSES: Final = frozenset({429, 503, 504})
_SNIPPET_CHARS: Final = 60


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe's verdict."""

    outcome: ProbeOutcome
    reason: str = ""
    """Empty on ``pass``; else a short cause (``fingerprint mismatch``, ``timeout after
    0.5 s``, ``HTTP 503``, ``connection refused``)."""
    detail: str = ""
    """More for operators (expected and received snippets, the error body)."""
    latency_s: float = 0.0
    """Wall seconds from sending the probe to its verdict."""


def fingerprint_digest(text: str) -> str:
    """``sha256:HEX`` of ``text`` (UTF-8): a fingerprint that does not spell the answer."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def token_ids_fingerprint(
    prompt_token_ids: list[int], token_ids: list[int], logprobs: list[float] | None = None
) -> str:
    """``token_ids:P1,P2,.../O1,O2,...``: the probe prompt's and the answer's token ids;
    with ``logprobs`` (the answer's ``logprobs.token_logprobs``), ``;logprob_sum:X`` after."""
    ids = (
        TOKEN_IDS_PREFIX
        + ",".join(map(str, prompt_token_ids))
        + "/"
        + ",".join(map(str, token_ids))
    )
    return ids if logprobs is None else f"{ids}{LOGPROB_SUM}{sum(logprobs):.6f}"


def logprob_checksum(expected: str) -> tuple[str, float, float] | None:
    """A token-id fingerprint split as (its ids part, the logprob sum, the tolerance);
    None without a checksum. Raises ValueError for a malformed one."""
    ids, sep, rest = expected.partition(LOGPROB_SUM)
    if not sep:
        return None
    total, tilde, tolerance = rest.partition("~")
    value, allowed = float(total), float(tolerance) if tilde else LOGPROB_SUM_TOLERANCE
    if not (math.isfinite(value) and math.isfinite(allowed) and allowed >= 0):
        raise ValueError(f"logprob_sum {rest!r} is not a finite number (~ a tolerance >= 0)")
    return ids, value, allowed


def _logprob_sum(choice: dict[str, object]) -> float:
    """The answer's greedy logprob sum (``logprobs.token_logprobs``, completions API)."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("token_logprobs"), list):
        raise KeyError("logprobs.token_logprobs (the engine ignores logprobs: 1)")
    values = logprobs["token_logprobs"]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise TypeError("token_logprobs are not numbers")
    return float(sum(values))


def _matches(expected: str, text: str) -> bool:
    if expected.startswith("sha256:"):
        return fingerprint_digest(text) == expected.lower()
    return text == expected


def _int_list(value: object) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise TypeError("token ids are not a list of integers")
    return value


def _answer(choice: object, expected: str) -> str:
    """What the probe's answer is compared as: its text, or its token-id fingerprint."""
    if not isinstance(choice, dict):
        raise TypeError("choice is not an object")
    if expected.startswith(TOKEN_IDS_PREFIX):
        if choice.get("token_ids") is None:
            raise KeyError("token_ids (the engine ignores return_token_ids)")
        return token_ids_fingerprint(
            _int_list(choice.get("prompt_token_ids")), _int_list(choice["token_ids"])
        )
    text = choice["text"]
    if not isinstance(text, str):
        raise TypeError("text is not a string")
    return text


def _snippet(text: str) -> str:
    return repr(text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "…")


def judge(status: int, body: bytes, expected: str) -> ProbeResult:
    """The verdict on a probe answered with HTTP ``status`` and ``body`` (no latency)."""
    if status in _BUSY_STATUSES:
        return ProbeResult("busy", f"HTTP {status}", body[:200].decode("utf-8", "replace"))
    if 400 <= status < 500:
        return ProbeResult(
            "wrong", f"probe refused (HTTP {status})", body[:200].decode("utf-8", "replace")
        )
    if status != 200:
        return ProbeResult("error", f"HTTP {status}", body[:200].decode("utf-8", "replace"))
    try:
        doc = json.loads(body)
        text = _answer(doc["choices"][0], expected)
    except (ValueError, KeyError, IndexError, TypeError) as error:
        return ProbeResult(
            "wrong",
            "malformed probe answer",
            f"{type(error).__name__}: {error}; body {_snippet(body.decode('utf-8', 'replace'))}",
        )
    checksum = logprob_checksum(expected) if expected.startswith(TOKEN_IDS_PREFIX) else None
    if checksum is not None:
        ids, total, tolerance = checksum
        if text != ids:
            return ProbeResult(
                "wrong", FINGERPRINT_MISMATCH, f"expected {_snippet(ids)}, got {_snippet(text)}"
            )
        try:
            got = _logprob_sum(doc["choices"][0])
        except (KeyError, TypeError) as error:
            return ProbeResult(
                "wrong", "malformed probe answer", f"{type(error).__name__}: {error}"
            )
        if abs(got - total) <= tolerance:
            return ProbeResult("pass")
        return ProbeResult(
            "wrong",
            FINGERPRINT_MISMATCH,
            f"token ids equal, logprob sum {got:.6f} vs {total:.6f} (tolerance {tolerance:g}): "
            "inspect the numerical format (dtype, quantisation, kernels)",
        )
    if _matches(expected, text):
        return ProbeResult("pass")
    shown = expected if expected.startswith("sha256:") else _snippet(expected)
    return ProbeResult("wrong", FINGERPRINT_MISMATCH, f"expected {shown}, got {_snippet(text)}")


class _Lane:
    """Per-request trace state: whether the probe got a connection."""

    __slots__ = ("connected",)

    def __init__(self) -> None:
        self.connected = False


async def _on_connection(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: object
) -> None:
    lane = context.trace_request_ctx
    if isinstance(lane, _Lane):
        lane.connected = True


def probe_session(connections: int = 1) -> aiohttp.ClientSession:
    """A session for probes: its own pool of ``connections`` connections (the reserved
    lane), no default timeout, and a trace that tells a connect timeout (``error``: no
    answer) from a reply that does not come (``busy``). Create it on the running loop."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(_on_connection)
    trace.on_connection_reuseconn.append(_on_connection)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, limit_per_host=connections),
        timeout=aiohttp.ClientTimeout(total=None),
        trace_configs=[trace],
    )


async def run_probe(
    session: aiohttp.ClientSession,
    url: str,
    *,
    model: str,
    prompt: str,
    max_tokens: int,
    expected: str,
    deadline_s: float,
    headers: Mapping[str, str] | None = None,
) -> ProbeResult:
    """Send the probe to ``url`` (the engine's base URL) on ``session`` and judge it.

    ``session`` should be the upstream's reserved :func:`probe_session` (its own
    connection), so that a saturated data path cannot hold the probe back.
    """
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": False,
    }
    if expected.startswith(TOKEN_IDS_PREFIX):
        payload["return_token_ids"] = True
        if LOGPROB_SUM in expected:
            payload["logprobs"] = 1
    started = time.perf_counter()
    lane = _Lane()
    try:
        async with (
            asyncio.timeout(deadline_s),
            session.post(
                f"{url}/v1/completions", json=payload, headers=headers, trace_request_ctx=lane
            ) as response,
        ):
            body = await response.read()
        result = judge(response.status, body, expected)
    except TimeoutError:
        if lane.connected:
            result = ProbeResult("busy", f"timeout after {deadline_s:g} s")
        else:
            result = ProbeResult("error", f"connect timeout after {deadline_s:g} s")
    except aiohttp.ClientConnectorError as error:
        result = ProbeResult("error", "connection refused", str(error))
    except aiohttp.ClientError as error:
        result = ProbeResult("error", f"connection failed ({type(error).__name__})", str(error))
    except OSError as error:
        result = ProbeResult("error", f"connection failed ({type(error).__name__})", str(error))
    latency_s = time.perf_counter() - started
    return ProbeResult(result.outcome, result.reason, result.detail, latency_s)


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """Load and KV capacity read from an engine's ``/metrics`` (vLLM's names); None for a
    metric the engine does not expose."""

    running_requests: int | None = None
    """``vllm:num_requests_running`` (summed over label sets)."""
    waiting_requests: int | None = None
    """``vllm:num_requests_waiting``."""
    kv_usage_fraction: float | None = None
    """``vllm:kv_cache_usage_perc`` (older vLLM: ``vllm:gpu_cache_usage_perc``), 0-1."""
    kv_blocks_total: int | None = None
    """``num_gpu_blocks`` label of ``vllm:cache_config_info``."""


_RUNNING: Final = "vllm:num_requests_running"
_WAITING: Final = "vllm:num_requests_waiting"
_KV_USAGE: Final = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_CACHE_INFO: Final = "vllm:cache_config_info"


def _sample(line: str) -> tuple[str, str, float] | None:
    """``(name, labels, value)`` of one exposition line, or None."""
    brace = line.find("{")
    space = line.rfind(" ")
    if space < 0:
        return None
    if brace >= 0 and brace < space:
        end = line.rfind("}")
        name, labels, rest = line[:brace], line[brace + 1 : end], line[end + 1 :]
    else:
        name, labels, rest = line[:space], "", line[space:]
    parts = rest.split()
    if not parts:
        return None
    try:
        return name, labels, float(parts[0])
    except ValueError:
        return None


def metric_samples(text: str) -> list[tuple[str, str, float]]:
    """Every ``(name, labels, value)`` sample in Prometheus exposition ``text``."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample = _sample(line)
            if sample is not None:
                out.append(sample)
    return out


def label_value(labels: str, key: str) -> str | None:
    """The value of label ``key`` in a sample's ``labels`` text, or None."""
    marker = f'{key}="'
    at = labels.find(marker)
    if at < 0:
        return None
    start = at + len(marker)
    end = labels.find('"', start)
    return labels[start:end] if end >= 0 else None


def parse_engine_metrics(text: str) -> EngineMetrics:
    """The load metrics in Prometheus exposition ``text`` (other lines are skipped)."""
    running: float | None = None
    waiting: float | None = None
    usage: float | None = None
    blocks: int | None = None
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        sample = _sample(line)
        if sample is None:
            continue
        name, labels, value = sample
        if name == _RUNNING:
            running = (running or 0.0) + value
        elif name == _WAITING:
            waiting = (waiting or 0.0) + value
        elif name in _KV_USAGE:
            usage = value if usage is None else max(usage, value)
        elif name == _CACHE_INFO:
            raw = label_value(labels, "num_gpu_blocks")
            if raw is not None and raw.isdigit():
                blocks = int(raw)
    return EngineMetrics(
        running_requests=None if running is None else int(running),
        waiting_requests=None if waiting is None else int(waiting),
        kv_usage_fraction=None if usage is None else min(1.0, max(0.0, usage)),
        kv_blocks_total=blocks,
    )


async def scrape_metrics(
    session: aiohttp.ClientSession,
    url: str,
    *,
    deadline_s: float,
    headers: Mapping[str, str] | None = None,
) -> EngineMetrics:
    """GET ``url``/metrics and parse it.

    Raises:
        OSError, aiohttp.ClientError, TimeoutError: the engine did not answer in time.
        ValueError: it answered with a status other than 200.
    """
    async with (
        asyncio.timeout(deadline_s),
        session.get(f"{url}/metrics", headers=headers) as response,
    ):
        if response.status != 200:
            raise ValueError(f"GET /metrics answered HTTP {response.status}")
        text = await response.text()
    return parse_engine_metrics(text)
