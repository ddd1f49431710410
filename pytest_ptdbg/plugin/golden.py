"""Golden store: one small text file per test (and call) that a fresh run is judged against.

Where (``golden_path``): by default next to the test file, ``{test dir}/__ptdbg__/{test file
stem}/{test name}.golden.jsonl`` (``TestClass.test_x-param`` for a method with a parametrize
id; ``.call1`` and up for the later ``ptdbg_dump`` calls of one test). With ``--ptdbg-golden=DIR``
(ini ``ptdbg_golden``) under ``DIR/{test file path without .py}/`` instead.

What (``render``/``parse``): UTF-8 text, one JSON object per line, no timestamps, so that an
unchanged model gives the same bytes. The first line is the header (``{"format": "pytest-ptdbg
golden", "version": 2, "nodeid": ..., "call": n, "mode": ..., "device": ...}``), keys in a fixed
order, then one line per recorded call, in the order the step made them::

    {"k": "model.ln/layer_norm#0", "api": "Functional_layer_norm",
     "args": {"normalized_shape": [16], "eps": 1e-05},
     "forward": {"input.input": "@forward.output.0 model.fc1/linear#0",
                 "input.weight": ["float32", [16], [1, 1, 1, 4]], "output.0": [...]},
     "backward": {"input.0": [...], "output.weight": [...], "output.bias": [...]}}

``k`` is the call's identity: the stable key of ``callkeys.py`` (module path / operation # index
within the module); ``api`` the API as recorded (shown, never compared); ``args`` its non-tensor
arguments in their bound form (``comparison/arguments.bound_arguments``: by parameter name,
defaults filled, negative dims normalised, ignored parameters, devices and None left out; floats
to 7 significant digits); absent when the call could not be bound. ``forward``/``backward``: its
tensors by bound slot (``comparison/binding.py``: ``input.weight``; a backward gradient of an
input is ``output.weight``), each ``[dtype, shape, [max, min, mean, l2norm]]`` (``[..., [nan,
inf]]`` when there are any) at the digits the dtype's tolerance needs (:data:`STAT_DIGITS`
significant digits of max, min and the norm; the mean to the same decimal place as the larger
of max and min), or ``"@{direction}.{slot} {key}"``: the same values as that earlier entry (an
input that is an earlier call's output, passed on unchanged), so that a change of numbers
rewrites the lines of the calls whose own values change, not every line after them.
Version 1 goldens (one line per tensor, keyed by the recorded API) are not read: they fail
naming ``--ptdbg-update``. No torch here.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

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
VERSION = 2
#: significant digits kept of a Python float argument
DIGITS = 7
#: significant digits kept of a tensor's statistics, by dtype: a rounding at most a tenth of the
#: golden's drift allowance (``golden_check.DRIFT_TOL``) for that dtype; integers stay exact
STAT_DIGITS = {"float64": 11, "float32": 5, "float16": 5, "bfloat16": 4}
#: the direction members of a call line
DIRECTIONS = ("forward", "backward")
REF = "@"
#: the largest golden file read (a golden is a few hundred KB at most)
MAX_BYTES = 64 * 1024 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9._\-=+,]")
#: what a golden's ``api`` and tensor slots may be (they name the reference dump's records)
_API_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_SLOT_NAME = re.compile(r"(input|output)(\.[A-Za-z0-9_]+)*\Z")
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

def round_stat(value: Any, digits: int = DIGITS) -> Any:
    """A number as the golden keeps it: ``digits`` significant digits; NaN/Inf as strings."""
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
    r = float(f"{v:.{digits}g}")
    return 0.0 if r == 0 else r


def round_stats(stats: Sequence[Any], dtype: str) -> List[Any]:
    """max, min, mean, l2norm of a tensor of ``dtype`` at the digits its tolerance needs
    (:data:`STAT_DIGITS`): max, min and the norm to that many significant digits, the mean to
    the decimal place of the larger of max and min (a mean near zero is not more exact than
    the values it averages). Integer statistics stay exact."""
    digits = STAT_DIGITS.get(dtype, DIGITS)
    out = [round_stat(v, digits) for v in stats]
    if len(out) >= 3 and not isinstance(out[2], (str, bool)) and out[2] is not None:
        ends = [abs(v) for v in out[:2] if isinstance(v, (int, float)) and not isinstance(v, bool)]
        scale = max(ends or [0.0])
        if scale > 0 and math.isfinite(scale) and isinstance(out[2], float):
            places = digits - 1 - math.floor(math.log10(scale))
            r = float(f"{round(out[2], places):.{digits}g}")
            out[2] = 0.0 if r == 0 else r
    return out


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


def key_op(key: str) -> str:
    """The operation of a stable key (``model.ln/layer_norm#0`` -> ``layer_norm``)."""
    return key.rsplit("/", 1)[-1].rsplit("#", 1)[0]


def key_module(key: str) -> str:
    """The module path of a stable key (``model.ln/layer_norm#0`` -> ``model.ln``)."""
    return key.rsplit("/", 1)[0] if "/" in key else ""


def key_name(key: str) -> str:
    """A stable key without its module path (``layer_norm#0``)."""
    return key.rsplit("/", 1)[-1]


@dataclass
class Call:
    """One call of a golden (or of a fresh run read for one), references resolved.

    ``tensors``: ``{"forward.input.weight": {"dtype", "shape", "stats"[, "nonfinite"]}}``."""

    key: str
    api: str
    args: Optional[Dict[str, Any]]
    tensors: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    line: int = 0
    #: the dataflow the references show: ``{"forward.input.input": (producer's key, "forward.output.0")}``
    #: for an input that holds an earlier call's output
    sources: Dict[str, Tuple[str, str]] = field(default_factory=dict)

    @property
    def op(self) -> str:
        return key_op(self.key)

    @property
    def module(self) -> str:
        return key_module(self.key)


@dataclass
class Golden:
    """A parsed golden: its header, its call lines as written, and its calls (references resolved)."""

    path: str
    header: Dict[str, Any]
    lines: List[Dict[str, Any]] = field(default_factory=list)
    calls: List[Call] = field(default_factory=list)

    @property
    def nodeid(self) -> str:
        return str(self.header.get("nodeid", ""))


def tensor_entry(dtype: str, shape: Sequence[int], stats: Sequence[Any],
                 nonfinite: Optional[Sequence[int]] = None) -> List[Any]:
    """A tensor as a call line holds it: ``[dtype, shape, stats]`` (``+ [nan, inf]``)."""
    out: List[Any] = [dtype, list(shape), list(stats)]
    if nonfinite and any(nonfinite):
        out.append(list(nonfinite))
    return out


def reference(t: str, key: str) -> str:
    """An entry that holds the same values as entry ``t`` of call ``key``."""
    return f"{REF}{t} {key}"


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


def _entry_problem(t: str, entry: Any) -> str:
    """What is wrong with one tensor entry ("" when nothing)."""
    if isinstance(entry, str):
        ref_t, sep, ref_k = entry[len(REF):].partition(" ")
        if not entry.startswith(REF) or not sep or not ref_k or "." not in ref_t:
            return f"tensor {t}: a reference is '@direction.slot key', not {entry[:60]!r}"
        return ""
    if not (isinstance(entry, list) and len(entry) in (3, 4)):
        return f"tensor {t}: expected [dtype, shape, stats] or a reference"
    dtype, shape, stats = entry[:3]
    if not isinstance(dtype, str):
        return f"tensor {t}: 'dtype' must be a string"
    if not isinstance(shape, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0
                                          for x in shape):
        return f"tensor {t}: 'shape' {json.dumps(shape)[:60]} is not a list of sizes"
    if not isinstance(stats, list):
        return f"tensor {t}: 'stats' must be a list"
    for i, value in enumerate(stats):
        why = _stat_problem(value)
        if why:
            return f"statistic {i} of {t}: {why}"
    if len(entry) == 4:
        nonfinite = entry[3]
        if not (isinstance(nonfinite, list) and len(nonfinite) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in nonfinite)):
            return f"tensor {t}: NaN/Inf counts must be two counts [nan, inf]"
    return ""


