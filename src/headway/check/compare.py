"""Compare a target's contract with a reference's: a verdict per check, the first mismatch
in the order of :data:`~headway.check.contract.CHECKS`, and what to inspect next.

The order is seed 003's "from the boundary inward": if token ids differ, inspect the
tokenizer and the chat template; if tokens match but generation does not stop where it
should, EOS and stop rules; if deterministic logits drift, weights, numerical format and
kernels. A later mismatch usually follows from an earlier one (another tokenizer gives
other prompt ids, so other output), so the first is the one to fix first. A check one
side could not give is ``not_available`` (the other checks still run); when it is one that
comes first, the next step of a later mismatch says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from headway.check.contract import (
    CHECKS,
    Contract,
    Eos,
    Greedy,
    Logprobs,
    StopString,
    Template,
    Tokenizer,
    Usage,
)

__all__ = ["NEXT_STEPS", "CheckResult", "Verdict", "compare", "summarize"]

Status = Literal["match", "mismatch", "not_available", "recorded"]

DEFAULT_LOGPROB_TOLERANCE: Final = 1e-3
"""Largest difference of one token's log-probability that still matches (float32 kernels
differ in the last bits between builds; a changed weight moves them far more)."""

NEXT_STEPS: Final = {
    "tokenizer": "inspect the tokenizer: the tokenizer files and revision the server loaded "
    "(--tokenizer, --tokenizer-revision, tokenizer.json), and its special tokens "
    "(add_bos_token, the BOS and EOS ids in tokenizer_config.json)",
    "chat_template": "inspect the chat template: --chat-template or tokenizer_config.json's "
    "chat_template, its role tags and turn separators, injected system text, and the BOS "
    "it adds",
    "greedy_output": "inspect the weights (the same tokens in give other greedy tokens "
    "out): model revision, adapter (LoRA) loading, weight conversion, numerical format "
    "(dtype, quantization), unsupported kernel fallbacks",
    "eos": "inspect EOS and stop rules (the tokens match but generation stops elsewhere): "
    "the eos_token_id of generation_config.json (--generation-config), stop_token_ids, "
    "ignore_eos and min_tokens defaults",
    "stop_strings": "inspect the stop rules: how the server matches stop strings "
    "(include_stop_str_in_output, detokenization of special tokens), or whether it "
    "ignores stop",
    "logprobs": "inspect the numerical format (deterministic logits drift): dtype, "
    "quantization, unsupported kernel fallbacks, adapter loading and weight conversion",
    "usage": "inspect the usage accounting: which tokens the server counts (BOS, template "
    "tokens, the stop token); billing and token budgets built on it differ",
}
"""What to inspect when each check is the first mismatch."""

_UNCHECKED_FIRST: Final = {
    "greedy_output": ("tokenizer", "chat_template"),
    "eos": ("tokenizer", "greedy_output"),
    "stop_strings": ("tokenizer", "greedy_output"),
    "logprobs": ("tokenizer", "greedy_output"),
    "usage": ("tokenizer", "chat_template"),
}
"""The earlier checks whose mismatch would explain a check's: when one of them was not
available, the next step says to inspect it first."""

_IDS_SHOWN: Final = 8
_PROMPT_IDS: Final = "prompt ids"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's verdict."""

    name: str
    status: Status
    detail: str = ""
    """A mismatch: where the answers part; not available: why."""
    next_step: str = ""
    """A mismatch: what to inspect."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Every check's result, in the order of :data:`CHECKS`."""

    results: tuple[CheckResult, ...]

    @property
    def first_mismatch(self) -> CheckResult | None:
        """The first check that differs (None: none did)."""
        return next((r for r in self.results if r.status == "mismatch"), None)


def _ids_text(ids: Sequence[int]) -> str:
    shown = ",".join(map(str, ids[:_IDS_SHOWN]))
    return f"[{shown}{',…' if len(ids) > _IDS_SHOWN else ''}] ({len(ids)} tokens)"


