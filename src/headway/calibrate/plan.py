"""The probe design of ``headway calibrate``: which request shapes to send, in what order.

Three kinds of probe, run one at a time on an otherwise idle endpoint:

- **prefill probes**: one request alone, for each prompt length. Its time to first token
  is one engine step of the whole prompt (or ``ceil(P / budget)`` chunked steps), so TTFT
  across prompt lengths separates the per-token and per-pair costs. The rest of its
  stream gives decode steps of one sequence at long contexts.
- **decode probes**: ``B`` requests sent together, for each concurrency and prompt length.
  Once all have their first token and until the first ends, every step decodes exactly
  these ``B`` sequences, so the mean inter-token gap measures a decode step of ``B``
  sequences reading ``Σ context`` KV tokens.
- **shared probes**: a decode probe whose ``B`` prompts share a prefix that one request
  just before them left in the prefix cache, so that the batch's sequences read the same
  KV blocks: ``per_decode_shared_kv_token_s``, what a second read of a block costs. On a
  CPU vLLM 8 sequences on one 1,024-token prefix decoded in 35.8 ms a step against 50.9
  for 8 distinct prompts.

A noisy host changes speed over minutes, so the grid runs in ``rounds``: each round runs
every shape once, prefill and decode probes interleaved (the order reversed every other
round), so that a slow spell hits every kind of probe alike and shows as a spread between
rounds, which the fit's confidence intervals see. A **reference** decode probe opens every
round and closes the run: how much its step time moved is the drift check.

Prompts are token-id lists (``/v1/completions`` accepts them), so their length is exact,
and each starts with a unique token so that no prefix-cache hit shortens a prefill (a
shared probe's prefix is its own, drawn afresh for each run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import zip_longest

__all__ = [
    "DEFAULT_PLAN",
    "SHARED_ALIGN_TOKENS",
    "SHARED_SUFFIX_TOKENS",
    "ProbePlan",
    "ProbeShape",
]

SHARED_ALIGN_TOKENS = 256
"""A shared probe's prefix is a multiple of this: whole blocks of 16, 32, 64, 128 or 256
tokens (vLLM's GPU default is 16, its CPU build's 128), so that the engine caches all of
it and the fit counts what the engine shares."""

SHARED_SUFFIX_TOKENS = 32
"""Tokens of a shared probe's prompt after the prefix, its own."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeShape:
    """One probe: ``concurrency`` identical requests sent at once."""

    kind: str
    """``prefill``, ``decode``, ``shared`` or ``reference`` (the decode probe of the drift
    check)."""
    prompt_tokens: int
    concurrency: int
    output_tokens: int
    round: int = 0
    """Which round of the grid it belongs to (the closing reference: ``rounds``)."""
    shared_prefix_tokens: int = 0
    """A shared probe's prefix, common to its prompts and cached before they are sent (of
    ``prompt_tokens``)."""

    @property
    def key(self) -> tuple[str, int, int, int]:
        """The shape without its round: probes with one key repeat one measurement."""
        return (self.kind, self.prompt_tokens, self.concurrency, self.output_tokens)

    @property
    def shared_kv_tokens(self) -> int:
        """KV tokens each decode step of this probe reads in blocks another of its
        sequences also holds: its prefix, for every sequence but the first
        (:attr:`BatchShape.decode_shared_kv_tokens`)."""
        return (self.concurrency - 1) * self.shared_prefix_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbePlan:
    """The grid of probes (prompt lengths × concurrency × output lengths)."""

    prefill_prompt_tokens: tuple[int, ...] = (
        64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768,
    )  # fmt: skip
    """Prompt lengths of the prefill probes. Long prompts pin the attention (per-pair)
    cost, a short one the per-request cost; those longer than the endpoint's
    ``max_model_len`` takes (with ``prefill_output_tokens`` more) are probed once, at the
    longest it takes (at least 3 distinct lengths must remain)."""
    prefill_output_tokens: int = 25
    """Tokens each prefill probe generates (its gaps are 1-sequence decode steps)."""
    rounds: int = 3
    """Times the whole grid runs, interleaved; the spread between rounds is what the
    confidence intervals measure."""
    decode_concurrency: tuple[int, ...] = (2, 8, 32)
    """Batch sizes of the decode probes."""
    decode_prompt_tokens: tuple[int, ...] = (128, 2048)
    """Context lengths of the decode probes. A length the endpoint's ``max_model_len``
    cannot take with ``decode_output_tokens`` more is probed at the longest it takes: the
    fit needs two distinct contexts to tell the cost of reading the KV cache from the
    cost of a sequence (:meth:`unidentified`)."""
    decode_output_tokens: int = 33
    """Tokens each decode probe request generates, at least: a batch whose prompts take
    many steps to prefill generates more (:meth:`decode_output_for`)."""
    max_num_batched_tokens: int = 8192
    """The engine's step token budget (vLLM ``--max-num-batched-tokens``): a longer
    prompt is prefilled in ``ceil(P / budget)`` steps, each with the fixed overhead."""
    segment_steps: int = 8
    """Decode steps averaged into one gap sample (the mean over a run of steps is
    ``(t_end - t_start) / steps``: lateness inside the run cancels out)."""
    shared_prefix_tokens: int = 1024
    """The shared probe's common prefix (0: no shared probe, and the profile's
    ``shared_kv_read_ratio`` stays 1: a shared read costs what another does).
    A multiple of :data:`SHARED_ALIGN_TOKENS`, so that it fills whole KV blocks of any
    common block size; where ``max_model_len`` cannot take it, the longest such prefix
    that fits."""
    shared_concurrency: int = 8
    """Requests of the shared probe."""

    def __post_init__(self) -> None:
        checks = (
            ("prefill_prompt_tokens", all(p >= 1 for p in self.prefill_prompt_tokens)),
            ("prefill_output_tokens", self.prefill_output_tokens >= 2),
            ("rounds", self.rounds >= 1),
            ("decode_concurrency", all(b >= 1 for b in self.decode_concurrency)),
            ("decode_prompt_tokens", all(p >= 1 for p in self.decode_prompt_tokens)),
            ("decode_output_tokens", self.decode_output_tokens >= 2),
            ("max_num_batched_tokens", self.max_num_batched_tokens >= 1),
            ("segment_steps", self.segment_steps >= 1),
            ("shared_concurrency", self.shared_concurrency >= 2),
        )
        for name, ok in checks:
            if not ok:
                raise ValueError(f"ProbePlan.{name} is out of range ({getattr(self, name)})")
        if self.shared_prefix_tokens % SHARED_ALIGN_TOKENS or self.shared_prefix_tokens < 0:
            raise ValueError(
                f"ProbePlan.shared_prefix_tokens must be 0 or a multiple of "
                f"{SHARED_ALIGN_TOKENS} (got {self.shared_prefix_tokens}): the prefix must "
                "fill whole KV blocks; e.g. --shared-prefix-tokens 1024, or 0 for no shared probe"
            )
        if not self.prefill_prompt_tokens or len(set(self.prefill_prompt_tokens)) < 3:
            raise ValueError(
                "ProbePlan.prefill_prompt_tokens needs at least 3 distinct lengths to separate "
                f"the per-token and per-pair prefill costs (got {self.prefill_prompt_tokens})"
            )

    def reference(self, max_model_len: int | None = None) -> ProbeShape:
        """The drift check's probe: the middle decode concurrency at the shortest decode
        context that fits."""
        fitting = self.decode_contexts(max_model_len)
        prompt = min(fitting) if fitting else min(self.decode_prompt_tokens)
        batches = sorted(self.decode_concurrency)
        prompt, batch, out = self._decode_shape(prompt, batches[len(batches) // 2], max_model_len)
        return ProbeShape(kind="reference", prompt_tokens=prompt, concurrency=batch,
                          output_tokens=out)  # fmt: skip

    def decode_output_for(self, prompt_tokens: int, concurrency: int) -> int:
        """Tokens each request of a decode probe generates: enough that, once the last of
        the ``concurrency`` prompts is prefilled, every stream still decodes for two
        segments of ``segment_steps``.

        The engine prefills the batch's ``B·P`` prompt tokens over about
        ``ceil(B·P / (budget - B))`` steps (the decodes of the streams already started
        share the budget), and the first stream decodes all the while. With a fixed 18
        tokens, 8 or 32 prompts of 2,048 tokens never decoded together on vLLM (a 2,048-
        token budget): those probes gave no sample, the long context rested on one
        single-sequence segment, and the fit set ``per_decode_kv_token_s`` 40× under the
        engine's (3e-8 s against 1.3e-6 s measured), so long-context decode steps were
        predicted at half their time.
        """
        room = max(1, self.max_num_batched_tokens - concurrency)
        prefill_steps = -(-prompt_tokens * concurrency // room)
        return max(self.decode_output_tokens, prefill_steps + 2 * self.segment_steps + 4)

    def prefill_lengths(self, max_model_len: int | None = None) -> list[int]:
        """The prefill probes' prompt lengths, each one too long for ``max_model_len``
        replaced by the longest that fits (distinct, in the plan's order)."""
        return _fitting(self.prefill_prompt_tokens, self.prefill_output_tokens, max_model_len)

    def decode_contexts(self, max_model_len: int | None = None) -> list[int]:
        """The decode probes' prompt lengths, as :meth:`prefill_lengths`."""
        return _fitting(self.decode_prompt_tokens, self.decode_output_tokens, max_model_len)

    def shared_shape(self, max_model_len: int | None = None) -> ProbeShape | None:
        """The shared probe (round 0), or None: none asked for, or no whole aligned
        prefix fits ``max_model_len``. Its prompts are the prefix and
        :data:`SHARED_SUFFIX_TOKENS` of their own."""
        prefix = self.shared_prefix_tokens
        if prefix <= 0:
            return None
        p, b, out = self._decode_shape(
            prefix + SHARED_SUFFIX_TOKENS, self.shared_concurrency, max_model_len
        )
        prefix = min(
            prefix, (p - SHARED_SUFFIX_TOKENS) // SHARED_ALIGN_TOKENS * SHARED_ALIGN_TOKENS
        )
        if prefix <= 0:
            return None
        return ProbeShape(
            kind="shared",
            prompt_tokens=prefix + SHARED_SUFFIX_TOKENS,
            concurrency=b,
            output_tokens=out,
            shared_prefix_tokens=prefix,
        )

    def unidentified(self, max_model_len: int | None = None) -> tuple[str, str] | None:
        """The flag and why a fit of this plan's probes could not separate the decode
        coefficients (None: it can). Non-negative least squares does not fail on such a
        grid: it sets one of two indistinguishable costs to 0, and the model comes out
        optimistic for every batch unlike the probes (a single decode context fitted
        ``per_decode_kv_token_s = 0`` against vLLM and under-predicted its decode steps
        under load, at about twice the probes' context, by 17%)."""
        contexts = self.decode_contexts(max_model_len)
        fits = "" if max_model_len is None else f" that fit max_model_len {max_model_len}"
        if len(contexts) < 2:
            return "--decode-prompt-tokens", (
                f"--decode-prompt-tokens gives {len(contexts)} distinct context length"
                f"{'' if len(contexts) == 1 else 's'}{fits} ({self.decode_prompt_tokens}): "
                "the fit cannot tell per_decode_kv_token_s (reading the KV cache) from "
                "per_decode_seq_s; give two lengths far apart, e.g. "
                "--decode-prompt-tokens 128,2048"
            )
        if max(self.decode_concurrency, default=1) < 2:
            return "--decode-concurrency", (
                f"--decode-concurrency {','.join(map(str, self.decode_concurrency))} has no "
                "batch of 2 or more: the fit cannot tell per_decode_seq_s from overhead_s; "
                "give e.g. --decode-concurrency 2,8,32"
            )
        return None

    def shapes(self, max_model_len: int | None = None) -> list[ProbeShape]:
        """Every probe, in the order they run; with ``max_model_len``, each prompt that
        would not fit it is shortened to the longest that does.

        Raises:
            ValueError: when fewer than 3 distinct prefill prompt lengths fit
                ``max_model_len``.
        """
        prefill = self.prefill_lengths(max_model_len)
        if len(prefill) < 3:
            raise ValueError(
                f"only {len(prefill)} distinct prefill prompt lengths of "
                f"{list(self.prefill_prompt_tokens)} fit the endpoint's max_model_len "
                f"({max_model_len}) with {self.prefill_output_tokens} output tokens; give "
                "--prefill-prompt-tokens with at least 3 shorter lengths"
            )
        decode = [self._decode_shape(p, b, max_model_len)
                  for p in self.decode_contexts(max_model_len)
                  for b in self.decode_concurrency]  # fmt: skip
        reference = self.reference(max_model_len)
        shared = self.shared_shape(max_model_len)
        out: list[ProbeShape] = []
        for r in range(self.rounds):
            one = [
                ProbeShape(kind="prefill", prompt_tokens=p, concurrency=1,
                           output_tokens=self.prefill_output_tokens, round=r)
                for p in prefill
            ]  # fmt: skip
            two = [
                ProbeShape(kind="decode", prompt_tokens=p, concurrency=b,
                           output_tokens=out, round=r)
                for p, b, out in decode
            ]  # fmt: skip
            if shared is not None:
                two.append(replace(shared, round=r))
            mixed = [s for pair in zip_longest(one, two) for s in pair if s is not None]
            out.append(replace(reference, round=r))
            out.extend(mixed if r % 2 == 0 else mixed[::-1])
        out.append(replace(reference, round=self.rounds))
        return out

    def _decode_shape(
        self, prompt_tokens: int, concurrency: int, max_model_len: int | None
    ) -> tuple[int, int, int]:
        """``(prompt, concurrency, output)`` of one decode probe: the output from
        :meth:`decode_output_for`, the prompt shortened where prompt and output would not
        fit ``max_model_len`` together."""
        p = prompt_tokens
        out = self.decode_output_for(p, concurrency)
        if max_model_len is not None:
            for _ in range(4):  # a shorter prompt needs fewer prefill steps: settle
                if p + out <= max_model_len:
                    break
                p = max(1, max_model_len - out)
                out = self.decode_output_for(p, concurrency)
            out = min(out, max(2, max_model_len - p))
        return p, concurrency, out


DEFAULT_PLAN = ProbePlan()


def _fitting(lengths: tuple[int, ...], output_tokens: int, max_model_len: int | None) -> list[int]:
    """``lengths`` with each one longer than ``max_model_len`` takes (with
    ``output_tokens`` more) replaced by the longest it takes; distinct, in order."""
    longest = 2**62 if max_model_len is None else max_model_len - output_tokens
    out: list[int] = []
    for p in lengths:
        p = min(p, longest)
        if p >= 1 and p not in out:
            out.append(p)
    return out
