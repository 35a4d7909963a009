"""`headway check` between real vLLM servers (issue 20, deliverable 4).

Three servers start beside the tier's shared one, at once: a second one identical to it
(the same model directory and settings), one serving the seed-1 model (another tokenizer:
the same text has other ids), and one serving the seed-0 model with another chat template
(`--chat-template`: the same tokenizer, other turn separators). The check must report no
mismatch between the two identical ones, and name the tokenizer, then the template, as the
first mismatch of the others.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headway.check.contract import CHECKS, read_contract
from headway.cli import main
from headway.realengine.install import VllmVenv
from headway.realengine.model import ModelSpec, build_model, default_model_dir
from headway.realengine.server import VllmServer, VllmSettings

OTHER_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
"""The model's template without its newlines after the role tags and end tags."""

SMALL = VllmSettings(max_model_len=512, kv_cache_space_gib=1)
"""The settings of the two servers that differ on purpose: small, to start fast."""


@pytest.fixture(scope="module")
def servers(
    request: pytest.FixtureRequest,
    vllm_venv: VllmVenv,
    tiny_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, VllmServer]]:
    """``shared``, ``twin`` (identical), ``seed1`` and ``template``; the three extra ones
    start while the shared one does."""
    folder = tmp_path_factory.mktemp("vllm-check")
    spec = ModelSpec(seed=1)
    seed1_model = build_model(default_model_dir(spec), spec, python=vllm_venv.python)
    template_file = folder / "template.jinja"
    template_file.write_text(OTHER_TEMPLATE, encoding="utf-8")
    template_settings = VllmSettings(
        max_model_len=SMALL.max_model_len,
        kv_cache_space_gib=SMALL.kv_cache_space_gib,
        extra_args=("--chat-template", str(template_file)),
    )
    extra = {
        "twin": VllmServer(vllm_venv.python, tiny_model, folder / "twin.log", VllmSettings()),
        "seed1": VllmServer(vllm_venv.python, seed1_model, folder / "seed1.log", SMALL),
        "template": VllmServer(
            vllm_venv.python, tiny_model, folder / "template.log", template_settings
        ),
    }
    failed: list[str] = []

    def start(name: str, server: VllmServer) -> None:
        try:
            server.start()
        except RuntimeError as exc:  # reported below, on the test's thread
            failed.append(f"{name}: {exc}")

    threads = [threading.Thread(target=start, args=item, daemon=True) for item in extra.items()]
    for thread in threads:
        thread.start()
    try:
        shared: VllmServer = request.getfixturevalue("vllm_server")
        for thread in threads:
            thread.join()
        if failed:
            pytest.fail(f"a vLLM server did not start: {failed[0]}", pytrace=False)
        yield {"shared": shared, **extra}
    finally:
        for thread in threads:
            thread.join()
        for server in extra.values():
            server.stop()


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["check", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _statuses(verdict: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in verdict["checks"]}


def test_identical_servers_match_on_every_check(
    servers: dict[str, VllmServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared, twin = servers["shared"].url, servers["twin"].url
    out = tmp_path / "twin.json"
    code, verdict = _check(capsys, "--target", twin, "--reference", shared, "--write", str(out))
    assert _statuses(verdict) == dict.fromkeys(CHECKS, "match"), verdict
    assert (code, verdict["first_mismatch"]) == (0, None)
    # The file it wrote is a reference too: the shared server against it, by a second run.
    code, verdict = _check(
        capsys, "--target", shared, "--contract", str(out), "--write", str(tmp_path / "s.json")
    )
    assert _statuses(verdict) == dict.fromkeys(CHECKS, "match"), verdict
    assert code == 0
    contract = read_contract(out)
    assert contract.tokenizer is not None and contract.greedy_output is not None
    assert contract.greedy_output.ids is not None and contract.logprobs is not None


def test_another_tokenizer_is_the_first_mismatch(
    servers: dict[str, VllmServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, verdict = _check(
        capsys, "--target", servers["seed1"].url, "--reference", servers["shared"].url,
        "--write", str(tmp_path / "seed1.json"),
    )  # fmt: skip
    assert code == 1
    assert verdict["first_mismatch"] == "tokenizer", verdict
    assert "tokenizer" in verdict["next_step"]
    statuses = _statuses(verdict)
    # Other ids for the same text: the prompt's ids, so the output's, differ too.
    assert statuses["greedy_output"] == "mismatch", verdict


def test_another_chat_template_is_named_with_the_tokenizer_matching(
    servers: dict[str, VllmServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, verdict = _check(
        capsys, "--target", servers["template"].url, "--reference", servers["shared"].url,
        "--write", str(tmp_path / "template.json"),
    )  # fmt: skip
    statuses = _statuses(verdict)
    assert code == 1
    assert statuses["tokenizer"] == "match", verdict
    assert verdict["first_mismatch"] == "chat_template", verdict
    assert "chat template" in verdict["next_step"]
    # Completions do not go through the template: their ids agree; the chat count does not.
    assert statuses["greedy_output"] == "match", verdict
    assert statuses["usage"] == "mismatch", verdict
