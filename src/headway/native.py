"""Whether headway's hot modules run compiled, and the way back to their sources.

An install may compile the simulator's hot path with mypyc (``hatch_build.py``); the
compiled extensions sit beside their ``.py`` sources, and Python imports an extension
before a source of the same name. That is only right while the extension was built from
that source: after an edit (an editable install, a developer at work) it would run the
old code. :func:`install` therefore compares each source with the SHA-256 the build
recorded (``native_build.json``) and, if any differs or ``HEADWAY_PURE_PYTHON=1`` asks
for it, makes every compiled module import from its source: they were compiled as one
group and call each other directly, so they switch together. Nothing else differs
between the two: same code, same results, the compiled one faster.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = ["MANIFEST_NAME", "NativeStatus", "install", "status"]

MANIFEST_NAME = "native_build.json"
"""Written by the build next to this module when it compiled something."""

_ROOT = Path(__file__).resolve().parent.parent  # the directory that holds ``headway/``


@dataclass(frozen=True, slots=True)
class NativeStatus:
    """How the compiled modules are used in this process."""

    compiled: bool
    """True when the compiled extensions are the ones imported."""
    reason: str
    """Why, in words (for ``headway --version`` and the benchmarks)."""
    modules: tuple[str, ...]
    """The modules the build compiled (empty for a pure-Python install)."""


_status = NativeStatus(compiled=False, reason="not checked yet", modules=())


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules' ``.py`` sources ahead of their extensions."""

    def __init__(self, root: Path, names: frozenset[str]) -> None:
        self._root = root
        self._names = names

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._names:
            return None
        return importlib.util.spec_from_file_location(fullname, _source(self._root, fullname))


def install(root: Path = _ROOT) -> NativeStatus:
    """Check the build's manifest once and route imports to sources when needed
    (``root``: the directory that holds ``headway/``)."""
    global _status
    manifest = root / "headway" / MANIFEST_NAME
    try:
        data = json.loads(manifest.read_bytes())
        recorded: dict[str, str] = data["modules"]
        failed = data.get("failed")
    except FileNotFoundError:
        _status = NativeStatus(False, "pure Python: this install compiled nothing", ())
        return _status
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        recorded, failed, broken = {}, None, f"{manifest} is unreadable ({exc})"
    else:
        broken = ""
    if failed is not None:
        _status = NativeStatus(False, f"pure Python: compiling at install failed ({failed})", ())
        return _status
    names = tuple(sorted(recorded))
    stale = [name for name, digest in recorded.items() if _digest(root, name) != digest]
    if os.environ.get("HEADWAY_PURE_PYTHON", "").strip() == "1":
        reason = "pure Python: HEADWAY_PURE_PYTHON=1"
    elif broken:
        reason = f"pure Python: {broken}"
    elif stale:
        reason = (
            f"pure Python: {len(stale)} source(s) changed since they were compiled "
            f"({', '.join(sorted(stale)[:3])}); reinstall to compile them again"
        )
    else:
        _status = NativeStatus(True, f"compiled with mypyc: {len(names)} modules", names)
        return _status
    sys.meta_path.insert(0, _SourceFinder(root, frozenset(names)))
    _status = NativeStatus(False, reason, names)
    return _status


def status() -> NativeStatus:
    """What :func:`install` found (it runs when ``headway`` is imported)."""
    return _status


def _source(root: Path, name: str) -> Path:
    """The ``.py`` file of module ``name`` under ``root``."""
    return root.joinpath(*name.split(".")).with_suffix(".py")


def _digest(root: Path, name: str) -> str:
    """SHA-256 of a module's source; empty when it cannot be read."""
    try:
        return hashlib.sha256(_source(root, name).read_bytes()).hexdigest()
    except OSError:
        return ""
