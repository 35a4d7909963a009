"""The step-time contract: how long one engine step takes for a given batch.

A step of a continuous-batching engine computes some prompt (prefill) tokens, possibly in
chunks, and one new token for each decoding sequence. Its duration depends on the batch
only through a few sums, so a batch is described by :class:`BatchShape` and any step-time
model (the roofline in :mod:`headway.core.engine.roofline`, or a profile measured by
``headway calibrate``) answers :meth:`StepTimeModel.step_time_s`.

Decode-only steps must be *affine in the KV tokens read* for a fixed number of sequences
and shared KV tokens: ``step_time_s(decode-only n seqs, kv, shared) == base + per_kv_token
* kv``. The simulator relies on that to jump over runs of identical decode steps in closed
form (:meth:`StepTimeModel.decode_step_affine`); during such a run the shared tokens stay
as they are (new tokens go to each sequence's own blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from headway.core.pickling import reduce_by_fields


@dataclass(slots=True, init=False, unsafe_hash=True)
class BatchShape:
    """The sums over one step's batch that determine its duration.

    A prefill chunk of ``c`` new tokens for a request that already has ``p`` tokens in KV
    attends to ``p + 1 .. p + c`` positions, i.e. ``c * p + c * (c + 1) / 2`` query-key
    pairs; ``prefill_attention_pairs`` is that sum over the step's chunks.

    A value: its fields are never reassigned. Like the other per-step values of the
    engine model (plans, step results, decode runs, route requests) it is a plain
    dataclass with its own ``__init__``, not a frozen one: compiled, a frozen dataclass
    takes about 20× longer to build (its generated ``__init__`` runs interpreted).
    """

    num_prefill_tokens: int
    """New prompt tokens computed this step (all chunks together)."""

    prefill_attention_pairs: int
    """Sum over prefill chunks of query-key pairs: ``c * p + c * (c + 1) // 2``."""

    num_prefill_seqs: int
    """Requests that contribute a prefill chunk this step."""

    num_decode_seqs: int
    """Requests that generate one token this step."""

    decode_kv_tokens: int
    """Sum over decoding requests of the tokens already in their KV cache (read once each)."""

    decode_shared_kv_tokens: int
    """Of ``decode_kv_tokens``, those in blocks that another request of the step also
    holds (prefix-cache hits on blocks in use), counted for every holder but the first.
    vLLM reads them once per sequence, but the second read onwards finds them in the
    CPU's caches: a decode step of 8 sequences on one cached 1,024-token prefix took
    35.8 ms against 50.9 for 8 distinct prompts (docs/real-engine.md)."""

    def __init__(
        self,
        num_prefill_tokens: int = 0,
        prefill_attention_pairs: int = 0,
        num_prefill_seqs: int = 0,
        num_decode_seqs: int = 0,
        decode_kv_tokens: int = 0,
        decode_shared_kv_tokens: int = 0,
    ) -> None:
        self.num_prefill_tokens = num_prefill_tokens
        self.prefill_attention_pairs = prefill_attention_pairs
        self.num_prefill_seqs = num_prefill_seqs
        self.num_decode_seqs = num_decode_seqs
        self.decode_kv_tokens = decode_kv_tokens
        self.decode_shared_kv_tokens = decode_shared_kv_tokens

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step: the batch size that GEMMs see."""
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def is_empty(self) -> bool:
        """True when the step computes nothing."""
        return self.num_tokens == 0


def prefill_pairs(chunk_tokens: int, prior_tokens: int) -> int:
    """Query-key pairs of a prefill chunk of ``chunk_tokens`` after ``prior_tokens``."""
    return chunk_tokens * prior_tokens + chunk_tokens * (chunk_tokens + 1) // 2


class StepTimeModel(Protocol):
    """Anything that predicts the duration of an engine step."""

    def step_time_s(self, batch: BatchShape) -> float:
        """Seconds the step takes (> 0 for a non-empty batch)."""
        ...

    def decode_step_affine(self, num_seqs: int, shared_kv_tokens: int = 0) -> tuple[float, float]:
        """``(base_s, per_kv_token_s)`` of decode-only steps with ``num_seqs`` sequences
        and ``shared_kv_tokens`` (:attr:`BatchShape.decode_shared_kv_tokens`).

        For every ``kv``: ``step_time_s(BatchShape(num_decode_seqs=num_seqs,
        decode_kv_tokens=kv, decode_shared_kv_tokens=shared_kv_tokens)) == base_s +
        per_kv_token_s * kv`` (up to rounding).
        """
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AffineStepTime:
    """A step-time model that is linear in the batch sums, plus a fixed overhead.

    This is the form ``headway calibrate`` fits from a real endpoint, and a convenient
    model for tests. All coefficients are seconds per unit.
    """

    overhead_s: float = 0.004
    """Fixed cost of any non-empty step (scheduling, kernel launches, sampling)."""

    per_prefill_token_s: float = 0.00005
    """Cost of each new prompt token (GEMMs over the token)."""

    per_prefill_pair_s: float = 0.0
    """Cost of each prefill query-key pair (attention, quadratic in context)."""

    per_decode_seq_s: float = 0.0001
    """Cost of each decoding sequence (its GEMM row, sampling)."""

    per_decode_kv_token_s: float = 0.0000002
    """Cost of reading one KV token during decode attention."""

    shared_kv_read_ratio: float = 1.0
    """What reading one of the step's shared KV tokens
    (:attr:`BatchShape.decode_shared_kv_tokens`) costs, as a fraction of
    ``per_decode_kv_token_s``: 1 (the default), every read from memory. ``headway
    calibrate`` measures it with a decode probe whose requests share a cached prefix
    (a CPU vLLM, whose second read onwards finds the block in the CPU's caches: ~0.2 by
    an ad-hoc measurement, 0.049 and 0.46 in two calibrations of one benchmark run)."""

    per_prefill_seq_s: float = 0.0
    """Cost of each request that computes a prefill chunk in the step: what the engine
    spends on a request beyond its tokens (adding it to the batch's state, its sampling
    and output setup). ``headway calibrate`` measures it as the part of a lone request's
    TTFT that no token explains (``docs/calibrate.md``)."""

    def __post_init__(self) -> None:
        for name in (
            "overhead_s",
            "per_prefill_token_s",
            "per_prefill_pair_s",
            "per_decode_seq_s",
            "per_decode_kv_token_s",
            "per_prefill_seq_s",
            "shared_kv_read_ratio",
        ):
            value = getattr(self, name)
            if not value >= 0.0:
                raise ValueError(f"AffineStepTime.{name} must be >= 0 (got {value})")

    def __reduce__(self) -> tuple[Callable[[], AffineStepTime], tuple[()]]:
        """Pickle by calling the class (compiled, the default refuses a frozen class)."""
        return reduce_by_fields(self)

    def step_time_s(self, batch: BatchShape) -> float:
        """Seconds the step takes; 0 for an empty batch."""
        if batch.is_empty:
            return 0.0
        return (
            self.overhead_s
            + self.per_prefill_token_s * batch.num_prefill_tokens
            + self.per_prefill_pair_s * batch.prefill_attention_pairs
            + self.per_decode_seq_s * batch.num_decode_seqs
            + self.per_decode_kv_token_s * batch.decode_kv_tokens
            + self._shared_discount_s(batch.decode_shared_kv_tokens)
            + self.per_prefill_seq_s * batch.num_prefill_seqs
        )

    def _shared_discount_s(self, shared_kv_tokens: int) -> float:
        """What the shared KV tokens cost beyond ``per_decode_kv_token_s`` each."""
        ratio = self.shared_kv_read_ratio
        if ratio == 1.0 or not shared_kv_tokens:
            return 0.0
        return (ratio - 1.0) * self.per_decode_kv_token_s * shared_kv_tokens

    def decode_step_affine(self, num_seqs: int, shared_kv_tokens: int = 0) -> tuple[float, float]:
        """``(base_s, per_kv_token_s)`` of a decode-only step of ``num_seqs`` sequences."""
        if num_seqs <= 0:
            return (0.0, 0.0)
        return (
            self.overhead_s
            + self.per_decode_seq_s * num_seqs
            + self._shared_discount_s(shared_kv_tokens),
            self.per_decode_kv_token_s,
        )
