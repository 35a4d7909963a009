"""What the gateway reads of a generate request, and its 4xx answers.

The hot path decodes only ``model``, ``stream``, ``max_tokens`` and the presence of
``messages``/``prompt`` with a typed msgspec struct (:class:`RequestBody`); the rest of
the body is relayed as received. :func:`parse_request` adds the tenant (the bearer key),
the priority band, the deadline, the retry ticket and the pinned revision from the
headers into a :class:`ParsedRequest`; a client's mistake raises :class:`ClientError`,
answered 4xx with an OpenAI-shaped body. Parsing is a function of the config, the
controller and the aiohttp request, so it reads (and tests) apart from the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgspec
from aiohttp import web

from headway.core.policy.queues import BANDS, Band
from headway.gateway.guards import error_response, parse_whole

if TYPE_CHECKING:
    from headway.core.policy.deadlines import DeadlinePolicy
    from headway.gateway.config import GatewayFileConfig, TenantConfig
    from headway.gateway.control import Controller

__all__ = [
    "ANONYMOUS",
    "DEADLINE_HEADER",
    "OPTIONAL_HEADERS",
    "PRIORITY_HEADER",
    "REVISION_HEADER",
    "TICKET_HEADER",
    "ClientError",
    "ParsedRequest",
    "RequestBody",
    "bearer",
    "parse_request",
    "tenant_of",
    "with_model",
]

PRIORITY_HEADER: Final = "x-headway-priority"
DEADLINE_HEADER: Final = "x-headway-deadline-ms"
TICKET_HEADER: Final = "x-headway-retry-ticket"
REVISION_HEADER: Final = "x-headway-revision"
OPTIONAL_HEADERS: Final = ("x-headway-optional", "x-headway-speculative")
"""``true`` marks a request optional (or a speculative attempt): a degraded mode with
``shed_optional`` sheds it (``degraded_optional``)."""
ANONYMOUS: Final = "anonymous"


class RequestBody(msgspec.Struct, kw_only=True):
    """What the gateway reads of a request body (unknown fields are relayed untouched)."""

    model: str
    stream: bool | None = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    messages: msgspec.Raw = msgspec.Raw(b"")
    prompt: msgspec.Raw = msgspec.Raw(b"")
    cache_salt: msgspec.Raw = msgspec.Raw(b"")


_BODY = msgspec.json.Decoder(RequestBody)


class ClientError(Exception):
    """A client's mistake: answered 4xx with an OpenAI-shaped body."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def response(self) -> web.Response:
        return error_response(self.status, str(self), param=self.param, code=self.code)


@dataclass(slots=True)
class ParsedRequest:
    """A generate request as admission and the relay see it: who, what, how urgent."""

    tenant: TenantConfig | None
    tenant_name: str
    body: RequestBody
    raw: bytes
    band: Band
    deadline_s: float | None
    ticket: int | None
    revision: str | None = None
    optional: bool = False
    """Marked optional or speculative (:data:`OPTIONAL_HEADERS`)."""


def bearer(request: web.Request) -> str | None:
    """The key of ``Authorization: Bearer KEY``, else None."""
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else None


def tenant_of(config: GatewayFileConfig, request: web.Request) -> tuple[TenantConfig | None, str]:
    """The tenant of the request's bearer key (none, ``anonymous``, when the config has no
    tenants); a missing or unknown key is a 401."""
    tenants = config.tenants
    auth = request.headers.get("Authorization", "")
    if not tenants:
        return None, ANONYMOUS
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    tenant = tenants.get(key) if key else None  # no key never finds a tenant
    if tenant is None:
        raise ClientError(
            401,
            "Incorrect or missing API key: send `Authorization: Bearer KEY` with a key "
            "from the gateway's tenants",
            code="invalid_api_key",
        )
    return tenant, tenant.name


