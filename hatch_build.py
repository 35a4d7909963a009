"""Build hook: compile the simulator's hot modules with mypyc, or install pure Python.

The modules named by ``compile`` under ``[tool.hatch.build.hooks.custom]`` in
``pyproject.toml`` (the engine model, the event loop and what it calls per event) are
ordinary typed Python; mypyc turns them into C extensions, which run the simulator about
4-5x faster. Nothing else changes: the sources ship beside the extensions, and
``headway.native`` falls back to them when an extension is missing or older than its
source (see that module).

``HEADWAY_COMPILE`` chooses: ``auto`` (default) compiles and, when that fails (no C
compiler, no Python headers), warns and installs pure Python; ``1`` makes a failure fail
the build; ``0`` skips compiling. An editable install (``pip install -e .``) compiles in
place, next to the sources under ``src/``; a wheel carries the extensions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SRC = "src"
MANIFEST = "headway/native_build.json"  # mirrored by headway.native.MANIFEST_NAME
GROUP = "headway"  # the shared library is headway__mypyc.<abi>.so at the import root


class CompileHook(BuildHookInterface):
    """Compile ``compile`` (paths under ``src/``) for wheels and editable installs."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        src = Path(self.root) / SRC
        editable = version == "editable"
        if editable:
            _remove_build(src)  # extensions of an earlier install must not shadow new sources
        mode = os.environ.get("HEADWAY_COMPILE", "auto").strip().lower()
        if mode not in ("auto", "0", "1"):
            raise ValueError(
                f"HEADWAY_COMPILE={mode!r} is not understood: use auto (compile, fall back "
                "to pure Python), 1 (compile or fail) or 0 (pure Python)"
            )
        modules = [str(m) for m in self.config.get("compile", [])]
        if mode == "0" or not modules:
            return
        out = src if editable else Path(tempfile.mkdtemp(prefix="headway-native-"))
        try:
            built = _compile(src, modules, out)
        except Exception as exc:  # a missing compiler or header: any failure falls back
            if mode == "1":
                raise
            self.app.display_warning(
                f"headway: compiling {len(modules)} modules with mypyc failed "
                f"({type(exc).__name__}: {exc}); installing pure Python, which runs the "
                "simulator about 4-5x slower. Install a C compiler and the Python headers "
                "and reinstall, or set HEADWAY_COMPILE=0 to skip this attempt."
            )
            if editable:
                _remove_build(src)
                # Say why for `headway --version` (pip shows the warning only with -v).
                failed = {"modules": {}, "failed": f"{type(exc).__name__}: {exc}"[:160]}
                (src / MANIFEST).write_text(json.dumps(failed))
            return
        manifest = out / MANIFEST
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps(_manifest(src, modules), indent=1, sort_keys=True))
        self.app.display_info(f"headway: compiled {len(modules)} modules with mypyc")
        if not editable:
            for path in [*built, manifest]:
                build_data["force_include"][str(path)] = path.relative_to(out).as_posix()
            build_data["pure_python"] = False
            build_data["infer_tag"] = True


def _compile(src: Path, modules: list[str], out: Path) -> list[Path]:
    """Compile ``modules`` (paths relative to ``src``) into extensions under ``out``."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    work = Path(tempfile.mkdtemp(prefix="headway-mypyc-"))
    cwd = os.getcwd()
    os.chdir(src)  # module names come from the paths; in-place output lands beside them
    try:
        extensions = mypycify(
            ["--ignore-missing-imports", "--cache-dir", str(work / "mypy"), *modules],
            opt_level="3",
            multi_file=True,
            group_name=GROUP,
            target_dir=str(work / "c"),
        )
        dist = Distribution({"name": "headway-native", "ext_modules": extensions})
        command = dist.get_command_obj("build_ext")
        command.build_lib = str(out)
        command.build_temp = str(work / "o")
        command.parallel = os.cpu_count() or 1
        dist.run_command("build_ext")
        return [Path(p) for p in command.get_outputs()]
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)


def _manifest(src: Path, modules: list[str]) -> dict[str, Any]:
    """What was compiled, from which source (its SHA-256), by which mypy and Python."""
    import mypy.version

    return {
        "mypy": mypy.version.__version__,
        "python": sys.version.split()[0],
        "modules": {
            m.removesuffix(".py").replace("/", "."): hashlib.sha256(
                (src / m).read_bytes()
            ).hexdigest()
            for m in modules
        },
    }


def _remove_build(src: Path) -> None:
    """Delete extensions and the manifest that an earlier editable install left."""
    for path in [*src.glob(f"{GROUP}__mypyc*"), *(src / "headway").rglob("*.so")]:
        path.unlink()
    (src / MANIFEST).unlink(missing_ok=True)
