"""Report files: a name unique to each compare, each file created exclusively.

Every file of one compare shares one stem, ``{tag_}{timestamp}_{suffix}`` (``suffix``: 4 random
hex digits), e.g. ``compare_result_20261201103000_4f2a.csv`` and ``advisor_20261201103000_4f2a.txt``.
Files are created with ``O_CREAT | O_EXCL`` (and ``O_NOFOLLOW``): an existing file, or a symbolic
link planted at the name, is never opened, followed or overwritten; the whole set then takes a new
suffix. Two compares writing into one folder in the same second therefore never mix their files.
"""
from __future__ import annotations

import os
import secrets
import tempfile
import time
from typing import IO, Dict, Iterable, Optional, Tuple, Union
from pytest_ptdbg.errors import OutputError

__all__ = ["OutputError", "prepare_dir", "timestamp", "new_stem", "create_new", "write_new", "ReportSet"]

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_ATTEMPTS = 64




def prepare_dir(path: str) -> str:
    """Create ``path`` if needed and check that a file can be created in it; returns ``path``.

    Raises :class:`OutputError` naming the folder (before any work is done, so that a long compare
    does not end in a write error).
    """
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".ptdbg-write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the reports into this output folder: "
                          f"{exc.strerror or exc}") from None
    return path


def timestamp() -> str:
    """ptdbg's report timestamp, ``YYYYmmddHHMMSS`` (local time)."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime())


def new_stem(tag: str = "", ts: Optional[str] = None) -> str:
    """``{tag}_{timestamp}_{4 hex digits}`` (no tag: ``{timestamp}_{hex}``)."""
    stem = f"{ts or timestamp()}_{secrets.token_hex(2)}"
    return f"{tag}_{stem}" if tag else stem


def create_new(path: str) -> IO[str]:
    """Open a new text file at ``path`` for writing; FileExistsError when anything is there already.

    Never follows a symbolic link and never truncates an existing file.
    """
    fd = os.open(path, _FLAGS, 0o644)
    return os.fdopen(fd, "w", encoding="utf-8", newline="")


def write_new(path: str, text: str) -> str:
    """Write ``text`` into a new file at ``path`` (creating its folder; see :func:`create_new`)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with create_new(path) as f:
        f.write(text)
    return path


class ReportSet:
    """The files of one compare, all created (empty) at once under one unused stem.

    ``names``: ``{key: (prefix, extension)}``, e.g. ``{"csv": ("compare_result", "csv")}`` gives
    ``compare_result_{stem}.csv``. ``stem`` is tried first; on a collision the set takes
    ``new_stem(tag, ts)``. :meth:`write` fills the file of a key; :meth:`close` removes
    the files that were never written (after an error).
    """

    def __init__(self, folder: str, names: Dict[str, Tuple[str, str]], tag: str = "",
                 stem: Optional[str] = None, ts: Optional[str] = None) -> None:
        self.folder = folder
        self.files: Dict[str, IO[str]] = {}
        self.paths: Dict[str, str] = {}
        self._written: set = set()
        last: Optional[OSError] = None
        ts = ts or timestamp()
        for attempt in range(_ATTEMPTS):
            self.stem = stem if (attempt == 0 and stem) else new_stem(tag, ts)
            try:
                self._create_all(names)
                return
            except FileExistsError as exc:   # name taken (or a link planted there): a new suffix
                self._drop_all()
                last = exc
            except OSError as exc:
                self._drop_all()
                raise OutputError(f"{folder}: cannot create the report files: {exc}") from None
        raise OutputError(f"{folder}: no free report name after {_ATTEMPTS} tries ({last})")

    def _create_all(self, names: Dict[str, Tuple[str, str]]) -> None:
        for key, (prefix, ext) in names.items():
            path = os.path.join(self.folder, f"{prefix}_{self.stem}.{ext}")
            self.files[key] = create_new(path)
            self.paths[key] = path

    def _drop_all(self) -> None:
        for key, f in self.files.items():
            f.close()
            try:
                os.unlink(self.paths[key])
            except OSError:
                pass
        self.files.clear()
        self.paths.clear()

    def write(self, key: str, text: Union[str, Iterable[str]]) -> str:
        """Write ``text`` (a string, or its pieces in order) into the file of ``key`` and close
        it; returns its path."""
        f = self.files[key]
        with f:
            if isinstance(text, str):
                f.write(text)
            else:
                for piece in text:
                    f.write(piece)
        self._written.add(key)
        return self.paths[key]

    def close(self) -> None:
        """Close every file; remove those never written (an error stopped the compare)."""
        for key, f in list(self.files.items()):
            if not f.closed:
                f.close()
            if key not in self._written:
                try:
                    os.unlink(self.paths[key])
                except OSError:
                    pass
                del self.paths[key]

    def __enter__(self) -> "ReportSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

