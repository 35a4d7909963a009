"""The contract comparison: the first mismatch in the seed's order, what to inspect next,
and checks one side could not give."""

from __future__ import annotations

import msgspec
import pytest

from headway.check.compare import NEXT_STEPS, compare, summarize
from headway.check.contract import (
    CHECKS,
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
from headway.check.probe import choose_stop, public_url

NO_TOKENIZE = "POST /tokenize answered HTTP 404: no route POST /tokenize"


def _contract(**changes: object) -> Contract:
    """A full contract of a vLLM-like endpoint (``changes`` replace its records)."""
    base = Contract(
        endpoint="http://127.0.0.1:8000",
        model="tiny",
        engine="vllm 0.32.0",
        inputs=Inputs(stop="is"),
        tokenizer=Tokenizer(ids=((10, 11, 12), (13, 14)), special_ids=(0, 10, 11, 12)),
        chat_template=Template(ids=((3, 20, 4), (1, 21, 3, 22, 4))),
        greedy_output=Greedy(
            text=" few is few", finish_reason="length", ids=(7, 8, 7), prompt_ids=(0, 5, 6)
        ),
        eos=Eos(text=" few is few", finish_reason="length", completion_tokens=3, ids=(7, 8, 7)),
        stop_strings=StopString(
            stop="is", text=" few ", finish_reason="stop", stop_reason="is", honoured=True
        ),
        logprobs=Logprobs((-9.0, -8.5, -9.25)),
        usage=Usage(prompt_tokens=3, completion_tokens=3, chat_prompt_tokens=5),
    )
    return msgspec.structs.replace(base, **changes)


def _statuses(target: Contract, reference: Contract) -> dict[str, str]:
    return {r.name: r.status for r in compare(target, reference).results}


def test_identical_contracts_match_on_every_check() -> None:
    verdict = compare(_contract(), _contract())
    assert [r.name for r in verdict.results] == list(CHECKS)
    assert {r.status for r in verdict.results} == {"match"}
    assert verdict.first_mismatch is None


def test_another_tokenizer_is_named_first_though_everything_after_differs() -> None:
    other = _contract(
        tokenizer=Tokenizer(ids=((10, 11, 12), (13, 99)), special_ids=(0, 10, 11, 12)),
        chat_template=Template(ids=((3, 20, 4), (1, 21, 3, 98, 4))),
        greedy_output=Greedy(text=" x", finish_reason="length", ids=(5,), prompt_ids=(0, 5, 9)),
    )
    verdict = compare(other, _contract())
    first = verdict.first_mismatch
    assert first is not None and first.name == "tokenizer"
    assert "text 2" in first.detail and "at token 1: 99 vs 14" in first.detail
    assert first.next_step == NEXT_STEPS["tokenizer"]
    statuses = _statuses(other, _contract())
    assert statuses["chat_template"] == statuses["greedy_output"] == "mismatch"


def test_a_bos_difference_is_a_tokenizer_mismatch() -> None:
    other = _contract(tokenizer=Tokenizer(ids=((10, 11, 12), (13, 14)), special_ids=(10, 11, 12)))
    first = compare(other, _contract()).first_mismatch
    assert first is not None and first.name == "tokenizer"
    assert "special tokens" in first.detail


def test_a_template_mismatch_with_the_tokenizer_matching() -> None:
    other = _contract(
        chat_template=Template(ids=((3, 20, 4), (1, 21, 22, 4))),
        usage=Usage(prompt_tokens=3, completion_tokens=3, chat_prompt_tokens=4),
    )
    verdict = compare(other, _contract())
    assert verdict.results[0].status == "match"
    first = verdict.first_mismatch
    assert first is not None and first.name == "chat_template"
    assert "conversation 2" in first.detail
    assert _statuses(other, _contract())["usage"] == "mismatch"


def test_checks_run_in_the_seeds_order_from_the_boundary_inward() -> None:
    """Each check, broken alone, is the first mismatch; broken with every later one, still."""
    broken = {
        "tokenizer": {"tokenizer": Tokenizer(ids=((1,), (2,)), special_ids=(1,))},
        "chat_template": {"chat_template": Template(ids=((1,), (2,)))},
        "greedy_output": {
            "greedy_output": Greedy(text=" a", finish_reason="length", ids=(1,), prompt_ids=(0,))
        },
        "eos": {"eos": Eos(text=" few", finish_reason="stop", completion_tokens=1, ids=(7,))},
        "stop_strings": {
            "stop_strings": StopString(stop="is", text=" few is few", finish_reason="length")
        },
        "logprobs": {"logprobs": Logprobs((-1.0, -1.0, -1.0))},
        "usage": {"usage": Usage(prompt_tokens=4, completion_tokens=3, chat_prompt_tokens=5)},
    }
    assert list(broken) == list(CHECKS)
    for i, name in enumerate(CHECKS):
        alone = compare(_contract(**broken[name]), _contract()).first_mismatch
        assert alone is not None and alone.name == name
        later: dict[str, object] = {}
        for after in CHECKS[i:]:
            later.update(broken[after])
        with_later = compare(_contract(**later), _contract()).first_mismatch
        assert with_later is not None and with_later.name == name


def test_a_check_missing_on_one_side_is_not_available_and_the_rest_still_run() -> None:
    hosted = _contract(
        tokenizer=None,
        chat_template=None,
        greedy_output=Greedy(text=" other", finish_reason="length"),
        not_available={"tokenizer": NO_TOKENIZE, "chat_template": NO_TOKENIZE},
    )
    verdict = compare(hosted, _contract())
    statuses = {r.name: r for r in verdict.results}
    assert statuses["tokenizer"].status == "not_available"
    assert statuses["tokenizer"].detail == f"target: {NO_TOKENIZE}"
    assert statuses["eos"].status == "match"
    first = verdict.first_mismatch
    assert first is not None and first.name == "greedy_output"
    assert "ids not returned" in first.detail  # compared on text
    assert first.next_step.startswith("tokenizer and chat template could not be compared")
    assert first.next_step.endswith(NEXT_STEPS["greedy_output"].removeprefix("inspect "))


def test_a_reason_both_sides_share_is_given_once() -> None:
    a = _contract(logprobs=None, not_available={"logprobs": "no token_logprobs"})
    result = compare(a, a).results[CHECKS.index("logprobs")]
    assert (result.status, result.detail) == ("not_available", "both: no token_logprobs")
    assert compare(a, a).first_mismatch is None


@pytest.mark.parametrize(("shift", "status"), [(5e-4, "match"), (5e-3, "mismatch")])
def test_logprobs_match_within_the_tolerance(shift: float, status: str) -> None:
    moved = _contract(logprobs=Logprobs((-9.0, -8.5 + shift, -9.25)))
    result = compare(moved, _contract(), logprob_tolerance=1e-3).results[CHECKS.index("logprobs")]
    assert result.status == status
    if status == "mismatch":
        assert "at token 1" in result.detail and "checksum" in result.detail


def test_a_stop_string_the_target_ignores_is_a_mismatch() -> None:
    ignored = _contract(
        stop_strings=StopString(
            stop="is", text=" few is few", finish_reason="length", honoured=False
        )
    )
    first = compare(ignored, _contract()).first_mismatch
    assert first is not None and first.name == "stop_strings"
    assert "not honoured" in first.detail and "stop rules" in first.next_step


def test_without_a_reference_checks_are_recorded_or_not_available() -> None:
    hosted = _contract(tokenizer=None, not_available={"tokenizer": NO_TOKENIZE})
    results = {r.name: r for r in summarize(hosted).results}
    assert results["tokenizer"].status == "not_available"
    assert results["tokenizer"].detail == NO_TOKENIZE
    assert {results[n].status for n in CHECKS[1:]} == {"recorded"}
    assert summarize(hosted).first_mismatch is None


def test_the_stop_string_is_a_word_piece_past_the_start() -> None:
    text = " few is few is few is few is"
    stop = choose_stop(text)
    assert stop and stop in text
    assert 0 < text.find(stop) < len(text) - 1  # the stopped text is neither empty nor whole
    assert choose_stop(" the people of the world came") == "of"  # at 12 of 29
    assert choose_stop(" ,, ;; !") == ""


def test_a_contract_records_the_url_without_credentials() -> None:
    assert public_url("https://user:secret@api.example.com:8443/v1/?key=k#x") == (
        "https://api.example.com:8443/v1"
    )


def test_logprobs_of_other_greedy_tokens_are_not_compared() -> None:
    other = _contract(
        greedy_output=Greedy(text=" x", finish_reason="length", ids=(1, 2, 3), prompt_ids=(0, 5, 6))
    )
    results = {r.name: r for r in compare(other, _contract()).results}
    assert results["greedy_output"].status == "mismatch"
    assert results["logprobs"].status == "not_available"
    assert "greedy tokens differ" in results["logprobs"].detail


def test_other_prompt_ids_send_the_greedy_mismatch_to_the_tokenizer() -> None:
    """A hosted reference without /tokenize: the prompt ids the completion returns still
    point at the tokenizer."""
    other = _contract(
        tokenizer=None,
        greedy_output=Greedy(text=" x", finish_reason="length", ids=(1,), prompt_ids=(0, 9, 6)),
        not_available={"tokenizer": NO_TOKENIZE},
    )
    first = compare(other, _contract()).first_mismatch
    assert first is not None and first.name == "greedy_output"
    assert first.detail.startswith("prompt ids")
    assert first.next_step.startswith("tokenizer could not be compared (not available)")
    assert (
        "the tokenizer files" in first.next_step and "prompt's token ids differ" in first.next_step
    )
