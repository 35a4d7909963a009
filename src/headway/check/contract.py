"""The endpoint contract: fixed inputs and what one endpoint answered to them.

A contract holds its inputs (texts, conversations, a prompt, a stop string), so a later
check sends a target exactly what the reference was sent. Each check's record is None
when the endpoint could not give it (``not_available`` says why: a hosted API has no
``/tokenize``), so the comparisons that remain still run. The file is JSON with a
versioned ``format``; it never holds an API key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

from headway.core.errors import ConfigError
from headway.files.output import write_text_atomic

__all__ = [
    "CHECKS",
    "CONTRACT_FORMAT",
    "Contract",
    "Eos",
    "Greedy",
    "Inputs",
    "Logprobs",
    "Message",
    "StopString",
    "Template",
    "Tokenizer",
    "Usage",
    "read_contract",
    "write_contract",
]

CONTRACT_FORMAT: Final = "headway-contract/1"
"""The file format; a reader refuses another."""

CHECKS: Final = (
    "tokenizer",
    "chat_template",
    "greedy_output",
    "eos",
    "stop_strings",
    "logprobs",
    "usage",
)
"""The checks from the boundary inward, in the order of seed 003's troubleshooting table:
token ids in (tokenizer, chat template), token ids out, stopping (EOS, stop strings),
logits, then the accounting built on all of them."""


class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One chat message."""

    role: str
    content: str


DEFAULT_TEXTS: Final = (
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces  ",
    "def add(a, b):\n    return a + b\n",
    "Numbers 0 1 42 3.14159 and 1,000,000",
    "Unicode: café, naïve, Ελληνικά, 日本語, emoji 🙂",
)
"""Plain text, whitespace, code, digits and non-ASCII: where tokenizers disagree first."""

DEFAULT_CONVERSATIONS: Final = (
    (Message("user", "Hello, who are you?"),),
    (
        Message("system", "You answer briefly."),
        Message("user", "What is a queue?"),
        Message("assistant", "A line of waiting work."),
        Message("user", "And a server?"),
    ),
)
"""One turn, and several with a system message: role tags, turn separators, BOS."""

DEFAULT_PROMPT: Final = "The capital of France is"


class Inputs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What every check sends (a reference's inputs are sent to the target)."""

    texts: tuple[str, ...] = DEFAULT_TEXTS
    conversations: tuple[tuple[Message, ...], ...] = DEFAULT_CONVERSATIONS
    prompt: str = DEFAULT_PROMPT
    """The completion prompt of the greedy, EOS and stop-string requests."""
    max_tokens: int = 16
    """Tokens of the greedy request (``ignore_eos``: exactly this many)."""
    eos_max_tokens: int = 48
    """The cap of the EOS request (no ``ignore_eos``: the engine stops where it stops)."""
    stop: str = ""
    """The stop string: a piece of the reference's greedy output ("" until it is chosen)."""


class Tokenizer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``/tokenize`` of each input text."""

    ids: tuple[tuple[int, ...], ...]
    """Per text, without special tokens."""
    special_ids: tuple[int, ...]
    """The first text with special tokens (the BOS, and any other the tokenizer adds)."""


class Template(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``/tokenize`` of each conversation through the chat template (with the generation
    prompt)."""

    ids: tuple[tuple[int, ...], ...]


class Greedy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The greedy completion of the prompt (``temperature: 0``, ``ignore_eos``)."""

    text: str
    finish_reason: str
    ids: tuple[int, ...] | None = None
    """The output token ids (``return_token_ids``, or logprobs ``token_id:N``); None when
    the endpoint returns text only."""
    prompt_ids: tuple[int, ...] | None = None
    """The prompt's token ids as the endpoint tokenized it (``return_token_ids``)."""


class Eos(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The same prompt without ``ignore_eos``, up to ``eos_max_tokens``: where it stops."""

    text: str
    finish_reason: str
    completion_tokens: int | None = None
    ids: tuple[int, ...] | None = None


class StopString(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The greedy request with ``stop: [inputs.stop]``."""

    stop: str
    text: str
    finish_reason: str
    stop_reason: str | int | None = None
    honoured: bool | None = None
    """The text ends where the stop string first appears in this endpoint's greedy output
    (None when it does not appear there)."""


class Logprobs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The greedy tokens' log-probabilities (``logprobs: 1``)."""

    values: tuple[float, ...]

    @property
    def checksum(self) -> float:
        """Their sum: one number to quote."""
        return sum(self.values)


class Usage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The token counts the endpoint reports (``usage``)."""

    prompt_tokens: int | None = None
    """Of the greedy request's prompt."""
    completion_tokens: int | None = None
    """Of the greedy request's output."""
    chat_prompt_tokens: int | None = None
    """Of the first conversation through ``/v1/chat/completions``."""


class Contract(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One endpoint's answers to :class:`Inputs` (see the module docstring)."""

    format: str = CONTRACT_FORMAT
    endpoint: str
    """The base URL (without credentials)."""
    model: str
    engine: str = ""
    """What ``/version`` or the ``Server`` header names ("" when neither does)."""
    written_utc: str = ""
    inputs: Inputs = msgspec.field(default_factory=Inputs)
    tokenizer: Tokenizer | None = None
    chat_template: Template | None = None
    greedy_output: Greedy | None = None
    eos: Eos | None = None
    stop_strings: StopString | None = None
    logprobs: Logprobs | None = None
    usage: Usage | None = None
    not_available: dict[str, str] = msgspec.field(default_factory=dict)
    """Check name → why this endpoint could not give it."""


def write_contract(path: Path, contract: Contract) -> None:
    """Write ``contract`` to ``path`` as indented JSON (atomically)."""
    text = msgspec.json.format(msgspec.json.encode(contract), indent=2).decode()
    write_text_atomic(path, text + "\n")


def read_contract(path: Path) -> Contract:
    """The contract in ``path``; a missing, unreadable or foreign file is a
    :class:`ConfigError` naming it and the fix."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(
            f"--contract {path}: cannot read it ({error.strerror or error}); give a file "
            "that `headway check --target URL --write FILE` wrote",
            path="--contract",
        ) from None
    try:
        head = msgspec.json.decode(data)
    except msgspec.DecodeError as error:
        raise ConfigError(f"--contract {path}: not JSON ({error})", path="--contract") from None
    found = head.get("format") if isinstance(head, dict) else None
    if found != CONTRACT_FORMAT:
        raise ConfigError(
            f"--contract {path}: format is {found!r}, not {CONTRACT_FORMAT!r}; write it "
            "again with this headway (`headway check --target URL --write FILE`)",
            path="--contract",
        )
    try:
        return msgspec.json.decode(data, type=Contract)
    except msgspec.ValidationError as error:
        raise ConfigError(f"--contract {path}: {error}", path="--contract") from None
