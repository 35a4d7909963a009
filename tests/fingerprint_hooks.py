"""Drill hooks that corrupt a revision's readiness fingerprint in a running gateway's
config and restore it: what an operator's hooks file does when it pushes a bad artifact
(``kubectl apply`` of a config map, then the gateway's ``/admin/reload``).

A test writes the state (:func:`record`: the gateway's URL, admin token and config
file, and each engine's revision) and a hooks file (:func:`hooks_file`) whose commands
run this module as a script::

    python tests/fingerprint_hooks.py corrupt STATE_DIR ENGINE   # the engine's revision
                                                                 # expects another's ids
    python tests/fingerprint_hooks.py restore STATE_DIR ENGINE   # the recorded one again

Each rewrites the config file (as JSON, which the gateway's YAML loader reads) and
reloads the gateway, and exits non-zero unless the gateway answered that it reloaded (a
fault that did not happen must fail the drill). The hooks run on the standard library
alone, in an isolated interpreter (``-I -S``), to start as fast as a loaded host lets
it: the drill times the exclusion from the fault's start, hook included.
Against a real engine this is how the ``corrupt-fingerprint`` drill runs: the engine
cannot be told to answer with other token ids, its expected fingerprint can be wrong.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["hooks_file", "record"]


def _state(directory: Path) -> Path:
    return directory / "fingerprints.json"


def record(
    directory: Path,
    *,
    gateway_url: str,
    admin_token: str,
    config_path: Path,
    config: Mapping[str, Any],
    revisions: Sequence[str],
) -> None:
    """Note the gateway (its config, and the file the hooks rewrite) and each engine's
    revision, in engine order."""
    directory.mkdir(parents=True, exist_ok=True)
    data = {"gateway": gateway_url, "admin_token": admin_token, "path": str(config_path),
            "config": dict(config), "revisions": list(revisions)}  # fmt: skip
    _state(directory).write_text(json.dumps(data))


def hooks_file(directory: Path) -> Path:
    """A hooks file: ``engine_faults`` and ``clear_engine_faults`` through this script."""
    run = f"{sys.executable} -I -S {Path(__file__).resolve()}"
    path = directory / "hooks.yaml"
    path.write_text(
        f"engine_faults: '{run} corrupt {directory} {{engine}}'\n"
        f"clear_engine_faults: '{run} restore {directory} {{engine}}'\n"
    )
    return path


def _reload(directory: Path, state: dict[str, Any]) -> None:
    """Write the state's config to the gateway's file, note it, and reload the gateway."""
    Path(state["path"]).write_text(json.dumps(state["config"]), encoding="utf-8")
    _state(directory).write_text(json.dumps(state))
    request = urllib.request.Request(
        f"{state['gateway']}/admin/reload", b"{}",
        {"Content-Type": "application/json", "Authorization": f"Bearer {state['admin_token']}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as resp:
        body = json.loads(resp.read())
    if not body.get("reloaded"):
        raise SystemExit(f"the gateway did not reload: {body}")


def corrupt(directory: Path, engine: int) -> None:
    """The engine's revision now expects the fingerprint of another engine's revision
    (an artifact recorded on the wrong model); the true one is kept to restore."""
    state = json.loads(_state(directory).read_text())
    fingerprints = state["config"]["pool"]["fingerprints"]
    revision = state["revisions"][engine]
    other = next(r for r in state["revisions"] if fingerprints[r] != fingerprints[revision])
    state.setdefault("saved", {})[revision] = fingerprints[revision]
    fingerprints[revision] = fingerprints[other]
    _reload(directory, state)


def restore(directory: Path, engine: int) -> None:
    """The engine's revision expects its recorded fingerprint again."""
    state = json.loads(_state(directory).read_text())
    revision = state["revisions"][engine]
    state["config"]["pool"]["fingerprints"][revision] = state["saved"][revision]
    _reload(directory, state)


if __name__ == "__main__":
    verb, state_dir, index = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    {"corrupt": corrupt, "restore": restore}[verb](state_dir, index)
