"""One writer per (dump path, step, rank): an exclusive lock file beside the rank directory.

``{dump_path}/ptdbg_dump_v4.0/step{N}/rank{R}.lock`` holds the owner's pid and is locked with
``fcntl.flock``. The kernel drops the lock when its process dies, so the lock of a killed run is
stale by construction and simply taken over. A second writer (another process, or another
debugger in the same process: ``flock`` locks belong to an open file, not to a process) is
refused with :class:`DumpPathInUseError` naming the path and the holder's pid. Releasing deletes
the file (and the step directory when it is left empty). Without ``fcntl`` (Windows) no lock is
taken. Taking the lock also removes what a killed re-dump of that rank left (:func:`remove_leftovers`).
"""
from __future__ import annotations

import errno
import os
import shutil
import weakref
from typing import List, Optional

from pytest_ptdbg.errors import DumpPathInUseError
from pytest_ptdbg.format import manifest

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["DumpPathInUseError", "RankLock", "acquire_rank_lock", "lock_path", "remove_leftovers"]




def lock_path(rank_dir: str) -> str:
    """``.../step0/rank0`` -> ``.../step0/rank0.lock``."""
    return rank_dir.rstrip("/\\") + ".lock"


def remove_leftovers(rank_dir: str) -> List[str]:
    """Delete the folders a killed re-dump of ``rank_dir`` left beside it (``rank0.old-<pid>-<ns>``,
    see ``writer.replace_dir``); the paths deleted. Only folders carrying this project's mark
    (``manifest.is_marked_aside``: a real directory, not a link) are deleted, without following
    any link inside; call it holding the rank's lock (no other writer is replacing that rank)."""
    step_dir, base = os.path.split(rank_dir.rstrip("/\\"))
    try:
        names = os.listdir(step_dir)
    except OSError:
        return []
    done = []
    for name in names:
        if manifest.aside_name(name) != base:
            continue
        p = os.path.join(step_dir, name)
        if manifest.is_marked_aside(p):
            shutil.rmtree(p, ignore_errors=True)
            done.append(p)
    return done


def _release(fd: int, path: str, pid: int) -> None:
    if os.getpid() != pid:  # a forked child shares the lock: only its owner releases it
        return
    try:
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            os.unlink(path)
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass
    try:
        os.rmdir(os.path.dirname(path))  # the step directory, when nothing else is in it
    except OSError:
        pass


class RankLock:
    """A held lock; :meth:`release` (or garbage collection, or process exit) lets it go."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._finalizer = weakref.finalize(self, _release, fd, path, os.getpid())
        self._finalizer.atexit = False  # at exit the debugger releases it after its last manifest

    def release(self) -> None:
        """Delete the lock file and close it (idempotent)."""
        self._finalizer()

    @property
    def held(self) -> bool:
        return self._finalizer.alive


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    if not text.isdigit():
        return "unknown pid"
    return f"pid {text}" + (", this process" if int(text) == os.getpid() else "")


def acquire_rank_lock(rank_dir: str) -> Optional[RankLock]:
    """Lock ``rank_dir`` for this writer; None when no lock can be taken (no ``fcntl``, or the
    filesystem refuses: the writes will then fail and be reported by the writer).

    Raises :class:`DumpPathInUseError` when another writer holds it.
    """
    if fcntl is None:  # pragma: no cover
        return None
    path = lock_path(rank_dir)
    for _ in range(50):
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the step directory was removed meanwhile: again
            continue
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = _holder(fd)
                os.close(fd)
                raise DumpPathInUseError(
                    f"{rank_dir} is being dumped by another writer ({who}; lock file {path}): one writer per "
                    "dump path, step and rank. Stop and close() that debugger, or use another dump_path"
                ) from None
            os.close(fd)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except OSError:
            same = False
        if not same:  # the holder deleted the file between our open and our lock: again
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the lock holds without the pid; only the message of a refused writer is poorer
        remove_leftovers(rank_dir)
        return RankLock(path, fd)
    return None  # pragma: no cover - the file kept vanishing
