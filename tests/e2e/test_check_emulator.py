"""`headway check` against `headway emulate`: the checks a server without `/tokenize` and
logprobs can give still run, a changed model revision is the first mismatch, the API key
is never written or printed, and an unreachable target is one line with exit code 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headway.check.contract import read_contract
from headway.cli import main
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess
from headway.loopback import free_port

SECRET = "sk-check-never-written"


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, str]]:
    """Two emulators of revision r1 and one of r2."""
    with (
        EmulatorProcess(["--speedup", "50"]) as a,
        EmulatorProcess(["--speedup", "50"]) as b,
        EmulatorProcess(["--speedup", "50", "--revision", "r2"]) as c,
    ):
        yield {"r1": a.url, "r1-twin": b.url, "r2": c.url}


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    capsys.readouterr()
    code = main(["check", *args, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def _statuses(verdict: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in verdict["checks"]}


def test_two_emulators_of_one_revision_match_where_they_can_be_compared(
    emulators: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "c.json"
    code, verdict, _ = _check(
        capsys, "--target", emulators["r1-twin"], "--reference", emulators["r1"],
        "--write", str(out),
    )  # fmt: skip
    assert (code, verdict["first_mismatch"]) == (0, None), verdict
    assert _statuses(verdict) == {
        "tokenizer": "not_available",  # no /tokenize
        "chat_template": "not_available",
        "greedy_output": "match",
        "eos": "match",
        "stop_strings": "match",
        "logprobs": "not_available",  # logprobs: null
        "usage": "match",
    }
    tokenizer = verdict["checks"][0]
    assert tokenizer["detail"].startswith("both: POST /tokenize answered HTTP 404")
    contract = read_contract(out)
    assert contract.stop_strings is not None and contract.stop_strings.honoured is False
    # The file written is a reference: the inputs it holds are sent again, the answers match.
    code, verdict, _ = _check(
        capsys, "--target", emulators["r1"], "--contract", str(out),
        "--write", str(tmp_path / "again.json"),
    )  # fmt: skip
    assert (code, verdict["first_mismatch"]) == (0, None), verdict


def test_another_revision_is_the_first_mismatch_with_the_unchecked_tokenizer_named(
    emulators: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, verdict, _ = _check(
        capsys, "--target", emulators["r2"], "--reference", emulators["r1"],
        "--write", str(tmp_path / "c.json"),
    )  # fmt: skip
    assert code == 1
    assert verdict["first_mismatch"] == "greedy_output", verdict
    assert verdict["next_step"].startswith("tokenizer and chat template could not be compared")
    assert _statuses(verdict)["usage"] == "match"  # the prompts count the same


def test_the_api_key_is_never_written_or_printed(
    emulators: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    for extra in ([], ["--api-key", SECRET]):
        capsys.readouterr()
        assert main(["check", "--target", emulators["r1"], *extra]) == 0
        captured = capsys.readouterr()
        assert SECRET not in captured.out + captured.err
        assert "wrote" in captured.out and "first mismatch" not in captured.out
    written = sorted(tmp_path.glob("contract-127.0.0.1-*.json"))
    assert len(written) == 2  # the default name, then a numbered one: never overwritten
    for path in written:
        assert SECRET not in path.read_text()


def test_an_unreachable_target_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code = main(["check", "--target", url, "--write", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--target {url}: cannot reach it" in err and "is the server up" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c.json").exists()


def test_through_a_keyed_gateway_the_key_is_used_and_never_written(
    emulators: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway asks for a tenant's key, as a hosted API does: without it the check is
    one line naming --api-key; with it, the relay matches the engine behind it."""
    config = {
        "upstreams": [{"url": emulators["r1"]}],
        "tenants": {SECRET: {"name": "acme", "max_priority": "interactive"}},
    }
    out = tmp_path / "gw.json"
    with GatewayProcess(config) as gw:
        code = main(["check", "--target", gw.url, "--write", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and "--api-key" in err and "Traceback" not in err
        code, verdict, err = _check(
            capsys, "--target", gw.url, "--api-key", SECRET, "--reference", emulators["r1"],
            "--write", str(out),
        )  # fmt: skip
    assert (code, verdict["first_mismatch"]) == (0, None), verdict
    assert _statuses(verdict)["greedy_output"] == "match"
    assert SECRET not in json.dumps(verdict) + err + out.read_text()