def _line_problem(obj: Dict[str, Any]) -> str:
    """What is wrong with one call line ("" when nothing)."""
    if not isinstance(obj.get("k"), str) or not isinstance(obj.get("api", ""), str):
        return "a golden call line needs 'k' (and 'api') strings"
    if obj.get("api") and not _API_NAME.match(obj["api"]):
        # the reference dump names its records after it
        return f"'api' must be a recorded API name (Type_name), not {obj['api'][:60]!r}"
    if obj.get("args") is not None and not isinstance(obj.get("args"), dict):
        return "'args' must be an object or null"
    extra = set(obj) - {"k", "api", "args", *DIRECTIONS}
    if extra:
        return f"unknown member {sorted(extra)[0]!r} (a version {VERSION} call line)"
    for direction in DIRECTIONS:
        tensors = obj.get(direction, {})
        if not isinstance(tensors, dict):
            return f"'{direction}' must be an object"
        for slot, entry in tensors.items():
            if not _SLOT_NAME.match(slot):
                return f"'{direction}' holds {slot[:60]!r}, not a tensor slot (input.weight, output.0)"
            why = _entry_problem(f"{direction}.{slot}", entry)
            if why:
                return why
    return ""


def _entry(raw: List[Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"dtype": raw[0], "shape": list(raw[1]), "stats": list(raw[2])}
    if len(raw) == 4 and any(raw[3]):
        out["nonfinite"] = list(raw[3])
    return out


def resolve(lines: List[Dict[str, Any]], path: str = "", first_line: int = 2) -> List[Call]:
    """The calls of call lines, every reference replaced by the entry it names (GoldenError,
    naming ``path:line``, for a reference to nothing)."""
    calls: List[Call] = []
    concrete: Dict[Tuple[str, str], Dict[str, Any]] = {}
    refs: List[Tuple[Call, str, str, int]] = []
    for n, obj in enumerate(lines, first_line):
        call = Call(obj["k"], str(obj.get("api", "")), obj.get("args"), {}, n)
        for direction in DIRECTIONS:
            for slot, entry in (obj.get(direction) or {}).items():
                t = f"{direction}.{slot}"
                if isinstance(entry, str):
                    refs.append((call, t, entry, n))
                    call.tensors[t] = {}
                else:
                    call.tensors[t] = concrete[(call.key, t)] = _entry(entry)
        calls.append(call)
    for call, t, entry, n in refs:
        ref_t, _, ref_k = entry[len(REF):].partition(" ")
        target = concrete.get((ref_k, ref_t))
        if target is None:
            raise GoldenError(f"{path}:{n}: tensor {t} of {call.key} refers to {ref_t} of {ref_k}, "
                              f"which the golden does not hold")
        call.tensors[t] = dict(target)
        if ref_t.startswith("forward.output"):
            call.sources[t] = (ref_k, ref_t)
    return calls


def parse(text: str, path: str) -> Golden:
    """A golden's text; GoldenError names ``path:line`` for anything it cannot use: a line that is
    not one JSON object, a member given twice, a call given twice, a statistic that is not a
    number (NaN/Inf only as the strings the golden writes), a reference to nothing, a golden of
    another format version (version 1: rewrite it with ``--ptdbg-update``)."""
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
        if n == 1:
            if obj.get("format") == FORMAT and obj.get("version") != VERSION and "nodeid" in obj:
                raise GoldenError(
                    f"{path}:1: a golden of format version {obj.get('version')!r}; this "
                    f"pytest-ptdbg reads version {VERSION} (calls keyed by what they compute, "
                    f"one line per call): re-create it from a run you trust with --ptdbg-update")
            if obj.get("format") != FORMAT or "nodeid" not in obj:
                raise GoldenError(f"{path}:1: not a pytest-ptdbg golden header (format {FORMAT!r}, "
                                  f"version {VERSION}, nodeid)")
        out.append(obj)
    seen: Dict[str, int] = {}
    for n, obj in enumerate(out[1:], 2):
        why = _line_problem(obj)
        if why:
            raise GoldenError(f"{path}:{n}: {why}")
        if obj["k"] in seen:
            raise GoldenError(f"{path}:{n}: corrupt golden: call {obj['k']} is recorded twice (first "
                              f"at line {seen[obj['k']]})")
        seen[obj["k"]] = n
    return Golden(path, out[0], out[1:], resolve(out[1:], path))


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