def _first_difference(a: Sequence[int], b: Sequence[int]) -> str:
    """``at token 3: 812 vs 4031`` (or where one list ends)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"at token {i}: {x} vs {y}"
    return f"at token {min(len(a), len(b))}: {len(a)} vs {len(b)} tokens"


def _ids_differ(label: str, target: Sequence[int], reference: Sequence[int]) -> str | None:
    if tuple(target) == tuple(reference):
        return None
    return (
        f"{label}: target {_ids_text(target)} vs reference {_ids_text(reference)}, first "
        f"difference {_first_difference(target, reference)}"
    )


def _snippet(text: str, chars: int = 40) -> str:
    return repr(text if len(text) <= chars else text[:chars] + "…")


def _tokenizer(t: Tokenizer, r: Tokenizer, texts: Sequence[str]) -> str | None:
    for i, (a, b) in enumerate(zip(t.ids, r.ids, strict=False)):
        label = f"text {i + 1} {_snippet(texts[i]) if i < len(texts) else ''}".rstrip()
        found = _ids_differ(label, a, b)
        if found:
            return found
    if len(t.ids) != len(r.ids):
        return f"{len(t.ids)} texts tokenized vs {len(r.ids)}"
    return _ids_differ("with special tokens (BOS)", t.special_ids, r.special_ids)


def _template(t: Template, r: Template) -> str | None:
    for i, (a, b) in enumerate(zip(t.ids, r.ids, strict=False)):
        found = _ids_differ(f"conversation {i + 1}", a, b)
        if found:
            return found
    if len(t.ids) != len(r.ids):
        return f"{len(t.ids)} conversations vs {len(r.ids)}"
    return None


def _greedy(t: Greedy, r: Greedy) -> str | None:
    if t.prompt_ids is not None and r.prompt_ids is not None:
        found = _ids_differ(_PROMPT_IDS, t.prompt_ids, r.prompt_ids)
        if found:
            return found
    if t.ids is not None and r.ids is not None:
        found = _ids_differ("output ids", t.ids, r.ids)
        if found:
            return found
    elif t.text != r.text:  # one side returns text only
        return f"output text {_snippet(t.text)} vs {_snippet(r.text)} (ids not returned)"
    if t.finish_reason != r.finish_reason:
        return f"finish_reason {t.finish_reason!r} vs {r.finish_reason!r}"
    return None


def _eos(t: Eos, r: Eos) -> str | None:
    if t.finish_reason != r.finish_reason or t.completion_tokens != r.completion_tokens:
        return (
            f"finish_reason {t.finish_reason!r} after {t.completion_tokens} tokens vs "
            f"{r.finish_reason!r} after {r.completion_tokens}"
        )
    if t.ids is not None and r.ids is not None:
        return _ids_differ("output ids", t.ids, r.ids)
    if t.text != r.text:
        return f"output text {_snippet(t.text)} vs {_snippet(r.text)}"
    return None


def _stop(t: StopString, r: StopString) -> str | None:
    if t.stop != r.stop:
        return f"stop string {t.stop!r} vs {r.stop!r} (contracts of other inputs)"
    if t.text != r.text or t.finish_reason != r.finish_reason:
        honoured = {True: "honoured", False: "not honoured", None: "not in its output"}
        return (
            f"stop {t.stop!r}: target {_snippet(t.text)} ({t.finish_reason}, "
            f"{honoured[t.honoured]}) vs reference {_snippet(r.text)} ({r.finish_reason}, "
            f"{honoured[r.honoured]})"
        )
    return None


def _logprobs(t: Logprobs, r: Logprobs, tolerance: float) -> str | None:
    if len(t.values) != len(r.values):
        return f"{len(t.values)} log-probabilities vs {len(r.values)}"
    worst, at = 0.0, 0
    for i, (a, b) in enumerate(zip(t.values, r.values, strict=True)):
        if abs(a - b) > worst:
            worst, at = abs(a - b), i
    if worst <= tolerance:
        return None
    return (
        f"checksum {t.checksum:.6f} vs {r.checksum:.6f}; largest difference {worst:.3g} at "
        f"token {at} (tolerance {tolerance:g})"
    )


def _usage(t: Usage, r: Usage) -> str | None:
    parts = [
        f"{name} {a} vs {b}"
        for name, a, b in (
            ("prompt_tokens", t.prompt_tokens, r.prompt_tokens),
            ("completion_tokens", t.completion_tokens, r.completion_tokens),
            ("chat prompt_tokens", t.chat_prompt_tokens, r.chat_prompt_tokens),
        )
        if a is not None and b is not None and a != b
    ]
    return "; ".join(parts) or None


def _records(contract: Contract) -> dict[str, object]:
    """Each check's record (None: not recorded)."""
    c = contract
    return {
        "tokenizer": c.tokenizer,
        "chat_template": c.chat_template,
        "greedy_output": c.greedy_output,
        "eos": c.eos,
        "stop_strings": c.stop_strings,
        "logprobs": c.logprobs,
        "usage": c.usage,
    }


