"""The emulator's HTTP server (aiohttp): OpenAI routes, health, metrics and fault knobs.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming SSE or not),
``GET /v1/models``, ``GET /health``, ``GET /version``, ``GET /metrics``,
``GET /openapi.json`` (the generation routes' OpenAPI document), and
``GET|POST|DELETE /admin/faults``. A client that disconnects cancels its handler, which
aborts the request in the engine (its KV blocks are freed), as vLLM does.

aiohttp is used for its C HTTP parser and low per-request cost on small machines; the
SSE chunks of a token are written from pre-encoded byte templates.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from headway import __version__
from headway.core.engine.replica import ReplicaModel
from headway.core.errors import ConfigError
from headway.core.policy.deadlines import BUDGET_HEADER, Deadline
from headway.emulate.faults import FaultState, FaultUpdate
from headway.emulate.openai_api import ApiError, GenerationRequest, parse_request
from headway.emulate.openapi import openapi_document
from headway.emulate.tokens import OutputTokens, prompt_block_hashes, token_text
from headway.emulate.wallclock import Generation, WallClockEngine
from headway.http_boundary import BoundaryLimits, BoundaryRunner, boundary_middleware, listen
from headway.http_errors import (
    deadline_exceeded,
    error_body,
    error_response,
    openai_shaped_errors,
    too_large_response,
)
from headway.metrics_catalog import CACHE_CONFIG_LABELS, EMULATOR, Metrics
from headway.metrics_catalog import CONTENT_TYPE as METRICS_CONTENT_TYPE

__all__ = ["CRASH_EXIT_CODE", "EmulatorServer", "EmulatorSettings"]

_log = logging.getLogger("headway.emulate")


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


CRASH_EXIT_CODE = 70
"""Exit status of the ``crash`` fault (EX_SOFTWARE)."""

MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request body read (413 beyond it; refused from ``Content-Length`` unread)."""

_STREAM = web.RequestKey("stream", web.StreamResponse)
"""The prepared stream of a request, for a deadline that ends it mid-answer."""
_ROUTES = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health"


def _too_large_response() -> web.Response:
    return too_large_response(MAX_BODY_BYTES, "server")


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorSettings:
    """What the server says about itself and how it fills in missing request fields."""

    served_model_names: tuple[str, ...]
    """Names accepted in ``model`` (the first is the one ``/v1/models`` lists first)."""
    revision: str
    """The model revision: output tokens (the fingerprint) depend on it."""
    vocab_size: int
    """Token ids are drawn below this."""
    max_model_len: int | None = None
    """The longest prompt + output accepted and listed in ``/v1/models``, as vLLM's
    ``max_model_len``: the model's context length or ``--max-model-len`` (None: the KV
    pool). Never more than the KV pool holds (vLLM would refuse to start)."""
    default_max_tokens: int = 128
    """Mean output length when a request has no ``max_tokens``."""
    hardware: str = ""
    """The emulated hardware, reported by ``/version``."""
    step_time: str = ""
    """Where step times come from (``roofline`` or a profile path), for ``/version``."""
    extra_version: dict[str, object] = field(default_factory=dict)
    prefix_caching: bool = False
    """Hash prompts' blocks so that equal prefixes hit the engine's prefix cache (salted
    by ``cache_salt``). Off: every prompt block is the request's own, as before."""


