"""Send a contract's inputs to an OpenAI-compatible endpoint and record its answers.

The requests, one at a time, in the order of :data:`~headway.check.contract.CHECKS`:

- ``POST /tokenize`` of each text (``add_special_tokens: false``, then the first with
  ``true``) and of each conversation (``messages``, ``add_generation_prompt: true``):
  vLLM's and SGLang's tokenizer endpoint; a hosted API has none (404), and those checks
  are recorded as not available;
- ``POST /v1/completions`` of the prompt, greedy (``temperature: 0``), ``ignore_eos``,
  ``logprobs: 1``, ``return_token_ids`` and ``return_tokens_as_token_ids`` (vLLM's fields
  for the token ids); an endpoint that refuses the extra fields (400) is asked again with
  OpenAI's fields alone, and the ids are then not available;
- the same without ``ignore_eos`` up to ``eos_max_tokens`` (where it stops), and with
  ``stop: [inputs.stop]`` (a piece of the greedy output, chosen here when the inputs have
  none);
- ``POST /v1/chat/completions`` of the first conversation, one token: the template's
  prompt token count, also where ``/tokenize`` is missing.

An endpoint that cannot be reached, or whose ``/v1/models`` refuses, is an
:class:`EndpointError` (exit code 2 at the command line). The API key goes in the
``Authorization`` header only.
"""

from __future__ import annotations

import datetime
import http.client
import re
import ssl
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgspec

from headway.check.contract import (
    Contract,
    Eos,
    Greedy,
    Inputs,
    Logprobs,
    StopString,
    Template,
    Tokenizer,
    Usage,
)
from headway.core.errors import HeadwayError

__all__ = ["EndpointError", "choose_stop", "probe", "public_url"]

_EXTRAS: Final = {"return_token_ids": True, "return_tokens_as_token_ids": True}
"""vLLM's fields beyond OpenAI's (with ``ignore_eos``), sent while the endpoint accepts
them."""
_TOKEN_ID: Final = re.compile(r"token_id:(\d+)")
_WORD: Final = re.compile(r"[A-Za-z0-9]{2,}")
_STOP_CHARS: Final = 3


class EndpointError(HeadwayError):
    """The endpoint cannot be checked at all (unreachable, or not an OpenAI server)."""


