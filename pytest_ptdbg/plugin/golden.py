"""Golden store: one compact reference dump per test node id under the golden directory.

Layout::

    {golden}/{test file path}/{test name}[__call{n}]/golden.json
    {golden}/{test file path}/{test name}[__call{n}]/ptdbg_dump_v4.0/step0/rank0/{mode}_dump.pkl

``golden.json`` records the node id (authoritative: directory names are sanitised), the call
index within the test, the device it was recorded on, its dump mode and whether it holds full
tensors.
No torch here.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
from typing import Any, Dict, Iterable, List, Optional, Set

META = "golden.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._\-\[\]=+,]")


def _safe(part: str) -> str:
    part = _UNSAFE.sub("_", part).strip(".") or "_"
    if len(part) > 120:  # keep paths portable; the hash keeps long parametrize ids distinct
        part = part[:100] + "-" + hashlib.sha1(part.encode()).hexdigest()[:12]
    return part


def node_relpath(nodeid: str, call_index: int = 0) -> str:
    """Relative directory of a test's artifacts: the file path, then the test name(s)."""
    file_part, _, rest = nodeid.partition("::")
    parts = [_safe(p) for p in file_part.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    parts += [_safe(p) for p in rest.split("::") if p]
    if call_index:
        parts[-1] += f"__call{call_index}"
    return os.path.join(*parts) if parts else "_"


def golden_dir(root: str, nodeid: str, call_index: int = 0) -> str:
    return os.path.join(root, node_relpath(nodeid, call_index))


def has_golden(path: str) -> bool:
    return os.path.isfile(os.path.join(path, META))


def read_meta(path: str) -> Dict[str, Any]:
    meta_path = os.path.join(path, META)
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"golden metadata {meta_path} is unreadable: {exc}") from None
    if not isinstance(meta, dict) or "nodeid" not in meta:
        raise ValueError(f"golden metadata {meta_path} has no 'nodeid' field")
    return meta


def strip_stacks(dump_path: str) -> None:
    """Drop the stack records from every ``.pkl`` under ``dump_path`` (the device under test's own
    dump supplies the stacks when comparing; they are most of a statistics-only dump's size)."""
    from pytest_ptdbg.format.records import STACK_SUFFIX

    for base, _, files in os.walk(dump_path):
        for name in files:
            if not name.endswith(".pkl"):
                continue
            path = os.path.join(base, name)
            with open(path, encoding="utf-8") as f:
                lines = [ln for ln in f if not _is_stack_line(ln, STACK_SUFFIX)]
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.writelines(lines)
            os.replace(path + ".tmp", path)
            _recount_manifest(path, lines)


def _recount_manifest(pkl: str, lines: list) -> None:
    """The stripped ``.pkl``'s manifest counts the lines it still holds (status unchanged)."""
    from pytest_ptdbg.format.manifest import read_manifest, write_manifest

    try:
        doc = read_manifest(pkl)
    except ValueError:
        return  # an invalid manifest stays invalid: compare reports it
    if doc is not None:
        n = sum(1 for ln in lines if ln.endswith("\n") and ln.strip())
        write_manifest(pkl, n, doc["complete"], doc.get("reason"))


def _is_stack_line(line: str, suffix: str) -> bool:
    head = line[:400]
    if suffix + '"' not in head:
        return False
    try:
        rec = json.loads(line)
    except ValueError:
        return False
    return bool(rec) and isinstance(rec[0], str) and rec[0].endswith(suffix)


def commit(staging: str, final: str, meta: Dict[str, Any]) -> None:
    """Write ``meta`` into ``staging`` and move it to ``final``, replacing an older golden."""
    meta = dict(meta, created=datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"))
    with open(os.path.join(staging, META), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    old = None
    if os.path.exists(final):
        old = final + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staging, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def missing_message(nodeid: str, root: str, path: str) -> str:
    return (f"no golden for {nodeid}\n"
            f"  expected: {os.path.join(path, META)}\n"
            f"  create it on a machine with the reference device:\n"
            f"    pytest --ptdbg-golden={root} --ptdbg-update-golden '{nodeid}'\n"
            f"  (add --ptdbg-bench=<device> to record on another reference device)")


def iter_goldens(root: str) -> Iterable[Dict[str, Any]]:
    """Every golden under ``root``: its metadata plus ``path``."""
    if not root or not os.path.isdir(root):
        return
    for base, dirs, files in os.walk(root):
        if META in files:
            dirs[:] = []
            try:
                meta = read_meta(base)
            except ValueError:
                continue
            meta["path"] = base
            yield meta


def stale_goldens(root: str, known_ids: Set[str], rootdir: str,
                  partial: Iterable[str] = ()) -> List[Dict[str, Any]]:
    """Goldens whose test no longer exists.

    ``known_ids``: every test node id the session's collectors found (selected or deselected).
    ``partial``: test files (rootdir-relative, ``/``-separated) of which only some node ids
    were asked for (``file.py::test_a``): their other tests were never collected.

    A golden is stale when its node id is not known and either its test file no longer exists, or
    that file was collected whole (so the test left it). Goldens of files that were not part of
    this session, or only partly, are not judged.
    """
    files = {nid.partition("::")[0] for nid in known_ids} - {p.replace("\\", "/") for p in partial}
    stale = []
    for meta in iter_goldens(root):
        nodeid = meta["nodeid"]
        if nodeid in known_ids:
            continue
        file_part = nodeid.partition("::")[0]
        if file_part in files or not os.path.exists(os.path.join(rootdir, file_part)):
            stale.append({"nodeid": nodeid, "path": meta["path"]})
    return sorted(stale, key=lambda m: m["nodeid"])


def partial_files(args: Iterable[str], invocation_dir: str, rootdir: str) -> Set[str]:
    """Test files that command-line ``args`` select only in part (``path::name``), as node id
    file parts (relative to ``rootdir``)."""
    out: Set[str] = set()
    for arg in args:
        path, sep, _ = str(arg).partition("::")
        if not sep:
            continue
        full = os.path.abspath(os.path.join(invocation_dir, path))
        try:
            out.add(os.path.relpath(full, rootdir).replace(os.sep, "/"))
        except ValueError:  # another drive than the rootdir: no node id of ours starts there
            continue
    return out


def remove_tree(path: Optional[str]) -> None:
    if path and os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
