"""The contract file: it round-trips, and a foreign or broken file is one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headway.check.commands import default_contract_path
from headway.check.contract import (
    CONTRACT_FORMAT,
    Contract,
    Greedy,
    Inputs,
    Tokenizer,
    read_contract,
    write_contract,
)
from headway.core.errors import ConfigError


def _contract() -> Contract:
    return Contract(
        endpoint="http://127.0.0.1:8000",
        model="tiny",
        inputs=Inputs(stop="is"),
        tokenizer=Tokenizer(ids=((1, 2), (3,)), special_ids=(0, 1, 2)),
        greedy_output=Greedy(text=" a", finish_reason="length", ids=(4,)),
        not_available={"logprobs": "no token_logprobs"},
    )


def test_a_contract_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write_contract(path, _contract())
    assert json.loads(path.read_text())["format"] == CONTRACT_FORMAT
    assert read_contract(path) == _contract()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"format": "headway-contract/0"}', "write it again"),
        ("[1, 2", "not JSON"),
        (f'{{"format": "{CONTRACT_FORMAT}", "endpoint": "x"}}', "model"),
        (f'{{"format": "{CONTRACT_FORMAT}", "endpoint": "x", "model": "m", "extra": 1}}', "extra"),
    ],
)
def test_a_foreign_or_broken_file_is_one_clear_error(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as error:
        read_contract(path)
    assert str(path) in str(error.value)


def test_a_missing_file_names_itself_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read it.*headway check --target"):
        read_contract(tmp_path / "absent.json")


def test_the_default_path_never_overwrites(tmp_path: Path) -> None:
    first = default_contract_path("http://127.0.0.1:8000/v1", tmp_path)
    assert first.name == "contract-127.0.0.1-8000.json"
    first.write_text("{}")
    second = default_contract_path("http://127.0.0.1:8000/v1", tmp_path)
    assert second.name == "contract-127.0.0.1-8000-1.json"
    second.write_text("{}")
    assert default_contract_path("http://127.0.0.1:8000", tmp_path).name.endswith("-2.json")
