"""The OpenAI wire format: read a completion or chat request, write its responses.

A client mistake is an :class:`ApiError` (400, or 404 for an unknown model) whose
OpenAI-style body names the field, the value found and the fix; the server never answers
5xx for one. Fields the emulator does not model (``stop``, ``top_p``, ``logit_bias``,
...) are accepted and ignored, as vLLM ignores unknown fields.

Output length: ``max_tokens`` (or ``max_completion_tokens``) tokens exactly; the emulator
never ends a sequence early when it is given, as if ``ignore_eos`` were always true
(``finish_reason: length``). Without it, the length is drawn from the prompt and seed,
uniformly in ``1 .. 2 × default_max_tokens − 1`` (``finish_reason: stop``, the emulated
end of sequence).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from headway.emulate.tokens import (
    CHAT_MESSAGE_OVERHEAD_TOKENS,
    CHAT_REPLY_PRIMING_TOKENS,
    estimate_text_tokens,
)
from headway.http_errors import error_body

__all__ = ["ApiError", "GenerationRequest", "error_body", "parse_request"]

Kind = Literal["completion", "chat"]
_ROLES = ("system", "user", "assistant", "tool", "developer", "function")


class ApiError(Exception):
    """A request the emulator refuses: an HTTP status and an OpenAI-style error body."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, dict[str, str | None]]:
        """``{"error": {...}}`` as OpenAI writes it."""
        return error_body(self.message, self.status, param=self.param, code=self.code)


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """A validated ``/v1/completions`` or ``/v1/chat/completions`` request."""

    kind: Kind
    model: str
    num_prompt_tokens: int
    prompt_key: object
    """What identifies the prompt for the deterministic output tokens."""
    max_tokens: int | None
    """Tokens to generate, or ``None`` for the emulated end of sequence."""
    stream: bool
    include_usage: bool
    """``stream_options.include_usage``: a last chunk with ``usage``."""
    continuous_usage: bool
    """``stream_options.continuous_usage_stats`` (vLLM): ``usage`` in every chunk."""
    greedy: bool
    """``temperature == 0``: the output depends on the prompt only (the fingerprint)."""
    seed: int | None
    cache_salt: str | None = None
    """vLLM's ``cache_salt``: prompts with different salts share no prefix-cache blocks."""

    def output_tokens(self, default_max_tokens: int, request_index: int) -> tuple[int, str]:
        """``(tokens to generate, finish reason)``; see the module docstring."""
        if self.max_tokens is not None:
            return self.max_tokens, "length"
        key: tuple[object, int | None] = (
            self.prompt_key,
            None if self.greedy else self.seed if self.seed is not None else request_index,
        )
        digest = hashlib.blake2b(repr(key).encode("utf-8"), digest_size=8).digest()
        span = max(1, 2 * default_max_tokens - 1)
        return 1 + int.from_bytes(digest, "big") % span, "stop"


def _describe(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_error(param: str, value: object, expected: str, fix: str) -> ApiError:
    return ApiError(
        400,
        f"`{param}` must be {expected} (got {_describe(value)}); {fix}",
        param=param,
        code="invalid_type" if not isinstance(value, int | float) else "invalid_value",
    )


def _optional_int(body: Mapping[str, object], param: str, *, minimum: int, fix: str) -> int | None:
    value = body.get(param)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _type_error(param, value, f"an integer >= {minimum}", fix)
    return value


def _optional_bool(body: Mapping[str, object], param: str) -> bool:
    value = body.get(param, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _type_error(param, value, "true or false", "send a JSON boolean")
    return value


def _temperature(body: Mapping[str, object]) -> float:
    value = body.get("temperature")
    if value is None:
        return 1.0
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (0 <= value <= 2 and math.isfinite(value))
    ):
        raise _type_error("temperature", value, "a number in [0, 2]", "0 is greedy decoding")
    return float(value)


def _prompt_tokens_of_ids(
    ids: Sequence[object], param: str, vocab_size: int | None
) -> tuple[int, tuple[int, ...]]:
    if not ids:
        raise ApiError(400, f"`{param}` is empty; send at least one token", param=param)
    top = vocab_size if vocab_size is not None else 2**63
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < top:
            below = f" below the vocabulary size {vocab_size}" if vocab_size is not None else ""
            raise _type_error(
                f"{param}[{i}]", token, f"a token id (an integer >= 0{below})",
                "send text or token ids of this model",
            )  # fmt: skip
    return len(ids), tuple(ids)  # type: ignore[arg-type]


def _completion_prompt(body: Mapping[str, object], vocab_size: int | None) -> tuple[int, object]:
    if "prompt" not in body:
        raise ApiError(
            400,
            "`prompt` is required: send the text to complete (a string) or its token ids",
            param="prompt",
            code="missing_required_parameter",
        )
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return estimate_text_tokens(prompt), ("text", prompt)
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, str | list) for p in prompt):
            raise ApiError(
                400,
                f"`prompt` holds {len(prompt)} prompts; the emulator serves one prompt per "
                "request: send them as separate requests",
                param="prompt",
                code="invalid_value",
            )
        n, ids = _prompt_tokens_of_ids(prompt, "prompt", vocab_size)
        return n, ("ids", ids)
    raise _type_error(
        "prompt", prompt, "a string or a list of token ids", "send the text to complete"
    )


