"""One request lifecycle: the table, the error a forbidden move raises, the one balance,
and every driver's words mapped onto it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from headway.bench.records import ERRORS
from headway.core.errors import InvalidTransition
from headway.core.lifecycle import (
    BENCH_WORDS,
    DRILL_WORDS,
    SIM_WORDS,
    TERMINAL,
    TRANSITIONS,
    Event,
    State,
    advance,
    tally,
)
from headway.drill.load import STATES
from headway.sim.outcome import OUTCOMES


@given(st.lists(st.sampled_from(list(Event)), max_size=12))
def test_a_request_moves_only_as_the_table_says(events: list[Event]) -> None:
    state = State.OFFERED
    for event in events:
        want = TRANSITIONS.get((state, event))
        if want is None:
            with pytest.raises(InvalidTransition) as raised:
                advance("req-7", state, event)
            text = str(raised.value)
            assert "'req-7'" in text and event.value in text and state.value in text
            return
        state = advance("req-7", state, event)
        assert state is want


@given(st.lists(st.sampled_from(list(Event)), max_size=12))
def test_every_request_ends_in_at_most_one_terminal_state(events: list[Event]) -> None:
    state, ended = State.OFFERED, 0
    for event in events:
        if (state, event) not in TRANSITIONS:
            break
        state = advance(1, state, event)
        ended += state in TERMINAL
    assert ended <= 1
    for terminal in TERMINAL:  # nothing leaves a terminal state
        assert not [e for (s, e) in TRANSITIONS if s is terminal]


@given(st.lists(st.sampled_from(list(State)), max_size=60))
def test_any_set_of_requests_balances(states: list[State]) -> None:
    acc = tally(states)
    assert acc.balanced
    assert acc.offered == len(states)
    assert acc.in_flight == sum(s not in TERMINAL for s in states)


def test_a_balance_that_loses_a_request_does_not_balance() -> None:
    acc = tally([State.COMPLETED, State.SHED, State.TIMED_OUT])
    assert acc.balanced and not replace(acc, completed=0).balanced
    assert not replace(acc, shed=2).balanced


@pytest.mark.parametrize(
    ("words", "mapping"),
    [(OUTCOMES, SIM_WORDS), (STATES, DRILL_WORDS), (ERRORS, BENCH_WORDS)],
    ids=["simulator", "drills", "bench"],
)
def test_every_drivers_words_map_onto_the_lifecycle(
    words: tuple[str, ...], mapping: dict[str, State | None]
) -> None:
    assert set(mapping) == set(words)  # a new word in a driver must be mapped here
    assert {s for s in mapping.values() if s is not None} <= set(State)
