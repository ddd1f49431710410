"""The completeness manifest: a small JSON file beside each rank's ``.pkl``.

For ``{rank_dir}/{mode}_dump.pkl`` it is ``{rank_dir}/{mode}_dump.manifest.json``::

    {"format": "pytest-ptdbg-manifest", "version": 1, "pkl": "api_stack_dump.pkl",
     "records": 1083, "complete": true, "reason": null}

``records`` is the number of complete lines the ``.pkl`` held when the manifest was written (at every
``stop()`` and ``step()``, after the step's pending lines and ``.npy`` files reached the disk).
``environment`` (optional) is the run's arithmetic environment (``runtime/environment.py``: the
accelerator, versions, the float32 precision each backend allows, deterministic and SDPA settings,
autocast), read back as data by ``format/environment.py``.
``complete`` is false when the dump stopped early (a full disk, a write error) or left records out
(a record the debugger could not write truly); ``reason`` says why.
It is a separate file, not a line of the ``.pkl``, so ptdbg and msprobe readers are unaffected.

The rule compare applies (:func:`judge_completeness`): a dump written by this project (its records
carry the 7th ``extra`` element, or a manifest exists) is complete only when its manifest exists,
says ``complete`` and counts exactly the complete lines found. Dumps written by ptdbg or msprobe
have no manifest: their completeness is unknown, which is noted, not failed.

No torch here: the compare path imports this module.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional

from pytest_ptdbg.format.environment import checked_environment

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "Completeness",
    "manifest_path",
    "manifest_text",
    "write_manifest",
    "rewrite_manifest",
    "read_manifest",
    "judge_completeness",
    "ASIDE_MARKER",
    "aside_name",
    "is_marked_aside",
]

MANIFEST_FORMAT = "pytest-ptdbg-manifest"
MANIFEST_VERSION = 1
_SUFFIX = ".manifest.json"
_MAX_BYTES = 64 * 1024


def manifest_path(pkl_path: str) -> str:
    """``.../api_stack_dump.pkl`` -> ``.../api_stack_dump.manifest.json``."""
    base = pkl_path[:-4] if pkl_path.endswith(".pkl") else pkl_path
    return base + _SUFFIX


def manifest_text(pkl_name: str, records: int, complete: bool = True, reason: Optional[str] = None,
                  environment: Optional[Dict[str, Any]] = None) -> str:
    """The manifest's JSON text (one line, newline-terminated); ``environment``: the run's arithmetic
    environment (``runtime/environment.py``), when known."""
    doc: Dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "pkl": pkl_name,
        "records": int(records),
        "complete": bool(complete),
        "reason": reason,
    }
    if environment is not None:
        doc["environment"] = environment
    return json.dumps(doc) + "\n"


def _at(path: str, dir_fd: Optional[int]) -> str:
    """The name to use with ``dir_fd`` (the base name), or the path itself without one."""
    return os.path.basename(path) if dir_fd is not None else path


def write_manifest(pkl_path: str, records: int, complete: bool = True, reason: Optional[str] = None,
                   dir_fd: Optional[int] = None, environment: Optional[Dict[str, Any]] = None) -> str:
    """Write the manifest of ``pkl_path`` atomically (temporary file + ``os.replace``); its path.

    ``dir_fd``: an open descriptor of the ``.pkl``'s folder; the manifest is then written into that
    folder wherever it is now (a writer whose folder was moved marks the moved dump, not a path).
    Raises OSError when the disk refuses; callers inside a user's step must catch it.
    """
    path = manifest_path(pkl_path)
    tmp = _at(f"{path}.tmp-{os.getpid()}", dir_fd)
    dst = _at(path, dir_fd)
    data = manifest_text(os.path.basename(pkl_path), records, complete, reason, environment).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # no half-written temporary left beside the dump
        except OSError:
            pass
        raise
    return path


def rewrite_manifest(pkl_path: str, records: int, complete: bool = True, reason: Optional[str] = None,
                     dir_fd: Optional[int] = None, environment: Optional[Dict[str, Any]] = None) -> str:
    """Update an existing manifest in place (one ``pwrite`` from offset 0, then cut to length);
    its path. Raises OSError, FileNotFoundError when there is none yet (then use
    :func:`write_manifest`).

    A writer updates its manifest at every ``stop()``; renaming a new file over the old one makes
    ext4 flush the file at once (``auto_da_alloc``), about 0.5 ms here, against 15 us in place. A
    process killed between the write and the cut leaves old bytes after the new text: the file is
    then not valid JSON, which compare fails as unreadable, never as complete."""
    path = manifest_path(pkl_path)
    data = manifest_text(os.path.basename(pkl_path), records, complete, reason, environment).encode()
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], done)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return path


def read_manifest(pkl_path: str) -> Optional[Dict[str, Any]]:
    """The manifest of ``pkl_path`` as a dict, or None when there is none.

    Raises ValueError naming the file when it exists but is not a valid manifest.
    """
    path = manifest_path(pkl_path)
    if not os.path.lexists(path):
        return None
    import stat

    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: the manifest is not a regular file")
    if st.st_size > _MAX_BYTES:
        raise ValueError(f"{path}: the manifest is {st.st_size} bytes, larger than any manifest")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: the manifest is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: not a {MANIFEST_FORMAT} file")
    records = doc.get("records")
    if type(records) is not int or records < 0:
        raise ValueError(f"{path}: field 'records' must be a non-negative integer, got {records!r}")
    if not isinstance(doc.get("complete"), bool):
        raise ValueError(f"{path}: field 'complete' must be true or false, got {doc.get('complete')!r}")
    return doc


@dataclass(frozen=True)
class Completeness:
    """Whether a dump is whole: ``status`` is ``complete``, ``incomplete`` or ``unknown``; and the
    run's arithmetic environment its manifest recorded (None: not recorded; data, see
    ``format/environment.py``)."""

    status: str
    message: str = ""
    environment: Optional[Dict[str, Any]] = None

    @property
    def failed(self) -> bool:
        return self.status == "incomplete"


def judge_completeness(pkl_path: str, complete_lines: int, ours: bool) -> Completeness:
    """Apply the manifest rule to a ``.pkl`` holding ``complete_lines`` whole lines.

    ``ours``: the records carry this project's ``extra`` element (ptdbg and msprobe dumps do not).
    """
    try:
        doc = read_manifest(pkl_path)
    except (OSError, ValueError) as exc:
        return Completeness("incomplete", f"{exc}; the dump's completeness cannot be established")
    if doc is None:
        if not ours:
            return Completeness("unknown",
                                f"{pkl_path}: no manifest (not written by pytest-ptdbg): completeness unknown")
        return Completeness(
            "incomplete",
            f"{pkl_path}: no manifest {os.path.basename(manifest_path(pkl_path))}: the dump was not closed "
            "with stop() or step() (the run may have been killed) and may be cut short",
        )
    env = checked_environment(doc.get("environment"))
    if not doc["complete"]:
        why = doc.get("reason") or "no reason recorded"
        return Completeness("incomplete", f"{pkl_path}: the dump is incomplete: {why}", env)
    if doc["records"] != complete_lines:
        return Completeness(
            "incomplete",
            f"{pkl_path}: the manifest counts {doc['records']} records but the file holds {complete_lines} "
            "complete lines: the dump was cut short or written to after it was closed", env,
        )
    return Completeness("complete", "", env)


# ---------------------------------------------------------------------------------------------
# rank folders set aside by a re-dump (``dump/writer.py``'s ``replace_dir``)

#: written into a rank folder just before a re-dump renames it aside (``rank0.old-<pid>-<ns>``)
ASIDE_MARKER = ".pytest-ptdbg-replaced"
_ASIDE_RE = re.compile(r"^(rank\d+)\.old-\d+-\d+$")


def aside_name(name: str) -> Optional[str]:
    """``rank0`` of ``rank0.old-<pid>-<ns>`` (the name a re-dump gives the folder it replaces), or None."""
    m = _ASIDE_RE.match(name)
    return m.group(1) if m else None


def is_marked_aside(path: str) -> bool:
    """Whether ``path`` is a rank folder this project set aside to replace it: named
    ``rank<N>.old-<pid>-<ns>``, a real directory (not a symbolic link) holding the regular file
    :data:`ASIDE_MARKER`. Only such folders are ever deleted as leftovers; nothing is followed."""
    if aside_name(os.path.basename(path)) is None:
        return False
    import stat

    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        return stat.S_ISREG(os.lstat(os.path.join(path, ASIDE_MARKER)).st_mode)
    except OSError:
        return False
