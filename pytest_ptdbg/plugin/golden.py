"""Golden store: one small text file per test (and call) that a fresh run is judged against.

Where (``golden_path``): by default next to the test file, ``{test dir}/__ptdbg__/{test file
stem}/{test name}.golden.jsonl`` (``TestClass.test_x-param`` for a method with a parametrize
id; ``.call1`` and up for the later ``ptdbg_dump`` calls of one test). With ``--ptdbg-golden=DIR``
(ini ``ptdbg_golden``) under ``DIR/{test file path without .py}/`` instead.

What (``render``/``parse``): UTF-8 text, one JSON object per line, no timestamps,
so that an unchanged model gives the same bytes. The first line is the header
(``{"format": "pytest-ptdbg golden", "version": 1, "nodeid": ..., "call": n, "mode": ...}``), keys in a fixed order,
then one line per recorded call (``{"k": key, "call": {args, kwargs}}``: the non-tensor
arguments, tensors as ``{"t": "input.0"}``) and one per tensor (``{"k": key, "t":
"forward.input.0", "dtype": ..., "shape": [...], "stats": [max, min, mean, l2norm]}``, statistics
rounded to 6 significant digits, ``"nonfinite": [nan, inf]`` when there are any). ``key`` is the
stable call key of ``callkeys.py``. No torch here.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set

from pytest_ptdbg.errors import GoldenError
from pytest_ptdbg.runtime.text import TextEnum

class GoldenStatus(TextEnum):
    """What a test did with its golden (the session summary counts each)."""

    CREATED = "created"        #: there was none: written from this run
    UPDATED = "updated"        #: rewritten (``--ptdbg-update``, or an unreadable one replaced)
    UNCHANGED = "unchanged"    #: this run agrees with it
    DIFFERS = "differs"        #: this run differs from it
    MISSING = "missing"        #: there is none and none was written (CI, or NaN/Inf in the run)
    UNREADABLE = "unreadable"  #: it cannot be read or belongs to another test


#: the statuses the session summary lists, in its order
SUMMARY_STATUSES = (GoldenStatus.CREATED, GoldenStatus.UPDATED, GoldenStatus.UNCHANGED, GoldenStatus.DIFFERS,
                    GoldenStatus.MISSING)

FOLDER = "__ptdbg__"
SUFFIX = ".golden.jsonl"
FORMAT = "pytest-ptdbg golden"
VERSION = 1
#: significant digits kept of every statistic
DIGITS = 6
#: the largest golden file read (a golden is a few hundred KB at most)
MAX_BYTES = 64 * 1024 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9._\-=+,]")
_ARTIFACT_UNSAFE = re.compile(r"[^A-Za-z0-9._\-\[\]=+,]")


# ------------------------------------------------------------------------------ paths

def _safe(part: str, pattern: "re.Pattern[str]" = _UNSAFE) -> str:
    part = pattern.sub("_", part).strip(".") or "_"
    if len(part) > 120:  # keep paths portable; the hash keeps long parametrize ids distinct
        part = part[:100] + "-" + hashlib.sha1(part.encode()).hexdigest()[:12]
    return part


def node_relpath(nodeid: str, call_index: int = 0) -> str:
    """Relative directory of a test's artifacts: the file path, then the test name(s)."""
    file_part, _, rest = nodeid.partition("::")
    parts = [_safe(p, _ARTIFACT_UNSAFE) for p in file_part.replace("\\", "/").split("/")
             if p not in ("", ".", "..")]
    parts += [_safe(p, _ARTIFACT_UNSAFE) for p in rest.split("::") if p]
    if call_index:
        parts[-1] += f"__call{call_index}"
    return os.path.join(*parts) if parts else "_"


def golden_name(nodeid: str, call_index: int = 0) -> str:
    """File name of a test's golden: ``test_x-param[.callN].golden.jsonl`` (no brackets)."""
    rest = nodeid.partition("::")[2] or nodeid
    name = ".".join(p for p in rest.split("::") if p)
    if "[" in name and name.endswith("]"):
        head, _, param = name[:-1].partition("[")
        name = f"{head}-{param}"
    safe = _safe(name)
    if safe != name:  # characters replaced: a hash of the id keeps two such ids apart
        safe = f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return f"{safe}{f'.call{call_index}' if call_index else ''}{SUFFIX}"


