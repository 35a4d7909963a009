"""Send the probes of a :class:`~headway.calibrate.plan.ProbePlan` and time their streams.

A shared probe's requests share a prefix, which one request (a token long) leaves in the
engine's prefix cache just before they are sent.

Each request is a streamed ``/v1/completions`` call with a token-id prompt (ids of words
the server's tokenizer has, from its ``/tokenize``: :mod:`headway.server_vocabulary`),
``max_tokens`` and ``ignore_eos`` (so the engine generates exactly that many tokens), and
``stream_options.include_usage``. The time of every content chunk is taken on receipt with
``time.perf_counter``; a chunk is one token (what vLLM, SGLang and the emulator send
without speculative decoding), also when its text is empty (:mod:`headway.stream_tokens`).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import aiohttp

from headway.calibrate.engine_settings import metrics_text, read_engine_settings
from headway.calibrate.plan import ProbePlan, ProbeShape
from headway.calibrate.profile import EngineSettings
from headway.calibrate.ttft_split import TtftSplit, histogram_totals, ttft_split
from headway.core.errors import HeadwayError
from headway.server_vocabulary import read_vocabulary
from headway.stream_tokens import is_token_choice

__all__ = [
    "REFERENCE_RERUNS",
    "EndpointInfo",
    "ProbeError",
    "ProbeResult",
    "StreamTiming",
    "discover",
    "run_probes",
]

_FIRST_PROMPT_ID = 1000
_PROMPT_ID_SPAN = 29000
"""Without the server's vocabulary, prompt token ids are drawn from ``1000 .. 29999``:
ordinary tokens in every common vocabulary of 32k and up."""


class ProbeError(HeadwayError):
    """The endpoint did not answer a probe as an OpenAI-compatible server should."""


@dataclass(slots=True)
class StreamTiming:
    """One probe request, timed."""

    prompt_tokens: int
    sent_s: float
    """``perf_counter`` when the request was sent."""
    token_times_s: list[float] = field(default_factory=list)
    """``perf_counter`` on receipt of each content chunk."""
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None


@dataclass(slots=True)
class ProbeResult:
    """The streams of one probe."""

    shape: ProbeShape
    streams: list[StreamTiming]
    ttft_split: TtftSplit | None = None
    """vLLM's own split of its requests' TTFT (:mod:`headway.calibrate.ttft_split`),
    when the engine exports it; wall seconds."""
    attempt: int = 0
    """0, or how many runs of this reference probe before it were disturbed."""


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """What the endpoint says about itself."""

    model: str
    engine: str
    hardware: str
    time_scale: float
    """Engine seconds per wall second: an emulator's ``speedup`` (``/version``), else 1."""
    max_model_len: int | None
    """Longest prompt + output the model takes (vLLM lists it in ``/v1/models``)."""
    engine_settings: EngineSettings = field(default_factory=EngineSettings)
    """The scheduler and KV-cache settings the endpoint exposes."""


async def discover(session: aiohttp.ClientSession, target: str, model: str | None) -> EndpointInfo:
    """Read ``/v1/models`` (the model to probe) and ``/version`` (engine, hardware,
    speed-up) when the endpoint has them."""
    try:
        async with session.get(f"{target}/v1/models") as resp:
            server = resp.headers.get("Server", "")
            if resp.status != 200:
                raise ProbeError(
                    f"{target}/v1/models answered HTTP {resp.status}; is it an "
                    "OpenAI-compatible server?"
                )
            data = (await resp.json()).get("data", [])
    except aiohttp.ClientError as error:
        raise ProbeError(f"cannot reach {target}: {error}") from None
    listed = [m for m in data if isinstance(m, dict)]
    if model is None:
        if not listed:
            raise ProbeError(f"{target}/v1/models lists no model; pass --model")
        model = str(listed[0].get("id", ""))
    lengths = [m.get("max_model_len") for m in listed if m.get("id") == model]
    max_model_len = lengths[0] if lengths and isinstance(lengths[0], int) else None
    version: dict[str, object] = {}
    try:
        async with session.get(f"{target}/version") as resp:
            if resp.status == 200:
                body = await resp.json(content_type=None)
                if isinstance(body, dict):
                    version = body
    except (aiohttp.ClientError, json.JSONDecodeError):
        pass
    engine = str(version.get("version") or server or "")
    if engine and not engine.startswith(("vllm", "headway")) and "version" in version:
        engine = f"vllm {engine}"  # vLLM's /version is {"version": "0.11.0"}
    speedup = version.get("speedup")
    scale = float(speedup) if isinstance(speedup, int | float) and speedup > 0 else 1.0
    return EndpointInfo(
        model=model,
        engine=engine,
        hardware=str(version.get("hardware") or ""),
        time_scale=scale,
        max_model_len=max_model_len,
    )


