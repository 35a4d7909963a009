"""A drill's faults on one subject run in order, through hooks that take their time: the
corrupt-fingerprint drill's restore (at 4.5 s) started while its fault's hook (at 2 s)
was still reloading the gateway beside two CPU vLLMs (5 s on a loaded CI host), so the
restore landed first, the fault after it, and no probe ever saw the wrong fingerprint."""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

from headway.drill.run import run_drill
from headway.drill.spec import Drill, Fault, LoadSpec
from headway.drill.stack import RemoteStack
from headway.emulate.process import EmulatorProcess


def _hook(log: Path, line: str, sleep_s: float = 0.0) -> str:
    """A shell command that waits ``sleep_s``, then appends ``line`` to ``log``."""
    code = (
        f"import time, sys; time.sleep({sleep_s}); open(sys.argv[1], 'a').write({line!r} + '\\n')"
    )
    return f"{shlex.quote(sys.executable)} -I -S -c {shlex.quote(code)} {shlex.quote(str(log))}"


def test_a_restore_waits_for_its_faults_hook_and_other_subjects_do_not(tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    hooks = {
        # The fault's hook finishes 1.5 s after it starts, 1.2 s after its restore's time.
        "engine_faults": _hook(log, "fault {engine} done", sleep_s=1.5),
        "clear_engine_faults": _hook(log, "restore {engine} started"),
        "kill_redis": _hook(log, "redis killed"),
    }
    drill = Drill(
        name="order",
        title="order",
        seed_text="",
        designed="",
        load=LoadSpec(rate_per_s=4, duration_s=2.5, max_tokens=4),
        faults=[
            Fault(at_s=0.5, action="clear_engine_faults", engine=0),  # listed first
            Fault(at_s=0.2, action="engine_faults", engine=0),
            Fault(at_s=0.4, action="kill_redis"),  # another subject: not held up
        ],
        settle_s=0.5,
    )
    with EmulatorProcess(["--speedup", "20"]) as emu:
        stack = RemoteStack([emu.url], engine_urls=[emu.url], hooks=hooks)
        result = asyncio.run(run_drill(drill, stack, seed=0))
    lines = log.read_text(encoding="utf-8").splitlines()
    assert lines == ["redis killed", "fault 0 done", "restore 0 started"], lines
    when = {e["action"]: e for e in result.timeline}
    fault = when["engine_faults"]
    # The restore started once the fault's hook had finished, not at its own 0.5 s.
    assert when["clear_engine_faults"]["at_s"] >= fault["at_s"] + fault["took_s"] - 0.01
    assert when["kill_redis"]["at_s"] < fault["at_s"] + fault["took_s"]
