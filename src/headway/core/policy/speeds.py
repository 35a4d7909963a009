"""Service speeds: what admission predicts a dispatched request's service time with.

Admission's deadline check and its Retry-After need the time a request takes once
dispatched. The engine model's cost of a request is its prefill and then one decode step
per output token::

    service_s = prompt_tokens / prefill_tokens_per_s + output_tokens * tpot_s

:class:`ServiceSpeeds` holds those two speeds. Before anything has completed, a prior
answers (the configured speeds, a profile from ``headway calibrate``, or the engine model:
:func:`prior_from_step_time`), so a prediction exists from the first request; every
completed request then refines them (an exponentially weighted mean, weight ``weight``):

* a **streamed** answer separates the two: its time from dispatch to the first token is
  the prefill, the rest is decode (``(end - first) / (output_tokens - 1)`` per token);
* a **whole** (non-streamed) answer gives only its duration from dispatch: both speeds are
  scaled by the ratio of that duration to what they predict for its tokens, keeping their
  split between prefill and decode (the prior's, until a streamed answer says otherwise).

It takes times and token counts from its driver and reads no clock, so the simulator and
the live gateway measure alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from headway.core.engine.steptime import BatchShape, StepTimeModel, prefill_pairs

__all__ = ["DEFAULT_SPEED_WEIGHT", "ServiceSpeeds", "SpeedPrior", "prior_from_step_time"]

DEFAULT_SPEED_WEIGHT: Final = 0.1
"""Weight of the newest completed request in the measured speeds."""


@dataclass(frozen=True, slots=True)
class SpeedPrior:
    """Speeds known before anything was measured."""

    tpot_s: float
    """Time per output token of a dispatched request, seconds."""

    prefill_tokens_per_s: float = math.inf
    """Prompt tokens per second of one request's prefill (infinite: prefill is free)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tpot_s) and self.tpot_s > 0):
            raise ValueError(f"SpeedPrior.tpot_s must be a finite number > 0 (got {self.tpot_s})")
        if not self.prefill_tokens_per_s > 0:  # NaN fails too
            raise ValueError(
                f"SpeedPrior.prefill_tokens_per_s must be > 0 (got {self.prefill_tokens_per_s})"
            )


def prior_from_step_time(
    step_time: StepTimeModel,
    *,
    num_seqs: int,
    prompt_tokens: int = 512,
    context_tokens: int = 1024,
) -> SpeedPrior:
    """The speeds the step-time model gives a request in a full batch: ``num_seqs``
    sequences decoding with ``context_tokens`` each in KV (its TPOT), and a
    ``prompt_tokens`` prefill computed beside the others' decode (its prefill speed)."""
    seqs = max(num_seqs, 1)
    decode = BatchShape(num_decode_seqs=seqs, decode_kv_tokens=seqs * context_tokens)
    prefill = BatchShape(
        num_prefill_tokens=prompt_tokens,
        prefill_attention_pairs=prefill_pairs(prompt_tokens, 0),
        num_prefill_seqs=1,
        num_decode_seqs=seqs - 1,
        decode_kv_tokens=(seqs - 1) * context_tokens,
    )
    return SpeedPrior(
        tpot_s=step_time.step_time_s(decode),
        prefill_tokens_per_s=prompt_tokens / step_time.step_time_s(prefill),
    )


class ServiceSpeeds:
    """The prefill speed and TPOT admission predicts with: a prior, refined by the
    requests that completed (see the module docstring)."""

    __slots__ = ("_prefill_s_per_token", "_tpot_s", "samples", "weight")

    def __init__(
        self, prior: SpeedPrior | None = None, *, weight: float = DEFAULT_SPEED_WEIGHT
    ) -> None:
        """Args:
        prior: the speeds before any measurement (None: unknown until the first
            completed request, and no prediction before it).
        weight: of the newest request in the means, in (0, 1].
        """
        if not (0.0 < weight <= 1.0):
            raise ValueError(f"weight must be in (0, 1] (got {weight})")
        self.weight = weight
        self.samples = 0
        """Completed requests measured."""
        self._tpot_s = None if prior is None else prior.tpot_s
        self._prefill_s_per_token = None if prior is None else 1.0 / prior.prefill_tokens_per_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token (None: no prior and nothing measured)."""
        return self._tpot_s

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """Prompt tokens per second of a prefill (None: no prior and nothing measured)."""
        per = self._prefill_s_per_token
        return None if per is None else (math.inf if per <= 0 else 1.0 / per)

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float | None:
        """Predicted seconds from dispatch to the last token (None: speeds unknown)."""
        if self._tpot_s is None or self._prefill_s_per_token is None:
            return None
        return prompt_tokens * self._prefill_s_per_token + output_tokens * self._tpot_s

    def _mean(self, old: float | None, sample: float) -> float:
        return sample if old is None else old + self.weight * (sample - old)

    def observe_stream(
        self, prompt_tokens: int, output_tokens: int, first_token_s: float, duration_s: float
    ) -> None:
        """A streamed answer: ``first_token_s`` from dispatch to its first token,
        ``duration_s`` from dispatch to its last, ``output_tokens`` generated."""
        if not (math.isfinite(first_token_s) and math.isfinite(duration_s)):
            return
        if prompt_tokens > 0 and first_token_s > 0:
            per = first_token_s / prompt_tokens
            self._prefill_s_per_token = self._mean(self._prefill_s_per_token, per)
        if output_tokens > 1 and duration_s >= first_token_s:
            tpot = (duration_s - first_token_s) / (output_tokens - 1)
            self._tpot_s = self._mean(self._tpot_s, tpot)
        self.samples += 1

    def observe_whole(self, prompt_tokens: int, output_tokens: int, duration_s: float) -> None:
        """A whole (non-streamed) answer of ``output_tokens`` that took ``duration_s`` from
        dispatch: both speeds scale by duration / prediction. Without a prediction yet,
        the split of a whole answer is unknown: it counts as all decode (prefill free)."""
        if not (math.isfinite(duration_s) and duration_s > 0) or output_tokens < 1:
            return
        predicted = self.service_s(prompt_tokens, output_tokens)
        if predicted is None or predicted <= 0:
            self._tpot_s = self._mean(self._tpot_s, duration_s / output_tokens)
            if self._prefill_s_per_token is None:
                self._prefill_s_per_token = 0.0
        else:
            scale = duration_s / predicted
            assert self._tpot_s is not None
            assert self._prefill_s_per_token is not None
            self._tpot_s = self._mean(self._tpot_s, self._tpot_s * scale)
            per = self._prefill_s_per_token
            self._prefill_s_per_token = self._mean(per, per * scale)
        self.samples += 1