def _prompt(
    rng: random.Random, length: int, serial: int, ids: tuple[int, ...] | None = None
) -> list[int]:
    """A token-id prompt; ``ids``: ids the server's tokenizer has (else a common range)."""
    if ids:
        return [ids[serial % len(ids)], *rng.choices(ids, k=length - 1)]
    first = _FIRST_PROMPT_ID + serial % _PROMPT_ID_SPAN
    return [first, *(rng.randrange(_FIRST_PROMPT_ID, _FIRST_PROMPT_ID + _PROMPT_ID_SPAN)
                     for _ in range(length - 1))]  # fmt: skip


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: list[int],
    output_tokens: int,
    start: asyncio.Event,
) -> StreamTiming:
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": output_tokens, "min_tokens": output_tokens,
        "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip
    await start.wait()
    for attempt in range(2):
        timing = StreamTiming(prompt_tokens=len(prompt), sent_s=time.perf_counter())
        try:
            await _stream(session, url, body, timing)
        except aiohttp.ServerDisconnectedError:
            # A pooled connection the server closed while it idled (uvicorn's keep-alive
            # timeout is 5 s; a long probe leaves the others idle that long): send again
            # on a fresh one, once, if nothing came back on this one.
            if attempt == 0 and not timing.token_times_s:
                continue
            raise ProbeError(
                f"{url} closed the connection during a probe; is the server still up?"
            ) from None
        except (aiohttp.ClientError, TimeoutError) as error:
            # The endpoint stopped answering mid-probe (it died, or hung past the read
            # timeout): one line, not aiohttp's traceback.
            what = str(error) or type(error).__name__
            raise ProbeError(
                f"{url} stopped answering a probe ({what}); is the server still up?"
            ) from None
        break
    return timing


async def _stream(
    session: aiohttp.ClientSession, url: str, body: bytes, timing: StreamTiming
) -> None:
    """Send one probe and time each content chunk into ``timing``."""
    headers = {"Content-Type": "application/json"}
    times = timing.token_times_s
    clock = time.perf_counter
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            text = (await resp.text())[:300]
            raise ProbeError(f"{url} answered HTTP {resp.status} to a probe: {text}")
        async for line in resp.content:
            now = clock()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:  # vLLM refuses a bad prompt with an error event in a 200
                raise ProbeError(f"{url} streamed an error to a probe: {payload[:300]!r}")
            choices = chunk.get("choices") or []
            if choices and is_token_choice(choices[0]):
                times.append(now)
            usage = chunk.get("usage")
            if usage:
                timing.usage_prompt_tokens = usage.get("prompt_tokens")
                timing.usage_completion_tokens = usage.get("completion_tokens")