def parse_request(
    config: GatewayFileConfig,
    controller: Controller,
    deadlines: DeadlinePolicy,
    request: web.Request,
    raw: bytes,
    kind: str,
) -> ParsedRequest:
    """The request of body ``raw`` (``kind`` ``chat`` or ``completion``), checked against
    the config: a :class:`ClientError` names the first field or header at fault."""
    tenant, name = tenant_of(config, request)
    try:
        body = _BODY.decode(raw)
    except msgspec.ValidationError as error:
        text = str(error)
        param = text.split("`$.", 1)[1].split("`", 1)[0] if "`$." in text else None
        if param is None and text.startswith("Object missing required field `"):
            param = text.split("`", 2)[1]
        where = f"`{param}`: " if param else ""
        raise ClientError(
            400, f"invalid request body: {where}{text}; fix that field", param=param
        ) from None
    except msgspec.DecodeError as error:
        hint = "; lone UTF-16 surrogates (\\ud800-\\udfff) are refused" if b"\\u" in raw else ""
        raise ClientError(400, f"the request body is not JSON: {error}{hint}") from None
    except RecursionError:
        raise ClientError(400, "the request body is nested too deeply to read") from None
    if body.cache_salt and config.tenants and config.tenant_cache_salt:
        raise ClientError(
            400,
            "`cache_salt` is set by the gateway for each tenant; remove it from the body",
            param="cache_salt",
            code="invalid_value",
        )
    needed = "messages" if kind == "chat" else "prompt"
    if not getattr(body, needed) or bytes(getattr(body, needed)) == b"null":
        raise ClientError(400, f"`{needed}` is required", param=needed)
    for field_name in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, field_name)
        if value is not None and value < 1:
            raise ClientError(
                400,
                f"`{field_name}` must be an integer >= 1 (got {value}); or omit it",
                param=field_name,
            )
    if config.models and body.model not in config.models:
        raise ClientError(
            404,
            f"The model `{body.model}` does not exist; use one of {', '.join(config.models)}",
            param="model",
            code="model_not_found",
        )
    headers = request.headers
    band: Band = tenant.default_priority if tenant else "interactive"
    asked = headers.get(PRIORITY_HEADER)
    if asked is not None:
        if asked not in BANDS:
            raise ClientError(
                400, f"{PRIORITY_HEADER} must be one of {', '.join(BANDS)} (got {asked!r})",
                param=PRIORITY_HEADER,
            )  # fmt: skip
        band = asked
    if tenant is not None and BANDS.index(band) < BANDS.index(tenant.max_priority):
        band = tenant.max_priority
    now = controller.now()
    budget_s: float | None = None
    deadline_text = headers.get(DEADLINE_HEADER)
    if deadline_text is not None:
        budget_ms = parse_whole(deadline_text)
        if budget_ms == 0:
            raise ClientError(
                400,
                f"{DEADLINE_HEADER} 0 leaves no time to serve anything; send the client's "
                "remaining budget in whole milliseconds >= 1, or omit it",
                param=DEADLINE_HEADER,
            )
        if budget_ms is None:
            raise ClientError(
                400,
                f"{DEADLINE_HEADER} must be whole milliseconds >= 0, at most 18 digits "
                f"(got {deadline_text[:40]!r})",
                param=DEADLINE_HEADER,
            )
        budget_s = budget_ms / 1000.0
    deadline = deadlines.assign(now, budget_s)
    ticket_text = headers.get(TICKET_HEADER)
    ticket = parse_whole(ticket_text) if ticket_text else None  # garbage: no ticket
    revision = headers.get(REVISION_HEADER)
    if revision is not None:
        known = {u.revision for u in controller.source.upstreams() if u.revision}
        if revision not in known:
            raise ClientError(
                400,
                f"{REVISION_HEADER}: no upstream serves revision {revision[:64]!r}; "
                f"use one of {', '.join(sorted(known)) or '(none declared)'} or omit it",
                param=REVISION_HEADER,
            )
    optional = False
    for header in OPTIONAL_HEADERS:
        flag_text = headers.get(header)
        if flag_text is None:
            continue
        flag = flag_text.strip().lower()
        if flag not in ("true", "false"):
            raise ClientError(
                400,
                f"{header} must be true or false (got {flag_text[:40]!r}); send "
                f"`{header}: true` to mark the request optional, or omit it",
                param=header,
            )
        optional = optional or flag == "true"
    return ParsedRequest(
        tenant, name, body, raw, band, None if deadline is None else deadline.deadline_s,
        ticket, revision, optional,
    )  # fmt: skip


def with_model(raw: bytes, model: str) -> bytes:
    """The body with its ``model`` replaced (a fallback route; the rare path re-encodes)."""
    data = msgspec.json.decode(raw)
    data["model"] = model
    return msgspec.json.encode(data)
