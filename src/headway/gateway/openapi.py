"""The gateway's OpenAPI 3.0 document (``GET /openapi.json``).

The generation bodies are the emulator's (:mod:`headway.emulate.openapi`, imported, not
copied): the gateway relays them and the engine checks what the gateway does not read.
Added here: the bearer key, the ``x-headway-*`` headers, the statuses the gateway itself
answers (401, 413, 429 and 503 refusals, 502 when the upstream failed), and the
operational and admin routes. A schema-driven fuzzer (schemathesis) runs against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headway import __version__
from headway.core.policy.queues import BANDS
from headway.emulate.openapi import ERROR_SCHEMA, chat_schema, completion_schema

__all__ = ["openapi_document"]

_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


def _errors(*statuses: tuple[str, str]) -> dict[str, Any]:
    """Error responses by status, each with the OpenAI error body."""
    return {status: {"description": text, "content": _ERROR_REF} for status, text in statuses}


_HEADERS: list[dict[str, object]] = [
    {
        "name": "x-headway-priority",
        "in": "header",
        "required": False,
        "description": "the band; lowered to the tenant's max_priority",
        "schema": {"type": "string", "enum": list(BANDS)},
    },
    {
        "name": "x-headway-deadline-ms",
        "in": "header",
        "required": False,
        "description": "the request's budget in whole milliseconds (clamped to max_deadline_s)",
        "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
    },
    {
        "name": "x-headway-retry-ticket",
        "in": "header",
        "required": False,
        "description": "the ticket of the refusal this request retries (garbage is ignored)",
        "schema": {"type": "string"},
    },
]
_HEADERS += [
    {
        "name": name,
        "in": "header",
        "required": False,
        "description": "true marks the request optional (or speculative): a degraded mode "
        "with shed_optional sheds it (503 degraded_optional)",
        "schema": {"type": "string", "enum": ["true", "false"]},
    }
    for name in ("x-headway-optional", "x-headway-speculative")
]

_DEGRADED_HEADER: dict[str, object] = {
    "x-headway-degraded": {
        "description": "on an answer a degraded mode changed: the mode and what changed, "
        "e.g. `brief; max_tokens=256 (asked 1024)` or `brief; shed optional`",
        "schema": {"type": "string"},
    }
}


def _generation(summary: str, body: dict[str, object]) -> dict[str, object]:
    responses: dict[str, Any] = {
        "200": {
            "description": "the engine's answer (JSON), or its chunks (server-sent events)",
            "headers": _DEGRADED_HEADER,
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        },
        "202": {
            "description": "deferred (a band in receipts.deferrable, past its limits): a "
            "receipt, fetched at its Location (GET /v1/receipts/{id})",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
    }
    responses.update(
        _errors(
            ("400", "a malformed body, field or header (or a request that never fits)"),
            ("401", "an unknown or missing API key"),
            ("404", "a model the gateway does not route"),
            ("413", "a body over the size limit"),
            ("429", "refused: a queue's or the tenant's limit (Retry-After)"),
            ("502", "the upstream failed and no retry was possible"),
            (
                "503",
                "refused: capacity, deadline, no upstream, draining, or optional under "
                "a degraded mode (degraded_optional) (Retry-After)",
            ),
            ("504", "the request's deadline passed while an engine served it (cancelled there)"),
        )
    )
    return {
        "post": {
            "summary": summary,
            "security": [{"tenantKey": []}],
            "parameters": _HEADERS,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": responses,
        }
    }


def _get(summary: str, content: dict[str, object], *errors: tuple[str, str]) -> dict[str, object]:
    return {
        "get": {
            "summary": summary,
            "responses": {"200": {"description": summary, "content": content}, **_errors(*errors)},
        }
    }


def _admin(method: str, summary: str, body: dict[str, object] | None) -> dict[str, object]:
    operation: dict[str, object] = {
        "summary": summary,
        "security": [{"adminToken": []}],
        "responses": {
            "200": {"description": summary, "content": {"application/json": {"schema": {}}}},
            **_errors(
                ("400", "a malformed body (or config file, on reload)"),
                ("401", "a wrong or missing admin token (a tenant key is refused)"),
                ("403", "the admin API is off (admin_token unset)"),
                ("404", "no such upstream (or degraded mode)"),
                ("409", "the gateway was not started from a config file"),
            ),
        },
    }
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return {method: operation}


def _model_field(schema: dict[str, object], models: Sequence[str]) -> dict[str, object]:
    """``schema`` without ``cache_salt`` (the gateway sets it) and, with no model list, any
    model name (the engine decides)."""
    properties = dict(schema["properties"])  # type: ignore[call-overload]
    properties.pop("cache_salt", None)
    if not models:
        properties["model"] = {"type": "string"}
    return {**schema, "properties": properties}


def openapi_document(models: Sequence[str]) -> dict[str, object]:
    """The document for a gateway whose config lists ``models`` (empty: any)."""
    names = list(models) or ["llama-3-8b"]
    text: dict[str, object] = {"text/plain": {"schema": {"type": "string"}}}
    json_object: dict[str, object] = {"application/json": {"schema": {"type": "object"}}}
    drain: dict[str, object] = {
        "type": "object",
        "required": ["upstream"],
        "properties": {"upstream": {"type": "string"}, "drain": {"type": "boolean"}},
    }
    forced: dict[str, object] = {
        "type": "object",
        "required": ["state"],
        "properties": {"state": {"type": "string", "enum": ["on", "off", "auto"]}},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "headway gateway", "version": __version__},
        "paths": {
            "/v1/completions": _generation(
                "a text completion, relayed", _model_field(completion_schema(names), models)
            ),
            "/v1/chat/completions": _generation(
                "a chat completion, relayed", _model_field(chat_schema(names), models)
            ),
            "/v1/models": {
                "get": {
                    "summary": "the models clients may send",
                    "security": [{"tenantKey": []}],
                    "responses": _errors(
                        ("401", "an unknown API key"), ("503", "no upstream answers")
                    )
                    | {"200": {"description": "the model list", "content": json_object}},
                }
            },
            "/v1/receipts/{receipt_id}": {
                "get": {
                    "summary": "a receipt: status queued, in_progress, completed, failed or "
                    "expired; the completion in response",
                    "security": [{"tenantKey": []}],
                    "parameters": [
                        {
                            "name": "receipt_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": _errors(
                        ("401", "an unknown API key"),
                        ("404", "no such receipt for this key (or another tenant's)"),
                    )
                    | {"200": {"description": "the receipt", "content": json_object}},
                }
            },
            "/health": _get(
                "ready when an upstream is routable", json_object, ("503", "none is (or draining)")
            ),
            "/metrics": _get(
                "Prometheus metrics",
                text,
                ("401", "a wrong or missing metrics token (with metrics_token)"),
                ("403", "a tenant's API key"),
            ),
            "/openapi.json": _get("this document", json_object),
            "/admin/drain": _admin("post", "stop or resume routing to an upstream", drain),
            "/admin/reload": _admin("post", "re-read the config file", None),
            "/admin/state": _admin("get", "upstreams, running slots, queued requests", None),
            "/admin/degraded": _admin("get", "each degraded mode's state", None),
            "/admin/degraded/{mode}": {
                "parameters": [
                    {"name": "mode", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                **_admin("post", "force a degraded mode on or off, or back to auto", forced),
            },
        },
        "components": {
            "schemas": {"Error": ERROR_SCHEMA},
            "securitySchemes": {
                "tenantKey": {"type": "http", "scheme": "bearer"},
                "adminToken": {"type": "http", "scheme": "bearer"},
            },
        },
    }
