"""The emulator's OpenAPI 3.0 document (``GET /openapi.json``): its generation routes.

It describes what :func:`headway.emulate.openai_api.parse_request` accepts, so that a
schema-driven fuzzer (schemathesis) can generate valid requests and break them: the
fields the emulator models, with their types and ranges, and the OpenAI error body that
every 4xx carries. Other fields are accepted and ignored (``additionalProperties``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ERROR_SCHEMA", "chat_schema", "completion_schema", "openapi_document"]

ERROR_SCHEMA: dict[str, object] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}


def _common(models: Sequence[str]) -> dict[str, object]:
    return {
        "model": {"type": "string", "enum": list(models)},
        "max_tokens": {"type": "integer", "minimum": 1, "nullable": True},
        "n": {"type": "integer", "minimum": 1, "maximum": 1, "nullable": True},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": True},
        "seed": {"type": "integer", "nullable": True},
        "stream": {"type": "boolean", "nullable": True},
    }


def _text_part() -> dict[str, object]:
    return {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    }


def _operation(summary: str, schema: dict[str, object]) -> dict[str, object]:
    json_error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {
                "200": {
                    "description": "the completion (JSON), or its chunks (server-sent events)",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                "400": {"description": "a malformed body or field", "content": json_error},
                "404": {"description": "a model this server does not serve", "content": json_error},
                "413": {"description": "a body over the size limit", "content": json_error},
            },
        }
    }


def completion_schema(models: Sequence[str]) -> dict[str, object]:
    """The ``/v1/completions`` body the emulator accepts."""
    return {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            **_common(models),
            "prompt": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "integer", "minimum": 0},
                    },
                ]
            },
            "echo": {"type": "boolean", "enum": [False], "nullable": True},
        },
    }


def chat_schema(models: Sequence[str]) -> dict[str, object]:
    """The ``/v1/chat/completions`` body the emulator accepts."""
    return {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **_common(models),
            "max_completion_tokens": {"type": "integer", "minimum": 1, "nullable": True},
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["role"],
                    "properties": {
                        "role": {
                            "type": "string",
                            "enum": ["system", "user", "assistant", "tool", "developer"],
                        },
                        "content": {
                            "nullable": True,
                            "oneOf": [
                                {"type": "string"},
                                {"type": "array", "items": _text_part()},
                            ],
                        },
                    },
                },
            },
        },
    }


def openapi_document(models: Sequence[str], version: str) -> dict[str, object]:
    """The OpenAPI document of the generation routes for a server serving ``models``."""
    completion = completion_schema(models)
    chat = chat_schema(models)
    return {
        "openapi": "3.0.3",
        "info": {"title": "headway emulate", "version": version},
        "paths": {
            "/v1/completions": _operation("a text completion", completion),
            "/v1/chat/completions": _operation("a chat completion", chat),
        },
        "components": {"schemas": {"Error": ERROR_SCHEMA}},
    }