def golden_path(nodeid: str, call_index: int, rootdir: str, root: Optional[str] = None) -> str:
    """Where the golden of ``nodeid`` (call ``call_index``) lives; ``root`` is the explicit
    golden directory, else the ``__ptdbg__`` folder beside the test file."""
    file_part = nodeid.partition("::")[0].replace("\\", "/")
    stem = os.path.splitext(file_part)[0]
    if root:
        parts = [_safe(p) for p in stem.split("/") if p not in ("", ".", "..")] or ["_"]
        folder = os.path.join(root, *parts)
    else:
        folder = os.path.join(rootdir, os.path.dirname(file_part), FOLDER,
                              _safe(os.path.basename(stem)))
    return os.path.join(folder, golden_name(nodeid, call_index))


# ------------------------------------------------------------------------------ text

def round_stat(value: Any) -> Any:
    """A statistic as the golden keeps it: 6 significant digits; NaN/Inf as strings."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    r = float(f"{v:.{DIGITS}g}")
    return 0.0 if r == 0 else r


def stat_value(value: Any) -> float:
    """A golden statistic back as a float (``"nan"`` -> NaN)."""
    if isinstance(value, str):
        return float(value)
    if value is None:
        return math.nan
    return float(value)


def encode(obj: Dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


@dataclass
class Golden:
    """A parsed golden: its header and its call/tensor lines, in recorded order."""

    path: str
    header: Dict[str, Any]
    lines: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def nodeid(self) -> str:
        return str(self.header.get("nodeid", ""))


def header(nodeid: str, call: int, mode: str, device: str) -> Dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "nodeid": nodeid, "call": call, "mode": mode,
            "device": device}


def render(head: Dict[str, Any], lines: Iterable[Dict[str, Any]]) -> str:
    return "".join(encode(x) + "\n" for x in [head, *lines])


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: List[Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(f"member {key!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (the golden writes NaN/Inf as strings: \"nan\", \"inf\")")


def _stat_problem(value: Any) -> str:
    """Why ``value`` is not a golden statistic ("" when it is one)."""
    if isinstance(value, str):
        return "" if value in ("nan", "inf", "-inf") else f"{value!r} is not a number"
    if value is None or isinstance(value, bool):  # a bool tensor's statistics; none recorded
        return ""
    if not isinstance(value, (int, float)):
        return f"{json.dumps(value)[:40]} is not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is out of range (NaN/Inf are written as strings)"
    return ""


def _line_problem(obj: Dict[str, Any]) -> str:
    """What is wrong with one call or tensor line ("" when nothing)."""
    if not isinstance(obj.get("k"), str) or not ("call" in obj or isinstance(obj.get("t"), str)):
        return "a golden line needs 'k' and 'call' or 't'"
    if "t" not in obj:
        return "" if obj.get("call") is None or isinstance(obj.get("call"), dict) else \
            "'call' must be an object or null"
    if not (isinstance(obj.get("stats"), list) and isinstance(obj.get("shape"), list)):
        return "a tensor line needs 'stats' and 'shape' lists"
    if not isinstance(obj.get("dtype", ""), str):
        return "'dtype' must be a string"
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in obj["shape"]):
        return f"'shape' {json.dumps(obj['shape'])[:60]} is not a list of sizes"
    for i, value in enumerate(obj["stats"]):
        why = _stat_problem(value)
        if why:
            return f"statistic {i} of {obj['t']}: {why}"
    nonfinite = obj.get("nonfinite")
    if nonfinite is not None and not (isinstance(nonfinite, list) and len(nonfinite) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in nonfinite)):
        return "'nonfinite' must be two counts [nan, inf]"
    return ""


def parse(text: str, path: str) -> Golden:
    """A golden's text; GoldenError names ``path:line`` for anything it cannot use: a line that is
    not one JSON object, a member given twice, a record given twice, a statistic that is not a
    number (NaN/Inf only as the strings the golden writes)."""
    # lines end at "\n" only: a module name may hold U+2028, U+2029 or U+0085, which
    # str.splitlines() would also split at (json.dumps keeps them raw with ensure_ascii=False)
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    if not rows:
        raise GoldenError(f"{path}: empty golden file")
    out: List[Dict[str, Any]] = []
    for n, row in enumerate(rows, 1):
        try:
            obj = json.loads(row, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        except _Duplicate as exc:
            raise GoldenError(f"{path}:{n}: corrupt golden: {exc}") from None
        except (ValueError, RecursionError) as exc:
            raise GoldenError(f"{path}:{n}: not a JSON line ({exc})") from None
        if not isinstance(obj, dict):
            raise GoldenError(f"{path}:{n}: expected a JSON object")
        out.append(obj)
    head = out[0]
    if head.get("format") != FORMAT or head.get("version") != VERSION or "nodeid" not in head:
        raise GoldenError(f"{path}:1: not a pytest-ptdbg golden header (format {FORMAT!r}, "
                          f"version {VERSION}, nodeid)")
    seen: Dict[Any, int] = {}
    for n, obj in enumerate(out[1:], 2):
        why = _line_problem(obj)
        if why:
            raise GoldenError(f"{path}:{n}: {why}")
        ident = (obj["k"], obj.get("t"))
        if ident in seen:
            what = f"tensor {obj['t']} of {obj['k']}" if "t" in obj else f"call {obj['k']}"
            raise GoldenError(f"{path}:{n}: corrupt golden: {what} is recorded twice (first at "
                              f"line {seen[ident]})")
        seen[ident] = n
    return Golden(path, head, out[1:])


def read(path: str) -> Golden:
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise GoldenError(f"{path}: larger than {MAX_BYTES} bytes; not a golden")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise GoldenError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise GoldenError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return parse(text, path)


def write(path: str, text: str) -> bool:
    """Write ``text`` unless the file already holds exactly it; True when written."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    except (OSError, UnicodeDecodeError):
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


