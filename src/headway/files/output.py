"""Where results go: output paths checked when the command line is parsed, and files
written atomically, so a reader never sees a half-written file and a run never ends in a
traceback (its results lost) because ``--out`` named somewhere it cannot write."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

__all__ = ["output_file", "output_folder", "write_text_atomic"]


def _writable_ancestor(path: Path) -> None:
    """Raise ``ArgumentTypeError`` unless the nearest existing folder above ``path`` takes
    a new file (the folders between are made when the results are written)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is a file, not a folder")
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        raise argparse.ArgumentTypeError(
            f"{path}: cannot write there ({reason}); choose a writable path"
        ) from None


def output_file(text: str) -> Path:
    """An argparse ``type``: a file the command will write (its folders may be missing).
    A folder, or a place that cannot be written, is a usage error (exit code 2)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{path} is a folder; name the file to write in it, e.g. {path / 'out.json'}"
        )
    _writable_ancestor(path)
    return path


def output_folder(text: str) -> Path:
    """An argparse ``type``: a folder the command writes its result files into (made if
    missing). An existing file, or a place that cannot be written, is a usage error."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{path} is a file; name a folder to write the results in, e.g. {path}-out"
        )
    if path.is_dir():
        _writable_ancestor(path / "probe")
    else:
        _writable_ancestor(path)
    return path


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        # mkstemp creates the file 0600; give it the usual permissions (0666 less umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