def _difference(t: object, r: object, texts: Sequence[str], tolerance: float) -> str | None:
    """Where two records of one check differ (None: they match)."""
    if isinstance(t, Tokenizer) and isinstance(r, Tokenizer):
        return _tokenizer(t, r, texts)
    if isinstance(t, Template) and isinstance(r, Template):
        return _template(t, r)
    if isinstance(t, Greedy) and isinstance(r, Greedy):
        return _greedy(t, r)
    if isinstance(t, Eos) and isinstance(r, Eos):
        return _eos(t, r)
    if isinstance(t, StopString) and isinstance(r, StopString):
        return _stop(t, r)
    if isinstance(t, Logprobs) and isinstance(r, Logprobs):
        return _logprobs(t, r, tolerance)
    if isinstance(t, Usage) and isinstance(r, Usage):
        return _usage(t, r)
    raise TypeError(f"records of different checks: {type(t).__name__}, {type(r).__name__}")


def _why_missing(name: str, t: object, r: object, target: Contract, reference: Contract) -> str:
    """``target: …; reference: …`` (``both: …`` when the reasons agree)."""
    whys = {
        side: contract.not_available.get(name) or "not recorded"
        for side, contract, record in (("target", target, t), ("reference", reference, r))
        if record is None
    }
    if len(whys) == 2 and len(set(whys.values())) == 1:
        return f"both: {whys['target']}"
    return "; ".join(f"{side}: {why}" for side, why in whys.items())


def _greedy_differs(results: Sequence[CheckResult]) -> bool:
    return any(r.name == "greedy_output" and r.status == "mismatch" for r in results)


def compare(
    target: Contract,
    reference: Contract,
    *,
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE,
) -> Verdict:
    """Every check of ``target`` against ``reference`` (see the module docstring)."""
    targets, references = _records(target), _records(reference)
    results: list[CheckResult] = []
    unavailable: set[str] = set()
    for name in CHECKS:
        t, r = targets[name], references[name]
        if t is None or r is None:
            unavailable.add(name)
            results.append(
                CheckResult(name, "not_available", _why_missing(name, t, r, target, reference))
            )
            continue
        if name == "logprobs" and _greedy_differs(results):
            # Log-probabilities of other tokens: a difference says nothing more.
            why = "not comparable: the greedy tokens differ, so these are of other tokens"
            results.append(CheckResult(name, "not_available", why))
            continue
        detail = _difference(t, r, reference.inputs.texts, logprob_tolerance)
        if detail is None:
            results.append(CheckResult(name, "match"))
            continue
        step = NEXT_STEPS[name]
        if detail.startswith(_PROMPT_IDS):
            step = f"{NEXT_STEPS['tokenizer']} (the prompt's token ids differ)"
        unchecked = [n for n in _UNCHECKED_FIRST.get(name, ()) if n in unavailable]
        if unchecked:
            step = (
                f"{' and '.join(n.replace('_', ' ') for n in unchecked)} could not be "
                f"compared (not available): inspect {'them' if len(unchecked) > 1 else 'it'} "
                f"first, then {step.removeprefix('inspect ')}"
            )
        results.append(CheckResult(name, "mismatch", detail, step))
    return Verdict(tuple(results))


def summarize(contract: Contract) -> Verdict:
    """The checks of one contract, without a reference: recorded or not available."""
    records = _records(contract)
    return Verdict(
        tuple(
            CheckResult(name, "recorded")
            if records[name] is not None
            else CheckResult(name, "not_available", contract.not_available.get(name, ""))
            for name in CHECKS
        )
    )