def public_url(url: str) -> str:
    """``url`` without credentials, query or fragment: what a contract file records."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


@dataclass(slots=True)
class _Answer:
    status: int
    body: Any
    text: str

    def why(self, what: str) -> str:
        """``POST /tokenize answered HTTP 404: no route ...`` (the error's message, cut)."""
        error = self.body.get("error") if isinstance(self.body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        text = str(message) if message else self.text
        if self.status == 200:
            return f"{what} answered HTTP 200 without the expected fields: {_cut(text)}"
        return f"{what} answered HTTP {self.status}: {_cut(text)}"


def _cut(text: str, chars: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars] + "…"


@dataclass(slots=True)
class _Endpoint:
    """One endpoint over one keep-alive connection."""

    url: str
    api_key: str | None
    timeout_s: float
    flag: str = "--target"
    """The flag that named it, for errors."""
    prefix: str = ""
    conn: http.client.HTTPConnection | None = None
    extras: bool = True
    """The endpoint accepts :data:`_EXTRAS` (until a 400 says otherwise)."""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EndpointError(
                f"{self.flag} {self.url!r} is not an http(s) URL; give one such as "
                "http://127.0.0.1:8000"
            )
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise EndpointError(
                f"{self.flag} {self.url!r} has a bad port; give HOST:PORT"
            ) from None
        if parts.scheme == "https":
            self.conn = http.client.HTTPSConnection(
                parts.hostname, port, timeout=self.timeout_s, context=ssl.create_default_context()
            )
        else:
            self.conn = http.client.HTTPConnection(parts.hostname, port, timeout=self.timeout_s)
        prefix = parts.path.rstrip("/")
        self.prefix = prefix[:-3] if prefix.endswith("/v1") else prefix

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> _Answer:
        """One request; an answer whatever its status (connection failures raise)."""
        assert self.conn is not None
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        payload = None if body is None else msgspec.json.encode(body)
        for attempt in range(2):
            try:
                self.conn.request(method, self.prefix + path, body=payload, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()  # a kept-alive connection the server closed: once more
                if attempt:
                    raise
        text = data.decode("utf-8", "replace")
        try:
            parsed = msgspec.json.decode(data)
        except msgspec.DecodeError:
            parsed = None
        return _Answer(response.status, parsed, text)

    def completion(self, body: dict[str, Any], *, ignore_eos: bool) -> _Answer:
        """``POST /v1/completions`` with :data:`_EXTRAS` (and ``ignore_eos``) while the
        endpoint accepts them."""
        if self.extras:
            extras = {**_EXTRAS, "ignore_eos": True} if ignore_eos else _EXTRAS
            answer = self.call("POST", "/v1/completions", {**body, **extras})
            if answer.status != 400:
                return answer
            self.extras = False
            self.notes.append(
                "the endpoint refused vLLM's fields (ignore_eos, return_token_ids): "
                f"{_cut(answer.text)}; asked again with OpenAI's fields only"
            )
        return self.call("POST", "/v1/completions", body)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _ids(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return tuple(value)
    return None


def _choice(answer: _Answer) -> dict[str, Any] | None:
    body = answer.body
    if answer.status != 200 or not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]


def _usage(answer: _Answer) -> dict[str, Any]:
    usage = answer.body.get("usage") if isinstance(answer.body, dict) else None
    return usage if isinstance(usage, dict) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _output_ids(choice: dict[str, Any]) -> tuple[int, ...] | None:
    """``token_ids`` (vLLM's ``return_token_ids``), else the logprobs' ``token_id:N``."""
    ids = _ids(choice.get("token_ids"))
    if ids is not None:
        return ids
    logprobs = choice.get("logprobs")
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    if not isinstance(tokens, list) or not tokens:
        return None
    found = [_TOKEN_ID.fullmatch(t) if isinstance(t, str) else None for t in tokens]
    if not all(found):
        return None
    return tuple(int(m.group(1)) for m in found if m)


def _logprobs(choice: dict[str, Any]) -> tuple[float, ...] | None:
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list) or not values:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return None
    return tuple(float(v) for v in values)


def choose_stop(text: str) -> str:
    """A stop string from a greedy output: up to three letters or digits of a word, the
    first whose first appearance is a third of the way in or later (else the latest), so
    the stopped text is shorter than the whole and not empty where it can be; "" when the
    text has no word."""
    best, best_at = "", -1
    for match in _WORD.finditer(text):
        piece = match.group()[:_STOP_CHARS]
        at = text.find(piece)
        if at >= len(text) // 3:
            return piece
        if at > best_at:
            best, best_at = piece, at
    return best


def _model(ep: _Endpoint, model: str | None) -> str:
    """The model to check: ``model``, else the first ``/v1/models`` lists."""
    shown = f"{ep.flag} {public_url(ep.url)}"
    try:
        answer = ep.call("GET", "/v1/models")
    except (OSError, http.client.HTTPException) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise EndpointError(
            f"{shown}: cannot reach it ({reason}); is the server up, and is the URL its "
            "base (http://HOST:PORT, with or without /v1)?"
        ) from None
    if answer.status in (401, 403):
        raise EndpointError(
            f"{shown}: /v1/models answered HTTP {answer.status}: pass its key with "
            + (
                "--reference-api-key"
                if ep.flag == "--reference"
                else "--api-key (or $OPENAI_API_KEY)"
            )
        )
    data = answer.body.get("data") if isinstance(answer.body, dict) else None
    if answer.status != 200 or not isinstance(data, list):
        raise EndpointError(
            f"{shown}: /v1/models answered HTTP {answer.status} without a model list "
            f"({_cut(answer.text)!r}); is it an OpenAI-compatible server?"
        )
    ids = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")]
    if model is None:
        if not ids:
            model_flag = "--reference-model" if ep.flag == "--reference" else "--model"
            raise EndpointError(f"{shown}: /v1/models lists no model; pass {model_flag} NAME")
        model = ids[0]
    return model


def _engine(ep: _Endpoint) -> str:
    """``/version``'s engine and version ("" when the endpoint has none)."""
    try:
        answer = ep.call("GET", "/version")
    except (OSError, http.client.HTTPException):
        return ""
    body = answer.body
    if answer.status != 200 or not isinstance(body, dict):
        return ""
    version = str(body.get("version") or "")
    if version and not version.startswith(("vllm", "headway")):
        version = f"vllm {version}"  # vLLM's /version is {"version": "0.11.0"}
    return version


def _tokenizer(ep: _Endpoint, model: str, inputs: Inputs) -> Tokenizer | str:
    ids: list[tuple[int, ...]] = []
    for text in inputs.texts:
        answer = ep.call(
            "POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}
        )
        got = _ids(answer.body.get("tokens")) if isinstance(answer.body, dict) else None
        if answer.status != 200 or got is None:
            return answer.why("POST /tokenize")
        ids.append(got)
    answer = ep.call("POST", "/tokenize", {"model": model, "prompt": inputs.texts[0]})
    special = _ids(answer.body.get("tokens")) if isinstance(answer.body, dict) else None
    if answer.status != 200 or special is None:
        return answer.why("POST /tokenize (add_special_tokens)")
    return Tokenizer(ids=tuple(ids), special_ids=special)


def _template(ep: _Endpoint, model: str, inputs: Inputs) -> Template | str:
    ids: list[tuple[int, ...]] = []
    for conversation in inputs.conversations:
        messages = msgspec.to_builtins(conversation)
        answer = ep.call(
            "POST",
            "/tokenize",
            {"model": model, "messages": messages, "add_generation_prompt": True},
        )
        got = _ids(answer.body.get("tokens")) if isinstance(answer.body, dict) else None
        if answer.status != 200 or got is None:
            return answer.why("POST /tokenize (messages)")
        ids.append(got)
    return Template(ids=tuple(ids))


def probe(
    url: str,
    inputs: Inputs,
    *,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 60.0,
    flag: str = "--target",
) -> tuple[Contract, list[str]]:
    """The contract of the endpoint at ``url`` for ``inputs`` (``inputs.stop`` empty: one
    is chosen from its greedy output), and notes on what it refused; ``flag`` names the
    URL in errors."""
    ep = _Endpoint(url, api_key, timeout_s, flag)
    try:
        return _probe(ep, inputs, model), ep.notes
    except (OSError, http.client.HTTPException) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise EndpointError(
            f"{flag} {public_url(url)} stopped answering during the check ({reason}); is it "
            "still up?"
        ) from None
    finally:
        ep.close()


def _greedy(
    ep: _Endpoint, sampling: dict[str, Any], inputs: Inputs
) -> tuple[Greedy | str, Logprobs | str, dict[str, Any]]:
    """The greedy completion, its log-probabilities (or why not) and its usage."""
    answer = ep.completion(
        {**sampling, "max_tokens": inputs.max_tokens, "logprobs": 1}, ignore_eos=True
    )
    no_logprobs = "the completion carried no token_logprobs"
    if answer.status == 400:  # logprobs refused too
        no_logprobs = answer.why("POST /v1/completions with logprobs")
        ep.notes.append(no_logprobs)
        answer = ep.call("POST", "/v1/completions", {**sampling, "max_tokens": inputs.max_tokens})
    choice = _choice(answer)
    if choice is None:
        why = answer.why("POST /v1/completions")
        return why, why, {}
    greedy = Greedy(
        text=str(choice.get("text") or ""),
        finish_reason=str(choice.get("finish_reason") or ""),
        ids=_output_ids(choice),
        prompt_ids=_ids(choice.get("prompt_token_ids")),
    )
    values = _logprobs(choice)
    logprobs = Logprobs(values) if values is not None else no_logprobs
    return greedy, logprobs, _usage(answer)


def _eos(ep: _Endpoint, sampling: dict[str, Any], inputs: Inputs) -> Eos | str:
    answer = ep.completion({**sampling, "max_tokens": inputs.eos_max_tokens}, ignore_eos=False)
    choice = _choice(answer)
    if choice is None:
        return answer.why("POST /v1/completions (no ignore_eos)")
    return Eos(
        text=str(choice.get("text") or ""),
        finish_reason=str(choice.get("finish_reason") or ""),
        completion_tokens=_int(_usage(answer).get("completion_tokens")),
        ids=_ids(choice.get("token_ids")),
    )


def _stop(
    ep: _Endpoint, sampling: dict[str, Any], inputs: Inputs, stop: str, greedy: Greedy | None
) -> StopString | str:
    if not stop:
        return "the greedy output has no word to stop at"
    body = {**sampling, "max_tokens": inputs.max_tokens, "stop": [stop]}
    answer = ep.completion(body, ignore_eos=True)
    choice = _choice(answer)
    if choice is None:
        return answer.why("POST /v1/completions (stop)")
    text = str(choice.get("text") or "")
    honoured = None
    if greedy is not None and stop in greedy.text:
        honoured = text == greedy.text[: greedy.text.find(stop)]
    reason = choice.get("stop_reason")
    return StopString(
        stop=stop,
        text=text,
        finish_reason=str(choice.get("finish_reason") or ""),
        stop_reason=reason if isinstance(reason, str | int) else None,
        honoured=honoured,
    )


def _chat_prompt_tokens(ep: _Endpoint, model: str, inputs: Inputs) -> int | None:
    """``usage.prompt_tokens`` of the first conversation through the chat endpoint."""
    if not inputs.conversations:
        return None
    messages = msgspec.to_builtins(inputs.conversations[0])
    body = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0}
    answer = ep.call("POST", "/v1/chat/completions", body)
    if answer.status != 200:
        ep.notes.append(answer.why("POST /v1/chat/completions"))
        return None
    return _int(_usage(answer).get("prompt_tokens"))


def _probe(ep: _Endpoint, inputs: Inputs, model_name: str | None) -> Contract:
    model = _model(ep, model_name)
    engine = _engine(ep)
    sampling = {"model": model, "prompt": inputs.prompt, "temperature": 0}
    tokenizer = _tokenizer(ep, model, inputs)
    template = _template(ep, model, inputs)
    greedy, logprobs, usage = _greedy(ep, sampling, inputs)
    eos = _eos(ep, sampling, inputs)
    greedy_record = greedy if isinstance(greedy, Greedy) else None
    stop = inputs.stop or (choose_stop(greedy_record.text) if greedy_record else "")
    stop_record = _stop(ep, sampling, inputs, stop, greedy_record)
    counts = Usage(
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        chat_prompt_tokens=_chat_prompt_tokens(ep, model, inputs),
    )
    records: dict[str, object] = {
        "tokenizer": tokenizer,
        "chat_template": template,
        "greedy_output": greedy,
        "eos": eos,
        "stop_strings": stop_record,
        "logprobs": logprobs,
        "usage": counts if counts != Usage() else "no answer carried usage",
    }
    return Contract(
        endpoint=public_url(ep.url),
        model=model,
        engine=engine,
        written_utc=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        inputs=msgspec.structs.replace(inputs, stop=stop),
        tokenizer=tokenizer if isinstance(tokenizer, Tokenizer) else None,
        chat_template=template if isinstance(template, Template) else None,
        greedy_output=greedy_record,
        eos=eos if isinstance(eos, Eos) else None,
        stop_strings=stop_record if isinstance(stop_record, StopString) else None,
        logprobs=logprobs if isinstance(logprobs, Logprobs) else None,
        usage=counts if counts != Usage() else None,
        not_available={name: why for name, why in records.items() if isinstance(why, str)},
    )