async def run_probes(
    target: str,
    plan: ProbePlan,
    *,
    model: str | None = None,
    read_timeout_s: float = 120.0,
    seed: int | None = None,
    progress: Callable[[int, int, ProbeShape], None] | None = None,
    for_fit: bool = False,
    disturbed: Callable[[ProbeResult, float], bool] | None = None,
) -> tuple[EndpointInfo, list[ProbeResult]]:
    """Discover the endpoint and its settings, warm it up, and run every probe of ``plan``
    that fits the model's length limit, in order.

    ``seed`` draws the prompts' token ids; None (the default): a fresh one each run. An
    engine with prefix caching keeps the blocks of the prompts it served, so a second run
    with the same prompts finds them cached: against vLLM a second calibration with seed
    0 measured a 1,536-token prefill in 85 ms instead of 605 ms and fitted
    ``per_prefill_token_s`` at 0. Nothing but cache hits depends on the ids.

    ``for_fit``: the probes are for a fit; a plan whose fit the endpoint's length limit
    leaves unidentified (:meth:`ProbePlan.unidentified`) raises before any probe runs.

    ``disturbed(result, time_scale)``: whether a reference probe measured a disturbance
    (a busy client or host) rather than the engine; such a probe is run again, up to
    :data:`REFERENCE_RERUNS` times, and every run is kept in the results. The references
    anchor the drift check, which needs two: on a loaded two-core host the first
    reference of a run was left out (its steps scattered) and the one beside a 2×
    slowdown too, so the check saw only the slow ones and passed a drifting run.
    """
    target = target.rstrip("/")
    most = max(plan.decode_concurrency, default=1)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout_s)
    connector = aiohttp.TCPConnector(limit=most + 2, force_close=False)
    rng = random.Random(secrets.randbits(64) if seed is None else seed)
    serial = 0
    results: list[ProbeResult] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        info = await discover(session, target, model)
        settings = await read_engine_settings(session, target, info.max_model_len)
        info = replace(info, engine_settings=settings)
        vocabulary = await asyncio.to_thread(read_vocabulary, target, info.model)
        ids = vocabulary.word_ids if vocabulary is not None else None
        try:
            shapes = plan.shapes(info.max_model_len)
        except ValueError as error:
            raise ProbeError(str(error)) from None
        if settings.enable_prefix_caching is False:  # nothing is shared: no shared probe
            shapes = [s for s in shapes if s.kind != "shared"]
        unidentified = plan.unidentified(info.max_model_len) if for_fit else None
        if unidentified is not None:
            raise ProbeError(unidentified[1])
        url = f"{target}/v1/completions"
        # Warm-up: open the connections and let the engine reach its steady state.
        start = asyncio.Event()
        warm = [
            _one(session, url, info.model, _prompt(rng, 16, serial + i, ids), 4, start)
            for i in range(most)
        ]
        serial += most
        start.set()
        await asyncio.gather(*warm)
        split_ttft = await _ttft_totals(session, target) is not None
        for n, shape in enumerate(shapes):
            reruns = REFERENCE_RERUNS if disturbed is not None and shape.kind == "reference" else 0
            for attempt in range(reruns + 1):
                if progress is not None:
                    progress(n, len(shapes), shape)
                warm_prompt: list[int] | None = None
                if shape.shared_prefix_tokens:
                    prefix = _prompt(rng, shape.shared_prefix_tokens, serial, ids)
                    own = shape.prompt_tokens - shape.shared_prefix_tokens
                    prompts = [prefix + _prompt(rng, own, serial + 1 + i, ids)
                               for i in range(shape.concurrency + 1)]  # fmt: skip
                    warm_prompt = prompts.pop()
                    serial += shape.concurrency + 2
                else:
                    prompts = [
                        _prompt(rng, shape.prompt_tokens, serial + i, ids)
                        for i in range(shape.concurrency)
                    ]
                    serial += shape.concurrency
                result = await _probe(
                    session, target, info.model, shape, prompts, split_ttft, attempt, warm_prompt
                )
                results.append(result)
                if attempt == reruns or disturbed is None or not disturbed(result, info.time_scale):
                    break
    return info, results


REFERENCE_RERUNS = 3
"""How many more times a disturbed reference probe runs (it is short: 33 steps of 4)."""


async def _probe(
    session: aiohttp.ClientSession,
    target: str,
    model: str,
    shape: ProbeShape,
    prompts: list[list[int]],
    split_ttft: bool,
    attempt: int,
    warm: list[int] | None = None,
) -> ProbeResult:
    """Send ``prompts`` at once (one request each) and time them, as run ``attempt`` of
    ``shape``; with ``split_ttft``, read the engine's TTFT histograms before and after.
    ``warm``: a prompt served first, alone, for one token (a shared probe's prefix)."""
    url = f"{target}/v1/completions"
    if warm is not None:
        ready = asyncio.Event()
        ready.set()
        await _one(session, url, model, warm, 1, ready)
    start = asyncio.Event()
    calls = [_one(session, url, model, prompt, shape.output_tokens, start) for prompt in prompts]
    before = await _ttft_totals(session, target) if split_ttft else None
    tasks = [asyncio.ensure_future(c) for c in calls]
    await asyncio.sleep(0)  # every task is waiting on `start`
    start.set()
    streams = list(await asyncio.gather(*tasks))
    after = await _ttft_totals(session, target) if before is not None else None
    split = ttft_split(before, after) if before is not None and after else None
    return ProbeResult(shape=shape, streams=streams, ttft_split=split, attempt=attempt)


async def _ttft_totals(session: aiohttp.ClientSession, target: str) -> dict[str, float] | None:
    """The TTFT histograms' totals from the engine's ``/metrics`` (None when it has no
    such page or not all three histograms: the split is then not reported)."""
    return histogram_totals(await metrics_text(session, target))