def _chat_prompt(body: Mapping[str, object]) -> tuple[int, object]:
    if "messages" not in body:
        raise ApiError(
            400,
            '`messages` is required: send a list such as [{"role": "user", "content": "Hi"}]',
            param="messages",
            code="missing_required_parameter",
        )
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise _type_error(
            "messages", messages, "a non-empty list of messages",
            'e.g. [{"role": "user", "content": "Hi"}]',
        )  # fmt: skip
    tokens = CHAT_REPLY_PRIMING_TOKENS
    key: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _type_error(where, message, "an object with `role` and `content`",
                              'e.g. {"role": "user", "content": "Hi"}')  # fmt: skip
        role = message.get("role")
        if role not in _ROLES:
            raise ApiError(
                400,
                f"`{where}.role` must be one of {', '.join(_ROLES)} (got {_describe(role)})",
                param=f"{where}.role",
                code="invalid_value",
            )
        text = _content_text(message.get("content"), f"{where}.content")
        tokens += CHAT_MESSAGE_OVERHEAD_TOKENS + (estimate_text_tokens(text) if text else 0)
        key.append((str(role), text))
    return tokens, ("chat", tuple(key))


def _content_text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ApiError(
                    400,
                    f'`{where}[{j}]` must be a text part {{"type": "text", "text": ...}} '
                    f"(got {_describe(part)}); the emulator reads text only",
                    param=f"{where}[{j}]",
                    code="invalid_value",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise _type_error(f"{where}[{j}].text", text, "a string", "send the text")
            parts.append(text)
        return "\n".join(parts)
    raise _type_error(where, content, "a string or a list of text parts", "send the text")


def parse_request(
    kind: Kind, raw: bytes, served_models: Sequence[str], vocab_size: int | None = None
) -> GenerationRequest:
    """Validate a request body (token ids must be below ``vocab_size``, as vLLM checks).

    Raises:
        ApiError: 400 for a malformed body or field, 404 for a model not served.
    """
    try:
        # Decoded strictly first: json.loads of bytes decodes with "surrogatepass", so a
        # UTF-8-encoded lone surrogate (b"\xed\xa0\x80", not UTF-8) would pass.
        body = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(
            400,
            f"the request body is not valid JSON ({error}); send a JSON object with "
            "Content-Type: application/json",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise ApiError(
            400,
            "the request body is nested too deeply to read; send a JSON object of "
            "the documented shape",
            code="invalid_json",
        ) from None
    except ValueError as error:  # an integer literal of thousands of digits
        raise ApiError(
            400, f"the request body holds a number too large to read ({error})", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ApiError(
            400,
            f"the request body must be a JSON object (got {_describe(body)})",
            code="invalid_json",
        )
    model = body.get("model")
    if model is None:
        raise ApiError(
            400,
            f"`model` is required; this server serves {_describe(served_models[0])}",
            param="model",
            code="missing_required_parameter",
        )
    if not isinstance(model, str):
        raise _type_error("model", model, "a string", f"use {_describe(served_models[0])}")
    if model not in served_models:
        raise ApiError(
            404,
            f"The model {_describe(model)} does not exist. This server serves "
            f"{', '.join(_describe(m) for m in served_models)}; set `model` to it "
            "(GET /v1/models lists them)",
            param="model",
            code="model_not_found",
        )
    fix = "set the number of tokens to generate, or omit it"
    if kind == "completion":
        num_prompt_tokens, prompt_key = _completion_prompt(body, vocab_size)
        max_tokens = _optional_int(body, "max_tokens", minimum=1, fix=fix)
        if _optional_bool(body, "echo"):
            raise ApiError(400, "`echo: true` is not emulated; omit it", param="echo")
    else:
        num_prompt_tokens, prompt_key = _chat_prompt(body)
        max_tokens = _optional_int(body, "max_completion_tokens", minimum=1, fix=fix)
        if max_tokens is None:
            max_tokens = _optional_int(body, "max_tokens", minimum=1, fix=fix)
    n = _optional_int(body, "n", minimum=1, fix="use 1")
    if n is not None and n != 1:
        raise ApiError(
            400, f"`n` must be 1 (got {n}); send {n} requests instead", param="n",
            code="invalid_value",
        )  # fmt: skip
    stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not isinstance(options, dict):
            raise _type_error("stream_options", options, "an object",
                              'e.g. {"include_usage": true}')  # fmt: skip
        if not stream:
            raise ApiError(
                400,
                "`stream_options` is only allowed with `stream: true`; set stream or drop it",
                param="stream_options",
                code="invalid_value",
            )
        include_usage = _optional_bool(options, "include_usage")
        continuous = _optional_bool(options, "continuous_usage_stats")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _type_error("seed", seed, "an integer", "omit it for a random seed")
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and not (isinstance(cache_salt, str) and cache_salt):
        raise _type_error(
            "cache_salt", cache_salt, "a non-empty string", "omit it to share the prefix cache"
        )
    return GenerationRequest(
        kind=kind,
        model=model,
        num_prompt_tokens=num_prompt_tokens,
        prompt_key=prompt_key,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        greedy=_temperature(body) == 0.0,
        seed=seed,
        cache_salt=cache_salt,
    )