def remove(path: str) -> None:
    """Delete a golden and the folders it leaves empty (up to the ``__ptdbg__`` folder)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return
    parent = os.path.dirname(path)
    for _ in range(2):
        try:
            os.rmdir(parent)
        except OSError:
            return
        if os.path.basename(parent) == FOLDER:
            return
        parent = os.path.dirname(parent)


# ------------------------------------------------------------------------------ the store

def ci_mode(option: Optional[bool], environ: Optional[Dict[str, str]] = None) -> bool:
    """Missing goldens are never written: ``--ptdbg-golden-ci`` / ini, or a ``CI`` variable."""
    if option:
        return True
    env = os.environ if environ is None else environ
    value = env.get("CI", "")
    return bool(value) and value.strip().lower() not in ("0", "false", "no", "off")


def missing_message(nodeid: str, path: str, ci: bool) -> str:
    if ci:
        return (f"no golden for {nodeid}: {path}\n"
                f"  goldens are not created in CI (the CI variable or --ptdbg-golden-ci is set).\n"
                f"  create it locally and commit it:  pytest --ptdbg-update '{nodeid}'")
    return (f"golden created; run again: {nodeid} had no golden, this run wrote\n"
            f"  {path}\n  (review and commit it; the next run is judged against it)")


def iter_golden_files(folders: Iterable[str]) -> Iterator[str]:
    seen: Set[str] = set()
    for folder in sorted(set(folders)):
        if not os.path.isdir(folder):
            continue
        for base, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(SUFFIX):
                    path = os.path.abspath(os.path.join(base, name))
                    if path not in seen:
                        seen.add(path)
                        yield path


def search_folders(known_ids: Iterable[str], rootdir: str, root: Optional[str]) -> List[str]:
    """Folders that may hold goldens of this session: the explicit root, or the ``__ptdbg__``
    folders beside the test files collected."""
    if root:
        return [root]
    dirs = {os.path.dirname(nid.partition("::")[0]) for nid in known_ids}
    return [os.path.join(rootdir, d, FOLDER) for d in sorted(dirs)]


def unused_goldens(known_ids: Set[str], used: Set[str], ran_whole: Set[str], rootdir: str,
                   root: Optional[str], partial: Iterable[str] = ()) -> List[Dict[str, Any]]:
    """Goldens no test uses.

    ``known_ids``: every node id the collectors found (selected, deselected or skipped).
    ``used``: golden paths the session's tests read or wrote. ``ran_whole``: node ids whose
    test ran to its end (so a golden of a call it no longer makes is unused).
    ``partial``: test files (rootdir-relative) of which only some node ids were asked for.

    A golden is unused when its test's file was collected whole and its node id is not known,
    or its test file no longer exists, or its test ran whole without using it.
    """
    files = {nid.partition("::")[0] for nid in known_ids} - {p.replace("\\", "/") for p in partial}
    out = []
    for path in iter_golden_files(search_folders(known_ids, rootdir, root)):
        if path in used:
            continue
        try:
            nodeid = read(path).nodeid
        except GoldenError as exc:
            out.append({"nodeid": "?", "path": path, "why": str(exc)})
            continue
        file_part = nodeid.partition("::")[0]
        if nodeid in known_ids:
            if nodeid in ran_whole:
                out.append({"nodeid": nodeid, "path": path, "why": "the test no longer makes this call"})
            continue
        if file_part in files or not os.path.exists(os.path.join(rootdir, file_part)):
            out.append({"nodeid": nodeid, "path": path, "why": "the test no longer exists"})
    return sorted(out, key=lambda m: (m["nodeid"], m["path"]))


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