class EmulatorServer:
    """An emulated engine behind HTTP. ``await start()``, then ``await stop()``."""

    def __init__(
        self,
        replica: ReplicaModel,
        settings: EmulatorSettings,
        *,
        speedup: float = 1.0,
        faults: FaultState | None = None,
        admin_token: str | None = None,
        limits: BoundaryLimits | None = None,
    ) -> None:
        self.settings = settings
        self.admin_token = admin_token
        """Bearer token of ``/admin/faults`` (None: open, for drills on loopback)."""
        self.limits = limits or BoundaryLimits(max_body_bytes=MAX_BODY_BYTES)
        self.faults = faults if faults is not None else FaultState()
        self.metrics = Metrics(EMULATOR, fixed={"model_name": settings.served_model_names[0]})
        self.engine = WallClockEngine(
            replica, speedup=speedup, faults=self.faults, metrics=self.metrics
        )
        config = replica.config
        # vLLM labels its CacheConfig's fields with str(value): True, None, 16.
        cache_config = {
            "block_size": str(config.block_size), "cache_dtype": "auto",
            "enable_prefix_caching": str(config.enable_prefix_caching),
            "num_gpu_blocks": str(replica.scheduler.pool.num_blocks),
            "num_gpu_blocks_override": "None", "engine": "0",
        }  # fmt: skip
        info = tuple(cache_config[k] for k in CACHE_CONFIG_LABELS)
        self.metrics.read("vllm:cache_config_info", lambda: [(info, 1.0)])
        self._requests = self.metrics.counter("headway_emulator_http_requests_total")
        self._client_errors = self.metrics.counter("headway_emulator_client_errors_total")
        self._deadline_aborts = self.metrics.counter("headway_emulator_deadline_aborts_total")
        self.app = web.Application(
            client_max_size=MAX_BODY_BYTES,
            middlewares=[
                openai_shaped_errors(_ROUTES, MAX_BODY_BYTES, "server"),
                boundary_middleware(self.limits, "server"),
            ],
        )
        self.app.router.add_post("/v1/completions", self._completions)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/version", self._version)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/openapi.json", self._openapi)
        self.app.router.add_get("/admin/faults", self._get_faults)
        self.app.router.add_post("/admin/faults", self._post_faults)
        self.app.router.add_delete("/admin/faults", self._delete_faults)
        self._runner: BoundaryRunner | None = None
        self._site: web.TCPSite | None = None
        self._host = "127.0.0.1"
        self._port = 0
        self._engine_task: asyncio.Task[None] | None = None
        self._crash_timer: asyncio.TimerHandle | None = None
        self._reopen_timer: asyncio.TimerHandle | None = None
        self._refusing: asyncio.Future[None] | None = None
        self._reopening: asyncio.Future[None] | None = None
        self._count = 0

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        """``http://host:port`` of the bound listener."""
        return f"http://{self._host}:{self._port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind, start the engine loop, apply start-up faults; return the URL."""
        self._runner = BoundaryRunner(
            self.app, self.limits, access_log=None, handler_cancellation=True,
            shutdown_timeout=1.0,
        )  # fmt: skip
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True, backlog=1024)
        await listen(site, host, port)
        self._site = site
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self._host = host
        self._port = sockets[0].getsockname()[1] if sockets else port
        self._engine_task = asyncio.create_task(self.engine.run(), name="emulator-engine")
        self._engine_task.add_done_callback(self._engine_ended)
        self._arm_faults()
        return self.url

    def _engine_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            _log.error("the engine loop failed", exc_info=task.exception())
            os._exit(CRASH_EXIT_CODE)

    async def stop(self) -> None:
        """Stop listening, cut open streams, stop the engine loop."""
        for timer in (self._crash_timer, self._reopen_timer):
            if timer is not None:
                timer.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._engine_task is not None:
            self._engine_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine_task
            self._engine_task = None
            self.engine.close()

    # ----------------------------------------------------------------- faults

    def apply_faults(self, update: FaultUpdate) -> None:
        """Apply a fault update now (raises ``ConfigError`` for a bad value)."""
        self.faults.apply(update, time.monotonic())
        self.engine._wake.set()  # a stall may have ended
        self._arm_faults()

    def _arm_faults(self) -> None:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if self._crash_timer is not None:
            self._crash_timer.cancel()
            self._crash_timer = None
        if self.faults.crash_at != float("inf"):
            self._crash_timer = loop.call_later(max(0.0, self.faults.crash_at - now), self._crash)
        if self.faults.refuse_until > now and self._site is not None:
            self._refusing = asyncio.ensure_future(self._refuse(self.faults.refuse_until - now))

    def _crash(self) -> None:
        _log.error("fault: crash (exit %d)", CRASH_EXIT_CODE)
        logging.shutdown()
        os._exit(CRASH_EXIT_CODE)

    async def _refuse(self, for_s: float) -> None:
        site, self._site = self._site, None
        if site is None:
            return
        await site.stop()
        if self._reopen_timer is not None:
            self._reopen_timer.cancel()
        self._reopen_timer = asyncio.get_running_loop().call_later(
            for_s, self._schedule_listen_again
        )

    def _schedule_listen_again(self) -> None:
        self._reopening = asyncio.ensure_future(self._listen_again())

    async def _listen_again(self) -> None:
        if self._runner is None or self._site is not None:
            return
        now = time.monotonic()
        if self.faults.refuse_until > now:  # extended meanwhile
            self._reopen_timer = asyncio.get_running_loop().call_later(
                self.faults.refuse_until - now, self._schedule_listen_again
            )
            return
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True, backlog=1024)
        await site.start()
        self._site = site

    def _admin_refusal(self, request: web.Request) -> web.Response | None:
        """401 unless ``Authorization: Bearer ADMIN_TOKEN`` (when a token is set)."""
        token = self.admin_token
        if token is None:
            return None
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if hmac.compare_digest(key.encode(), token.encode()):
            return None
        return error_response(
            401, "wrong or missing admin token: send `Authorization: Bearer ADMIN_TOKEN` "
            "(the emulator's --admin-token)", code="invalid_api_key",
        )  # fmt: skip

    async def _get_faults(self, request: web.Request) -> web.Response:
        refused = self._admin_refusal(request)
        if refused is not None:
            return refused
        return web.json_response(self.faults.view(time.monotonic()))

    async def _post_faults(self, request: web.Request) -> web.Response:
        refused = self._admin_refusal(request)
        if refused is not None:
            return refused
        raw = await request.read()
        try:
            update = msgspec.json.decode(raw or b"{}", type=FaultUpdate)
            self.apply_faults(update)
        except (msgspec.ValidationError, msgspec.DecodeError) as error:
            known = ", ".join(FaultUpdate.__struct_fields__)
            return web.json_response(
                error_body(f"bad fault update: {error}; knobs: {known}", 400), status=400
            )
        except ConfigError as error:
            return web.json_response(error_body(str(error), 400, param=error.path), status=400)
        if self._refusing is not None:
            await self._refusing  # closed before the answer: the next connect is refused
        return web.json_response(self.faults.view(time.monotonic()))

    async def _delete_faults(self, request: web.Request) -> web.Response:
        refused = self._admin_refusal(request)
        if refused is not None:
            return refused
        self.apply_faults(
            FaultUpdate(stall=False, slowdown_factor=1.0, corrupt_fingerprint=False,
                        delay_s=0.0, refuse_connections_s=0.0, fail_prompts_over_tokens=0,
                        budget_fraction=1.0)
        )  # fmt: skip
        self.faults.crash_at = float("inf")
        self._arm_faults()
        return web.json_response(self.faults.view(time.monotonic()))

    @property
    def max_model_len(self) -> int:
        """The longest prompt + output this server takes (see ``EmulatorSettings``)."""
        pool = self.engine.max_model_len
        limit = self.settings.max_model_len
        return pool if limit is None else min(limit, pool)

    # ----------------------------------------------------------------- info routes

    async def _models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "headway",
             "root": name, "max_model_len": self.max_model_len}
            for name in self.settings.served_model_names
        ]  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(self.settings.served_model_names, __version__))

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    def _scheduler_fingerprint(self) -> dict[str, object]:
        """The scheduler settings (part of the serving fingerprint a rollback restores)."""
        replica = self.engine.replica
        out: dict[str, object] = msgspec.to_builtins(replica.config)
        out["num_kv_blocks"] = replica.scheduler.pool.num_blocks
        return out

    async def _version(self, request: web.Request) -> web.Response:
        s = self.settings
        return web.json_response(
            {
                "version": f"headway-emulate {__version__}",
                "engine": "headway-emulate",
                "model": s.served_model_names[0],
                "revision": s.revision,
                "hardware": s.hardware,
                "step_time": s.step_time,
                "speedup": self.engine.speedup,
                "tokenizer": f"headway-emulate/{s.served_model_names[0]}/v{s.vocab_size}",
                "scheduler": self._scheduler_fingerprint(),
                **s.extra_version,
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(),
            headers={"Content-Type": METRICS_CONTENT_TYPE, "X-Content-Type-Options": "nosniff"},
        )

    # ----------------------------------------------------------------- generation

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        arrived_at = time.monotonic()
        self._requests.inc()
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:
            self._client_errors.inc()
            return _too_large_response()
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:  # chunked, or longer than announced
            self._client_errors.inc()
            return _too_large_response()
        try:
            parsed = parse_request(
                "chat" if kind == "chat" else "completion", raw,
                self.settings.served_model_names, self.settings.vocab_size,
            )  # fmt: skip
            index = self._count
            self._count += 1
            num_out, stop_reason = parsed.output_tokens(self.settings.default_max_tokens, index)
            self._check_length(parsed, num_out)
            budget = request.headers.get(BUDGET_HEADER)
            try:
                deadline = None if budget is None else Deadline.from_header(arrived_at, budget)
            except ValueError as error:
                raise ApiError(400, str(error), param=BUDGET_HEADER) from None
        except ApiError as error:
            self._client_errors.inc()
            return web.json_response(error.body(), status=error.status)
        over = self.faults.fail_prompts_over_tokens
        if over and parsed.num_prompt_tokens > over:
            failed = ApiError(
                500,
                f"injected fault: prompts over {over} tokens fail "
                "(fail_prompts_over_tokens; DELETE /admin/faults clears it)",
            )
            return web.json_response(failed.body(), status=500)
        if self.faults.delay_s > 0:
            arrived_at += self.faults.delay_s
            await asyncio.sleep(arrived_at - time.monotonic())
        revision = self.settings.revision
        if self.faults.corrupt_fingerprint:
            revision += "#corrupt"
        sample_seed = (
            None if parsed.greedy else (parsed.seed if parsed.seed is not None else -index - 1)
        )
        tokens = OutputTokens(revision, parsed.prompt_key, sample_seed, self.settings.vocab_size)
        hashes: list[int] = []
        if self.settings.prefix_caching:
            block_size = self.engine.replica.config.block_size
            hashes = prompt_block_hashes(
                parsed.prompt_key, parsed.num_prompt_tokens, block_size, parsed.cache_salt
            )
        gen = self.engine.submit(
            parsed.num_prompt_tokens, num_out, stop_reason, arrived_at=arrived_at,
            block_hashes=hashes,
        )  # fmt: skip
        left_s = None if deadline is None else deadline.remaining_s(time.monotonic())
        if left_s is not None:
            left_s *= self.faults.budget_fraction
        try:
            async with asyncio.timeout(left_s):
                if parsed.stream:
                    return await self._stream(request, parsed, gen, tokens, index)
                while not gen.done:
                    await gen.wait()
                return web.json_response(self._full_body(parsed, gen, tokens, index))
        except TimeoutError:
            # The caller's budget (x-headway-budget-ms) ran out: stop, free the sequence
            # (below), and say so, as a gateway that cancels at the deadline does.
            self._deadline_aborts.inc()
            return await self._deadline_exceeded(request)
        finally:
            if not gen.done:
                self.engine.abort(gen)

    async def _deadline_exceeded(self, request: web.Request) -> web.StreamResponse:
        message = f"deadline_exceeded: the {BUDGET_HEADER} budget ran out; the request was aborted"
        return await deadline_exceeded(request.get(_STREAM), message)

    def _check_length(self, parsed: GenerationRequest, num_out: int) -> None:
        limit = self.max_model_len
        if parsed.num_prompt_tokens + num_out > limit:
            param = "messages" if parsed.kind == "chat" else "prompt"
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {parsed.num_prompt_tokens + num_out} tokens "
                f"({parsed.num_prompt_tokens} in the {param}, {num_out} for the completion). "
                f"Please reduce the length of the {param} or the completion.",
                param=param,
                code="context_length_exceeded",
            )

    def _ids(self, parsed: GenerationRequest, index: int) -> tuple[str, str]:
        if parsed.kind == "chat":
            return f"chatcmpl-{index}", "chat.completion"
        return f"cmpl-{index}", "text_completion"

    def _usage(self, gen: Generation) -> dict[str, int]:
        return {
            "prompt_tokens": gen.num_prompt_tokens,
            "completion_tokens": gen.num_emitted,
            "total_tokens": gen.num_prompt_tokens + gen.num_emitted,
        }

    def _full_body(
        self, parsed: GenerationRequest, gen: Generation, tokens: OutputTokens, index: int
    ) -> dict[str, object]:
        rid, obj = self._ids(parsed, index)
        text = "".join(token_text(t) for t in tokens.ids(gen.num_emitted))
        choice: dict[str, object] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": gen.finish_reason,
        }
        if parsed.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            "id": rid, "object": obj, "created": int(time.time()), "model": parsed.model,
            "choices": [choice], "usage": self._usage(gen),
        }  # fmt: skip

    async def _stream(
        self,
        request: web.Request,
        parsed: GenerationRequest,
        gen: Generation,
        tokens: OutputTokens,
        index: int,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        request[_STREAM] = response  # a deadline that passes ends this stream
        rid, obj = self._ids(parsed, index)
        obj += ".chunk" if parsed.kind == "chat" else ""
        head = {"id": rid, "object": obj, "created": int(time.time()), "model": parsed.model}
        head_json = _compact(head)[:-1]  # without the closing brace
        usage_null = ',"usage":null' if parsed.include_usage else ""
        if parsed.kind == "chat":
            role = (
                f'data: {head_json},"choices":[{{"index":0,"delta":{{"role":"assistant",'
                f'"content":""}},"logprobs":null,"finish_reason":null}}]{usage_null}}}\n\n'
            )
            await response.write(role.encode())
            prefix = f'data: {head_json},"choices":[{{"index":0,"delta":{{"content":"'.encode()
            suffix = f'"}},"logprobs":null,"finish_reason":null}}]{usage_null}}}\n\n'.encode()
        else:
            prefix = f'data: {head_json},"choices":[{{"index":0,"text":"'.encode()
            suffix = f'","logprobs":null,"finish_reason":null}}]{usage_null}}}\n\n'.encode()
        sent = 0
        while True:
            await gen.wait()
            upto = gen.num_emitted
            if upto > sent:
                last_is_final = gen.done and gen.finish_reason != "abort"
                plain_upto = upto - 1 if last_is_final else upto
                pieces: list[bytes] = []
                if parsed.continuous_usage:
                    for i, t in enumerate(tokens.take(sent, plain_upto), start=sent + 1):
                        pieces.append(self._chunk(head, parsed, token_text(t), None, gen, i))
                else:
                    pieces.extend(
                        prefix + token_text(t).encode() + suffix
                        for t in tokens.take(sent, plain_upto)
                    )
                if last_is_final:
                    (t,) = tokens.take(upto - 1, upto)
                    pieces.append(
                        self._chunk(head, parsed, token_text(t), gen.finish_reason, gen, upto)
                    )
                sent = upto
                try:
                    await response.write(b"".join(pieces))
                except ConnectionResetError:
                    return response  # the client went away: the caller aborts it
            if gen.done:
                break
        tail = b""
        if parsed.include_usage:
            usage = {**head, "choices": [], "usage": self._usage(gen)}
            tail = f"data: {_compact(usage)}\n\n".encode()
        with contextlib.suppress(ConnectionResetError):
            await response.write(tail + b"data: [DONE]\n\n")
            await response.write_eof()
        return response

    def _chunk(
        self,
        head: dict[str, object],
        parsed: GenerationRequest,
        text: str,
        finish_reason: str | None,
        gen: Generation,
        num_emitted: int,
    ) -> bytes:
        choice: dict[str, object] = {"index": 0}
        if parsed.kind == "chat":
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        body: dict[str, object] = {**head, "choices": [choice]}
        if parsed.continuous_usage:
            body["usage"] = {
                "prompt_tokens": gen.num_prompt_tokens,
                "completion_tokens": num_emitted,
                "total_tokens": gen.num_prompt_tokens + num_emitted,
            }
        elif parsed.include_usage:
            body["usage"] = None
        return f"data: {_compact(body)}\n\n".encode()


def served_names(model: str, extra: Sequence[str]) -> tuple[str, ...]:
    """The names the server answers to: ``extra`` (``--served-model-name``) or the model."""
    return tuple(extra) if extra else (model,)
