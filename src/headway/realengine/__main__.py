"""``python -m headway.realengine [MODEL_DIR]``: install vLLM (unless present), build the model.

Prints each step and its time; exit 1 when a step fails (the message names it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from headway.realengine.install import InstallError, VllmVenv, default_venv_path
from headway.realengine.model import ModelSpec, build_model, default_model_dir


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    """Install, build, print where they are."""
    t0 = time.monotonic()
    try:
        venv = VllmVenv(default_venv_path()).ensure(progress=_say)
    except InstallError as exc:
        sys.stderr.write(f"headway.realengine: {exc}\n")
        return 1
    t1 = time.monotonic()
    spec = ModelSpec()
    directory = Path(argv[0]) if argv else default_model_dir(spec)
    try:
        build_model(directory, spec, python=venv.python)
    except (OSError, RuntimeError) as exc:
        sys.stderr.write(f"headway.realengine: building the model failed: {exc}\n")
        return 1
    t2 = time.monotonic()
    _say(f"vllm venv {venv.path} ready in {t1 - t0:.0f} s; model {directory} in {t2 - t1:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
