"""The charging rule: a request ended in any phase pays for what an engine did for it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headway.core.policy.charges import (
    Phase,
    charged_tokens,
    unseen_output_tokens,
    unused_tokens,
)


def test_each_phase_is_charged_the_work_done() -> None:
    cost, prompt = 3_400, 3_000  # a 3,000-token prompt with max_tokens 400
    assert charged_tokens(Phase.UNSENT, cost_tokens=cost, prompt_tokens=prompt) == 0
    assert charged_tokens(Phase.PREFILL, cost_tokens=cost, prompt_tokens=prompt) == 3_000
    # Issue 15: a client that reads the first token and hangs up got everything back.
    first_token = charged_tokens(
        Phase.DECODE, cost_tokens=cost, prompt_tokens=prompt, output_tokens=1
    )
    assert first_token == 3_001
    served = charged_tokens(
        Phase.COMPLETED, cost_tokens=cost, prompt_tokens=prompt, output_tokens=57
    )
    assert served == 3_057
    # A completed answer without usage pays its whole cost (the gateway cannot tell).
    assert charged_tokens(Phase.COMPLETED, cost_tokens=cost, prompt_tokens=prompt) == cost
    assert unused_tokens(Phase.PREFILL, cost_tokens=cost, prompt_tokens=prompt) == 400


def test_an_unseen_output_is_estimated_from_the_speed_or_charged_whole() -> None:
    assert unseen_output_tokens(1.0, 0.01, 400) == 101
    assert unseen_output_tokens(60.0, 0.01, 400) == 400
    assert unseen_output_tokens(1.0, None, 400) == 400


@given(
    st.sampled_from(list(Phase)),
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=0, max_value=10_000),
    st.none() | st.integers(min_value=0, max_value=20_000),
)
def test_a_charge_is_never_negative_nor_more_than_the_cost(
    phase: Phase, prompt: int, planned: int, output: int | None
) -> None:
    cost = prompt + planned
    charged = charged_tokens(phase, cost_tokens=cost, prompt_tokens=prompt, output_tokens=output)
    assert 0 <= charged <= cost
    refund = unused_tokens(phase, cost_tokens=cost, prompt_tokens=prompt, output_tokens=output)
    assert refund == cost - charged
    if phase is not Phase.UNSENT:
        assert charged >= prompt  # an engine that took it did its prompt's work
