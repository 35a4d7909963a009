"""The probe design of ``headway calibrate``: which request shapes to send.

Two kinds of probe, run one after another on an otherwise idle endpoint:

- **prefill probes**: one request alone, for each prompt length, a few times. Its time to
  first token is one engine step of the whole prompt (or ``ceil(P / budget)`` chunked
  steps), so TTFT across prompt lengths separates the per-token and per-pair costs. The
  rest of its stream gives decode steps of one sequence at long contexts.
- **decode probes**: ``B`` requests sent together, for each concurrency and prompt length.
  Once all have their first token and until the first ends, every step decodes exactly
  these ``B`` sequences, so the mean inter-token gap measures a decode step of ``B``
  sequences reading ``Σ context`` KV tokens.

Prompts are token-id lists (``/v1/completions`` accepts them), so their length is exact,
and each starts with a unique token so that no prefix-cache hit shortens a prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_PLAN", "ProbePlan", "ProbeShape"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeShape:
    """One probe: ``concurrency`` identical requests sent at once."""

    kind: str
    """``prefill`` or ``decode``."""
    prompt_tokens: int
    concurrency: int
    output_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbePlan:
    """The grid of probes (prompt lengths × concurrency × output lengths)."""

    prefill_prompt_tokens: tuple[int, ...] = (256, 1024, 2048, 4096, 8192, 16384, 32768)
    """Prompt lengths of the prefill probes. Long prompts pin the attention (per-pair)
    cost; those that do not fit the endpoint's ``max_model_len`` are left out."""
    prefill_output_tokens: int = 33
    """Tokens each prefill probe generates (its gaps are 1-sequence decode steps)."""
    prefill_repeats: int = 3
    """Times each prefill probe runs."""
    decode_concurrency: tuple[int, ...] = (2, 4, 8, 16, 32)
    """Batch sizes of the decode probes."""
    decode_prompt_tokens: tuple[int, ...] = (128, 2048)
    """Context lengths of the decode probes."""
    decode_output_tokens: int = 65
    """Tokens each decode probe request generates."""
    max_num_batched_tokens: int = 8192
    """The engine's step token budget (vLLM ``--max-num-batched-tokens``): a longer
    prompt is prefilled in ``ceil(P / budget)`` steps, each with the fixed overhead."""
    segment_steps: int = 8
    """Decode steps averaged into one gap sample (the mean over a run of steps is
    ``(t_end - t_start) / steps``: lateness inside the run cancels out)."""

    def __post_init__(self) -> None:
        checks = (
            ("prefill_prompt_tokens", all(p >= 1 for p in self.prefill_prompt_tokens)),
            ("prefill_output_tokens", self.prefill_output_tokens >= 2),
            ("prefill_repeats", self.prefill_repeats >= 1),
            ("decode_concurrency", all(b >= 1 for b in self.decode_concurrency)),
            ("decode_prompt_tokens", all(p >= 1 for p in self.decode_prompt_tokens)),
            ("decode_output_tokens", self.decode_output_tokens >= 2),
            ("max_num_batched_tokens", self.max_num_batched_tokens >= 1),
            ("segment_steps", self.segment_steps >= 1),
        )
        for name, ok in checks:
            if not ok:
                raise ValueError(f"ProbePlan.{name} is out of range ({getattr(self, name)})")
        if not self.prefill_prompt_tokens or len(set(self.prefill_prompt_tokens)) < 3:
            raise ValueError(
                "ProbePlan.prefill_prompt_tokens needs at least 3 distinct lengths to separate "
                f"the per-token and per-pair prefill costs (got {self.prefill_prompt_tokens})"
            )

    def shapes(self, max_model_len: int | None = None) -> list[ProbeShape]:
        """Every probe, in the order they run; with ``max_model_len``, only those whose
        prompt and output fit it."""
        limit = max_model_len if max_model_len is not None else 2**62
        out = [
            ProbeShape(kind="prefill", prompt_tokens=p, concurrency=1,
                       output_tokens=self.prefill_output_tokens)
            for _ in range(self.prefill_repeats)
            for p in self.prefill_prompt_tokens
            if p + self.prefill_output_tokens <= limit
        ]  # fmt: skip
        out.extend(
            ProbeShape(kind="decode", prompt_tokens=p, concurrency=b,
                       output_tokens=self.decode_output_tokens)
            for p in self.decode_prompt_tokens
            for b in self.decode_concurrency
            if p + self.decode_output_tokens <= limit
        )  # fmt: skip
        return out


DEFAULT_PLAN = ProbePlan()
