"""Read a dump (ptdbg v4 ``.pkl`` + ``.npy``, or msprobe ``dump.json``) into API records. No torch.

- :func:`locate` finds the record file and data directory from a dump_path, step, rank folder or file.
- :func:`read_dump` parses it into a :class:`Dump`: APIs grouped by API key in order of first
  appearance, each with its tensor records (file order) and stack. A corrupt or truncated line is
  reported in ``Dump.problems`` as ``file:line: why`` and the rest is kept.

Every entry of ``Dump.problems`` means some of the dump could not be used: compare counts each
against its verdict. ``Dump.notes`` holds what is worth saying but fails nothing (a ptdbg/msprobe
dump's completeness is unknown). Completeness follows ``format/manifest.py``'s rule
(``Dump.completeness``). Only regular files are read (a FIFO or device in place of a file is
refused by ``fstat`` before any read), lines are bounded in length and JSON nesting depth.
"""
from __future__ import annotations

import json
import json.scanner
import os
import re
import stat as _stat
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from pytest_ptdbg.format import records
from pytest_ptdbg.runtime.gc_pause import paused_gc
from pytest_ptdbg.format.manifest import Completeness, aside_name, is_marked_aside, judge_completeness
from pytest_ptdbg.dump.validate import call_problem, stats_problem

MSPROBE_JSON = "dump.json"
MSPROBE_STACK = "stack.json"
MSPROBE_DATA = "dump_tensor_data"
#: a ``.pkl`` line longer than this is refused (records are short; a deep stack is a few KB)
MAX_LINE_BYTES = 16 << 20
#: JSON nesting deeper than this is refused before parsing (a record nests 4 levels, a call spec a few more)
MAX_DEPTH = 64
#: corrupt lines reported one by one; beyond, one summary line
MAX_LINE_PROBLEMS = 50
#: missing data files named in a problem (the rest are counted)
MAX_NAMED = 3


@dataclass(slots=True)
class TensorRec:
    """One tensor record (slotted: a 50 000-call step holds a few hundred thousand of them)."""

    name: str
    api: str
    io: str
    index: Tuple[Any, ...]           # ints; msprobe's keyword arguments have their name (input.weight)
    direction: str
    dtype: str
    shape: Tuple[int, ...]
    stats: list
    extra: dict
    line: int
    data_file: Optional[str] = None   # safe path of the saved tensor, when there is one
    data_problem: str = ""            # why there is none although the dump has a data dir
    data_inode: int = 0               # inode of data_file (hard-linked copies share it)
    #: ``input.0`` / ``output.1.0``: the tensor's place within its API (computed when not given)
    slot: str = ""
    #: the slot named by its parameter (``input.weight``; ``comparison/binding.py``), "" until bound
    param: str = ""

    def __post_init__(self) -> None:
        if not self.slot:
            self.slot = f"{self.io}." + ".".join(str(i) for i in self.index)

    @property
    def index_str(self) -> str:
        return self.slot[len(self.io) + 1:]

    @property
    def nonfinite(self) -> int:
        return int(self.extra.get("nan", 0) or 0) + int(self.extra.get("inf", 0) or 0)


@dataclass(slots=True)
class ApiRec:
    """All records of one API call (one direction; slotted: a 50 000-call step holds 50 000)."""

    key: str
    api_type: str
    api_name: str
    call_index: int
    direction: str
    order: int
    tensors: List[TensorRec] = field(default_factory=list)
    stack: Optional[list] = None
    ctx: str = ""
    #: ``{Type}_{api}`` (e.g. ``Functional_softmax``), computed when not given
    family: str = ""
    #: the operation it computes (``softmax`` for every spelling; ``comparison/binding.py``), "" until bound
    op: str = ""
    #: the dataflow (forward calls of this project's dumps; the call spec's optional ``"src"``, moved
    #: here: the record's call spec is kept without it):
    #: input slot -> (forward key of the recorded call that produced it, its output slot), e.g.
    #: ``{"input.0": ("Functional_linear_3_forward", "output.0")}``; empty: not known
    sources: Dict[str, Tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.family:
            self.family = f"{self.api_type}_{self.api_name}"


@dataclass
class Dump:
    """A parsed dump of one rank."""

    source: str
    data_dir: Optional[str]
    layout: str                     # "ptdbg" | "msprobe"
    mode: str                       # "api_stack", "all", "list", ... ("" unknown)
    apis: List[ApiRec]
    problems: List[str]
    has_data: bool = False          # some tensor has a data file
    notes: List[str] = field(default_factory=list)   # worth saying, fails nothing
    completeness: Optional[Completeness] = None
    #: records name data files that are not there: how many, the first few (``""``: none, or not
    #: looked up). In ``problems`` too when no record has its file (the compare could only fall
    #: back to statistics); otherwise each such record's ``data_problem`` fails its row
    missing_data: str = ""

    @property
    def n_tensors(self) -> int:
        return sum(len(a.tensors) for a in self.apis)

    @property
    def environment(self) -> Optional[Dict[str, Any]]:
        """The arithmetic environment the dump's manifest recorded (``format/environment.py``), or None."""
        return self.completeness.environment if self.completeness is not None else None


@dataclass
class Located:
    path: str
    data_dir: Optional[str]
    layout: str


# ---------------------------------------------------------------------------------------- locate

def _rank_sort_key(name: str) -> Tuple[int, str]:
    m = re.match(r"^(?:rank|step|proc)(\d+)$", name)
    return (int(m.group(1)), name) if m else (1 << 62, name)


def locate(path: str) -> Located:
    """Find the record file and data dir of one rank from a file, rank, step or dump_path folder.

    Raises FileNotFoundError when nothing is found, ValueError when the folder holds several
    ranks/steps/modes (naming them).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    if not os.path.isfile(path) and not os.path.isdir(path):
        raise ValueError(f"{path}: not a regular file or folder (a device, FIFO or socket): not read")
    if os.path.isfile(path):
        base = os.path.basename(path)
        if base.endswith(".json"):
            d = os.path.join(os.path.dirname(path), MSPROBE_DATA)
            return Located(path, d if os.path.isdir(d) else None, "msprobe")
        d = path[:-4] if path.endswith(".pkl") else path + "_data"
        return Located(path, d if os.path.isdir(d) else None, "ptdbg")
    entries = sorted(os.listdir(path))
    pkls = [e for e in entries if e.endswith("_dump.pkl") and os.path.isfile(os.path.join(path, e))]
    if pkls:
        if len(pkls) > 1:
            preferred = [p for p in pkls if p == records.pkl_name("api_stack")]
            if not preferred:
                raise ValueError(f"{path}: several dumps ({', '.join(pkls)}); pass the .pkl file")
            pkls = preferred
        return locate(os.path.join(path, pkls[0]))
    if MSPROBE_JSON in entries:
        return locate(os.path.join(path, MSPROBE_JSON))
    if records.DUMP_DIR_NAME in entries:
        return locate(os.path.join(path, records.DUMP_DIR_NAME))
    for prefix, what in (("rank", "ranks"), ("proc", "process folders"), ("step", "steps")):
        subs = sorted((e for e in entries if re.match(rf"^{prefix}\d+$", e)
                       and os.path.isdir(os.path.join(path, e))), key=_rank_sort_key)
        if len(subs) == 1:
            return locate(os.path.join(path, subs[0]))
        if len(subs) > 1:
            hint = " (use compare_distributed)" if prefix == "rank" else ""
            raise ValueError(f"{path}: holds {len(subs)} {what} ({', '.join(subs)}); pass one of them{hint}")
    raise FileNotFoundError(f"{path}: no ptdbg '*_dump.pkl' or msprobe 'dump.json' found in this folder")


def rank_dirs(step_dir: str) -> List[Tuple[int, str]]:
    """``[(rank, path), ...]`` of a step folder in numeric order; ValueError if it holds anything else."""
    if not os.path.isdir(step_dir):
        raise FileNotFoundError(f"{step_dir}: step folder not found")
    out, other = [], []
    for e in os.listdir(step_dir):
        m = re.match(r"^rank(\d+)$", e)
        if m and os.path.isdir(os.path.join(step_dir, e)):
            out.append((int(m.group(1)), os.path.join(step_dir, e)))
        elif re.match(r"^rank\d+\.lock$", e):
            continue  # a writer's lock (left behind by a killed run): its rank's manifest says incomplete
        elif is_marked_aside(os.path.join(step_dir, e)):
            continue  # an old rank folder a killed re-dump set aside (its next writer deletes it)
        else:
            other.append(e)
    if other:
        left = [e for e in sorted(other) if aside_name(e)]
        hint = (f" ({', '.join(left)}: left by an interrupted re-dump but not marked by pytest-ptdbg; "
                "delete it if it is not yours)") if left else ""
        raise ValueError(f"{step_dir}: must hold only rank<N> folders, also found {sorted(other)}{hint}")
    if not out:
        raise ValueError(f"{step_dir}: holds no rank<N> folder")
    return sorted(out)


# ---------------------------------------------------------------------------------------- reading

def read_dump(path: str, data_dir: Optional[str] = None) -> Dump:
    """Read a dump from a file or folder (see :func:`locate`); ``data_dir`` overrides the found one.

    ``data_dir=""`` means statistics only (no tensors are looked up). Otherwise records that name
    a data file promise it: a ``.pkl`` whose records name files that are missing (some, all, or
    their whole folder) gets ``missing_data`` saying how many, naming the first few (:data:`MAX_NAMED`),
    a problem too when none of its files is there (see :class:`Dump`).
    """
    loc = locate(path)
    dd = loc.data_dir if data_dir is None else (data_dir or None)
    with paused_gc():
        if loc.layout == "msprobe":
            return _read_msprobe(loc.path, dd)
        expected = None
        if data_dir is None and dd is None:   # the folder beside the .pkl, where the writer puts them
            expected = loc.path[:-4] if loc.path.endswith(".pkl") else loc.path + "_data"
        return _read_ptdbg(loc.path, dd, check_files=data_dir != "", expected_dir=expected)


class _Builder:
    def __init__(self, source: str, data_dir: Optional[str], problems: List[str]):
        self.source = source
        self.apis: Dict[str, ApiRec] = {}
        self.problems = problems
        self.data_dir = data_dir
        #: the data directory's listing: name -> (inode, is a symbolic link, is a regular file)
        self.files: Optional[Dict[str, Tuple[int, bool, bool]]] = None
        #: records naming a data file (``extra["npy"]``), and the paths of those whose file is absent
        self.named = 0
        self.absent: List[str] = []
        #: shared objects for repeated values (dtypes, shapes, slots, extras); None: no sharing
        self.pool: Optional[Dict[Any, Any]] = {}
        #: ``id(extra) -> (extra, its kept form)`` of the fast path's shared extras
        self.kept_of: Dict[int, Tuple[dict, dict]] = {}
        #: :func:`_add_fast`'s ``(dtype, shape text, extra text) -> what records spelling them share``
        self.shared: Dict[Tuple[str, str, str], Any] = {}
        #: worth saying, fails nothing (a malformed dataflow field, ignored)
        self.notes: List[str] = []
        self._root: Optional[str] = None   # realpath of data_dir, resolved once (for symlinks)
        if data_dir is not None:
            if os.path.isdir(data_dir):
                try:
                    self.files = {e.name: (e.inode(), e.is_symlink(), _is_regular(e))
                                  for e in os.scandir(data_dir)}
                except OSError as e:
                    problems.append(f"{data_dir}: cannot list data directory ({e})")
                    self.files = {}
            else:
                problems.append(f"{data_dir}: data directory not found (statistics only)")
                self.data_dir = None

    def api(self, key: str, parsed: records.ParsedName) -> ApiRec:
        a = self.apis.get(key)
        if a is None:
            pool = self.pool if self.pool is not None else {}
            # API types, names and directions repeat: one string object each
            t = pool.setdefault(("s", parsed.api_type), parsed.api_type)
            n = pool.setdefault(("s", parsed.api_name), parsed.api_name)
            d = pool.setdefault(("s", parsed.direction), parsed.direction)
            a = self.apis[key] = ApiRec(key, t, n, parsed.call_index, d, len(self.apis),
                                        family=pool.setdefault(("f", t, n), f"{t}_{n}"))
        return a

    def resolve(self, t: TensorRec, file_name: Optional[str], expected: bool = True) -> None:
        """Set ``t.data_file`` to the record's data file inside the data directory.

        Names are checked as plain strings (one path component, no ``..``) against one listing of
        the folder: a regular file listed there cannot be anywhere else. A symbolic link is
        followed only when its target resolves inside the data directory (its realpath is
        computed once); one pointing outside is refused (ValueError naming the record).
        ``expected=False``: no file is expected (a Python scalar of a dump without ``extra``):
        a missing one is no problem.
        """
        files, data_dir = self.files, self.data_dir
        if files is None or data_dir is None:  # a listing exists only for a data directory
            return
        fname = file_name if file_name is not None else records.data_file_name(t.name)
        if (not fname or fname in (".", "..") or "/" in fname or "\\" in fname or "\x00" in fname
                or os.sep in fname):
            raise ValueError(f"data file name {fname!r} of record {t.name!r} points outside the data directory")
        entry = files.get(fname)
        if entry is None:
            if expected:
                t.data_problem = f"{os.path.join(data_dir, fname)}: data file of {t.name!r} not found"
            return
        t.data_inode = entry[0]
        path = os.path.join(data_dir, fname)
        if not entry[2]:
            t.data_problem = f"{path}: data file of {t.name!r} is not a regular file (a FIFO, device or " \
                             "broken link): not read"
            return
        if entry[1]:  # a symbolic link: only when it stays inside the data directory
            root = self._root
            if root is None:
                root = self._root = os.path.realpath(data_dir)
            target = os.path.realpath(path)
            if os.path.commonpath([root, target]) != root:
                raise ValueError(f"data file {fname!r} of record {t.name!r} is a symbolic link to "
                                 f"{target!r}, outside the data directory {data_dir!r}: not read")
        t.data_file = path

    def done(self, layout: str, mode: str) -> Dump:
        apis = list(self.apis.values())
        has = any(t.data_file for a in apis for t in a.tensors)
        return Dump(self.source, self.data_dir, layout, mode, apis, self.problems, has, notes=self.notes)


def _is_regular(entry: "os.DirEntry") -> bool:
    try:
        return entry.is_file()     # follows a symbolic link; False for FIFOs, devices, sockets
    except OSError:
        return False


def _shape(v: Any) -> Tuple[int, ...]:
    if v.__class__ is list and all(s.__class__ is int for s in v):   # the common case
        return tuple(v)
    if isinstance(v, str) and v.replace(" ", "") == "[]":
        return ()   # ptdbg v4 writes a Python scalar's shape as the string "[]"
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, int) and not isinstance(s, bool) for s in v):
        raise ValueError(f"shape must be a list of ints, got {v!r}")
    return tuple(v)


def _open_regular(path: str, what: str):
    """Open ``path`` for binary reading only when it is a regular file (never blocks on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise FileNotFoundError(f"{path}: cannot open {what} ({e.strerror})") from None
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: {what} is not a regular file (a device, FIFO or socket): not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def nesting_ok(value: Any, limit: int = MAX_DEPTH, brackets: Optional[int] = None) -> bool:
    """Whether parsed JSON ``value`` nests at most ``limit`` deep.

    ``brackets``: the number of ``[`` and ``{`` in its text, when known: at most ``limit`` of them
    cannot nest deeper, and a stack record whose text holds exactly one per frame (+2) has flat
    frames; only other values are walked (iteratively, stopping at the first too deep).
    """
    if brackets is not None:
        if brackets <= limit:
            return True
        if (isinstance(value, list) and len(value) == 2 and isinstance(value[1], list)
                and brackets == 2 + len(value[1]) and all(type(f) is list for f in value[1])):
            return True
    todo = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if d > limit:
            return False
        if isinstance(v, list):
            todo.extend((x, d + 1) for x in v if isinstance(x, (list, dict)))
        elif isinstance(v, dict):
            todo.extend((x, d + 1) for x in v.values() if isinstance(x, (list, dict)))
    return True


def _lines(f, pkl: str, problems: List[str]):
    """``(lineno, text, complete)`` of a binary file; over-long lines reported and skipped."""
    lineno = 0
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = f.readline(MAX_LINE_BYTES + 1)
            problems.append(f"{pkl}:{lineno}: line longer than {MAX_LINE_BYTES} bytes skipped (not a ptdbg record)")
            continue
        yield lineno, raw, raw.endswith(b"\n")


def _missing_data(b: _Builder, expected_dir: Optional[str]) -> Optional[str]:
    """The problem of records that name data files which are not there, or None."""
    if not b.absent:
        return None
    n, first = len(b.absent), ", ".join(b.absent[:MAX_NAMED]) + (", ..." if len(b.absent) > MAX_NAMED else "")
    if b.data_dir is None:
        where = expected_dir or "(none found)"
        return (f"{b.source}: {n} records name data files but their data folder {where} is missing "
                f"(first: {first}): the dump's tensors are gone; pass data_dir='' (--summary) to "
                "compare its statistics only")
    return (f"{b.data_dir}: {n} of the {b.named} records that name a data file have no file there "
            f"(first missing: {first}): those records are unusable")


def _read_ptdbg(pkl: str, data_dir: Optional[str], check_files: bool = False,
                expected_dir: Optional[str] = None) -> Dump:
    problems: List[str] = []
    b = _Builder(pkl, data_dir, problems)
    base = os.path.basename(pkl)
    mode = base[: -len("_dump.pkl")] if base.endswith("_dump.pkl") else ""
    f = _open_regular(pkl, "the record file")
    stacks: Dict[str, list] = {}
    complete_lines = 0
    ours = False
    bad = 0
    # stack records repeat (every layer's calls come from the same lines of code): one parse per
    # distinct text, and the APIs share one frames list
    stack_cache: Dict[bytes, list] = {}
    names: Dict[str, Tuple[records.ParsedName, str]] = {}
    fast = _FastLines()
    rec: Any  # one parsed JSON line
    with f:
        for lineno, raw, whole in _lines(f, pkl, problems):
            if raw.isspace():   # (bytes.strip's whitespace)
                continue
            if whole:
                complete_lines += 1
            skey = None
            if whole and raw.startswith(b'["'):
                j = raw.find(b'"', 2)
                if j > 13 and raw[j - 11:j] == b"_stack_info" and b"\\" not in raw[2:j]:
                    skey = raw[j + 1:]
                    frames = stack_cache.get(skey)
                    if frames is not None:
                        stacks[raw[2:j - 11].decode("utf-8", "replace")] = frames
                        continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line = ""
            if not line or "\x00" in line:
                rec, why = None, "binary or non-UTF-8 bytes (not a ptdbg text record)"
            else:
                rec = fast.parse_split(line)
                try:
                    if rec is None:
                        rec = json.loads(line)
                    why = ""
                except json.JSONDecodeError as e:
                    rec, why = None, e.msg
                except ValueError as e:   # not a syntax error: an integer past Python's digit limit
                    rec, why = None, str(e)
                except RecursionError:
                    rec, why = None, f"JSON nested deeper than {MAX_DEPTH} levels"
                if not why and not fast.hit and not nesting_ok(rec, MAX_DEPTH, line.count("[") + line.count("{")):
                    rec, why = None, f"JSON nested deeper than {MAX_DEPTH} levels"
            if why:
                bad += 1
                what = "truncated" if not whole else "corrupt"
                if bad <= MAX_LINE_PROBLEMS:
                    problems.append(f"{pkl}:{lineno}: {what} line skipped ({why})")
                continue
            if isinstance(rec, list) and len(rec) > 6 and isinstance(rec[6], dict):
                ours = True
            try:
                if fast.key is not None and _add_fast(b, rec, fast.key, fast.src, fast.npy, lineno, names):
                    continue
                _add_ptdbg_record(b, rec, lineno, stacks, names, fast.src if fast.hit else None, fast.hit)
                if skey is not None and records.is_stack_record(rec):
                    stack_cache[skey] = stacks[rec[0][: -len(records.STACK_SUFFIX)]]
            except ValueError as e:
                bad += 1
                if bad <= MAX_LINE_PROBLEMS:
                    problems.append(f"{pkl}:{lineno}: {e}")
    if bad > MAX_LINE_PROBLEMS:
        problems.append(f"{pkl}: {bad - MAX_LINE_PROBLEMS} more unreadable lines not listed ({bad} in all)")
    for key, frames in stacks.items():
        a = b.apis.get(key)
        if a is None:
            try:
                a = b.api(key, records.parse_name(key))
            except ValueError as e:
                problems.append(f"{pkl}: stack record: {e}")
                continue
        a.stack = frames
    missing = _missing_data(b, expected_dir) if check_files else None
    dump = b.done("ptdbg", mode)
    if missing is not None:
        dump.missing_data = missing
        if not dump.has_data:
            problems.append(missing)
    dump.completeness = judge_completeness(pkl, complete_lines, ours)
    if dump.completeness.failed:
        problems.append(dump.completeness.message)
    elif dump.completeness.status == "unknown":
        dump.notes.append(dump.completeness.message)
    return dump


#: a tensor record line as this project's writer spells it: name and dtype strings without escapes,
#: ``0``/``1``, ``[]``, the shape, the statistics (numbers only) and the optional extra object
_RECORD_LINE = re.compile(r'\["([^"\\\x00-\x1f]*)", ([01]), \[\], "([^"\\\x00-\x1f]*)", (\[[0-9, ]*\]), '
                          r'(\[[^\[\]{}"\\]*\])(?:, (\{.*\}))?\]\n?\Z', re.S)
#: ``(value, end)`` of the JSON value starting at an index of a text (``json.loads``'s scanner;
#: StopIteration where none starts there)
_SCAN: Callable[[str, int], Tuple[Any, int]] = json.scanner.make_scanner(cast(Any, json.JSONDecoder()))
#: distinct extras (without their data file name and dataflow) and shapes remembered by their
#: text, and the parts records share (``_Builder.shared``): at most this many each
FAST_CACHE_MAX = 1 << 16


class _FastLines:
    """Parse a record line of the common form (:data:`_RECORD_LINE`) without building it through
    ``json.loads`` field by field: the name and dtype are taken as they are (no escapes), the
    shape, statistics and extra are JSON-parsed on their own, the shape and the extra once per
    distinct text (the extra's data file name and dataflow split off first: they differ from
    record to record), their objects shared by the records spelling them alike (records are
    read-only). :meth:`parse` returns exactly ``json.loads(line)``, or
    None for any other line (which then goes through ``json.loads`` and every check); ``hit``:
    the last line was parsed here (its nesting is checked here: the extra at most
    ``MAX_DEPTH - 1`` deep)."""

    __slots__ = ("shapes", "extras", "hit", "src", "key", "npy")

    def __init__(self) -> None:
        self.shapes: Dict[str, Any] = {}
        self.extras: Dict[str, Any] = {}
        self.hit = False
        #: the last line's call-spec dataflow (``"src"``), split off its extra (see :func:`_split_src`)
        self.src: Any = None
        #: the last line's data file name, split off its extra (see :func:`_split_npy`), or None
        self.npy: Optional[str] = None
        #: the last line's ``(dtype, shape text, extra text without "src" and the file's name)``
        #: when it has an extra whose dataflow and data file name (if any) were split off, else
        #: None: what the record shares with the records spelling these three alike (:func:`_add_fast`)
        self.key: Optional[Tuple[str, str, str]] = None

    def parse(self, line: str) -> Optional[list]:
        rec = self.parse_split(line)
        if rec is not None and self.src is not None:
            call = dict(rec[6]["call"])
            call["src"] = self.src
            rec[6] = dict(rec[6])
            rec[6]["call"] = call
        return rec

    def parse_split(self, line: str) -> Optional[list]:
        """:meth:`parse`, with the call spec's dataflow (``"src"``) split off into :attr:`src`
        (the extra is the spec without it, shared by the records spelling it alike)."""
        self.hit = False
        self.src = None
        self.key = None
        self.npy = None
        m = _RECORD_LINE.match(line)
        if m is None:
            return None
        name, flag, dtype, shape_text, stats_text, extra_text = m.groups()
        try:
            shape = self.shapes.get(shape_text)
            if shape is None:
                shape = json.loads(shape_text)
                if len(self.shapes) >= FAST_CACHE_MAX:
                    self.shapes.clear()
                self.shapes[shape_text] = shape
            try:   # json.loads's own scanner, without its wrapper (the text starts with "[")
                stats, end = _SCAN(stats_text, 0)
            except StopIteration:
                return None
            if end != len(stats_text):
                return None
            if extra_text is None:
                self.hit = True
                return [name, int(flag), [], dtype, shape, stats]
            src_text: Optional[str] = None
            npy: Optional[str] = None
            if '"src": {' in extra_text:
                extra_text, src_text = _split_src(extra_text)
            if '"npy": "' in extra_text:
                extra_text, npy = _split_npy(extra_text)
            extra = self.extras.get(extra_text)
            if extra is None:
                extra = json.loads(extra_text)
                if not isinstance(extra, dict) or not nesting_ok(
                        extra, MAX_DEPTH - 1, extra_text.count("[") + extra_text.count("{")):
                    return None
                if npy is not None and extra.get("npy") != "":
                    return None   # the name was not the extra's own member: the whole line is parsed
                if npy is not None or '"npy"' not in extra_text:
                    if len(self.extras) >= FAST_CACHE_MAX:
                        self.extras.clear()
                    self.extras[extra_text] = extra
            if npy is not None:   # the record's own extra: the shared one with its file's name
                extra = dict(extra)
                extra["npy"] = npy
            if src_text is not None:
                if next(reversed(extra), None) != "call" or not isinstance(extra["call"], dict) \
                        or "src" in extra["call"]:
                    return None   # not the call spec's own last member: the whole line is parsed
                try:
                    self.src, end = _SCAN(src_text, 0)
                except StopIteration:
                    return None
                if end != len(src_text):
                    return None
            if (npy is not None or '"npy"' not in extra_text) and (src_text is not None or '"src"' not in extra_text):
                # no data file name or dataflow left in the extra (split off, or none: a "src"
                # anywhere else, e.g. scatter's keyword, leaves the record to the checked path)
                self.key = (dtype, shape_text, extra_text)
                self.npy = npy
        except (ValueError, RecursionError):
            return None    # the whole line's json.loads says why
        self.hit = True
        return [name, int(flag), [], dtype, shape, stats, extra]


def _split_src(extra_text: str) -> Tuple[str, Optional[str]]:
    """``(extra without its call spec's "src", the "src" object's text)`` of an extra written as
    this project's writer writes it (``..., "call": {..., "src": {flat}}}``, no escapes), else
    ``(extra_text, None)``. The dataflow names the producing calls, so it differs from call to
    call; without it, the extras of repeated calls are one text (parsed once, one shared object)."""
    i = extra_text.rfind(', "src": {')
    if i < 0 or not extra_text.endswith("}}}") or "\\" in extra_text or extra_text.count('"', 0, i) % 2:
        return extra_text, None
    src_text = extra_text[i + 9:-2]
    if "{" in src_text[1:] or "}" in src_text[:-1]:
        return extra_text, None
    return extra_text[:i] + "}}", src_text


def _split_npy(extra_text: str) -> Tuple[str, Optional[str]]:
    """``(extra with its data file's name left out, the name)`` of an extra holding one
    ``"npy": "NAME"`` and no escapes (the name becomes ``""``: a valid text, the same for every
    record of a call repeated), else ``(extra_text, None)``. The caller checks that the member
    belongs to the extra itself."""
    k = extra_text.find('"npy": "')
    if k < 0 or "\\" in extra_text or extra_text.find('"npy"', k + 5) >= 0 or extra_text.count('"', 0, k) % 2:
        return extra_text, None
    e = extra_text.find('"', k + 8)
    if e < 0:
        return extra_text, None
    return extra_text[:k + 8] + extra_text[e:], extra_text[k + 8:e]


_Split = Tuple[str, records.ParsedName, str, Tuple[int, ...], str]


def _split_name(name: str, names: Dict[str, Tuple[records.ParsedName, str]]) -> Optional[_Split]:
    """``(api key, parsed API key, io, index, slot)`` of a tensor name, the API key parsed once
    (cached in ``names``); None where the quick split does not apply (then ``parse_name`` decides)."""
    i = name.rfind("put.")
    if i < 3:
        return None
    if name[i - 3:i] in ("_in", ".in"):
        cut = i - 3
    elif name[i - 4:i] in ("_out", ".out"):
        cut = i - 4
    else:
        return None
    rest = name[cut + 1:]
    slot = _slots.get(rest)
    if slot is None:
        io, _, idx = rest.partition(".")
        if len(idx) == 1 and idx.isdigit():
            parts = [idx]
        else:
            parts = idx.split(".")
            for q in parts:
                if not (q.isascii() and q.isdigit()) or (len(q) > 1 and q[0] == "0"):
                    return None
        if len(_slots) >= FAST_CACHE_MAX:
            _slots.clear()
        slot = _slots[rest] = ("input" if io == "input" else ("output" if io == "output" else io),
                               tuple(int(q) for q in parts), rest)
    key = name[:cut]
    hit = names.get(key)
    if hit is None:
        try:
            p = records.parse_name(key)
        except ValueError:
            return None
        if p.io is not None:
            return None
        hit = names[key] = (p, key)
    return hit[1], hit[0], slot[0], slot[1], slot[2]


#: ``slot text -> (io, index, slot)`` of the quick split (a pure function of the text: a step
#: spells a few hundred distinct slots)
_slots: Dict[str, Tuple[str, Tuple[int, ...], str]] = {}


def _add_ptdbg_record(b: _Builder, rec: Any, lineno: int, stacks: Dict[str, list],
                      names: Optional[Dict[str, Tuple[records.ParsedName, str]]] = None,
                      src: Any = None, fast_hit: bool = False) -> None:
    """Add one parsed line. A call spec's dataflow (``"src"``: given split off by
    :class:`_FastLines`, or found in the spec) becomes ``ApiRec.sources``; the record's extra
    keeps the spec without it. ``fast_hit``: ``rec`` came from :class:`_FastLines`, whose extras
    without a data file are one object per distinct text."""
    if not isinstance(rec, list) or not rec or not isinstance(rec[0], str):
        raise ValueError("not a ptdbg record (expected a JSON array starting with a name)")
    if records.is_stack_record(rec):
        frames = rec[1] if len(rec) > 1 else None
        if not isinstance(frames, list):
            raise ValueError(f"stack record {rec[0]!r}: frames must be a list")
        stacks[rec[0][: -len(records.STACK_SUFFIX)]] = frames
        return
    name = rec[0]
    if len(rec) < 6:
        raise ValueError(f"record {name!r}: {len(rec)} fields, at least 6 expected")
    quick = _split_name(name, names) if names is not None else None
    io = ""
    if quick is None:
        p = records.parse_name(name)
        if p.io is None:
            raise ValueError(f"record {name!r}: a tensor name needs _input.N or _output.N")
        io = p.io
    # rec[1] (0, or 1 in some ptdbg v4 dumps) and rec[2] are not used
    dtype = rec[3]
    if not isinstance(dtype, str):
        raise ValueError(f"record {name!r}: dtype must be a string, got {dtype!r}")
    try:
        shape = _shape(rec[4])
    except ValueError as e:
        raise ValueError(f"record {name!r}: {e}") from None
    stats = rec[5] if isinstance(rec[5], list) else []
    extra = rec[6] if len(rec) > 6 and isinstance(rec[6], dict) else {}
    has_src = src is not None
    if not has_src and isinstance(extra.get("call"), dict) and "src" in extra["call"]:
        src, has_src = extra["call"]["src"], True
        extra = dict(extra)
        extra["call"] = {k: v for k, v in extra["call"].items() if k != "src"}
    npy = extra.get("npy")
    kept = extra
    pool = b.pool
    memo = b.kept_of if fast_hit and npy is None else None
    if pool is not None and memo is not None and id(extra) in memo:
        # the fast path's shared extra object (one per distinct text) seen before: its kept form
        kept = memo[id(extra)][1]
        dtype = pool.setdefault(dtype, dtype)
        shape = pool.setdefault(shape, shape)
    elif pool is not None:
        # a step has a few hundred thousand records and a handful of distinct dtypes, shapes,
        # slots and extras: one object each (the saved file's name moves to data_file)
        dtype = pool.setdefault(dtype, dtype)
        shape = pool.setdefault(shape, shape)
        shared = _pooled_extra(pool, extra)
        kept = shared if shared is not None else extra
        if memo is not None:   # (pool is not None here)
            if len(memo) >= FAST_CACHE_MAX:
                memo.clear()
            memo[id(extra)] = (extra, kept)   # the extra held: its id stays its own
    if quick is not None:
        api_key, p, io, index, slot = quick
        if pool is not None:
            slot = pool.setdefault(slot, slot)
            index = pool.setdefault(index, index)
        t = TensorRec(name, api_key, io, index, p.direction, dtype, shape, stats, kept, lineno, slot=slot)
    else:
        if name.endswith(("_" + io, "." + io)):   # ptdbg's single output without an index
            cut = len(name) - len(io) - 1
        else:
            cut = max(name.rfind("_" + io + "."), name.rfind("." + io + "."))
        api_key = name[:cut]
        t = TensorRec(name, api_key, io, p.index or (), p.direction, dtype, shape, stats, extra, lineno)
    a = b.apis.get(api_key) or b.api(api_key, p)
    _check_record(b, t, lineno)
    if has_src:
        _read_sources(b, a, src, lineno)
    if extra.get("ctx"):
        a.ctx = str(extra["ctx"])
    a.tensors.append(t)
    if extra and not isinstance(npy, str):
        return  # written by this project: no "npy" means the tensor was not saved (scalar, filtered)
    # a dump without extra (ptdbg's own): a 0-d record of a Python number ("int", "float",
    # "<class 'int'>") may have no file; a tensor's missing file is a problem
    _look_up_data(b, t, npy if isinstance(npy, str) else None, lineno,
                  bool(extra) or bool(shape) or dtype.startswith("torch."))


def _look_up_data(b: _Builder, t: TensorRec, npy: Optional[str], lineno: int, expected: bool) -> None:
    """Find ``t``'s data file (:meth:`_Builder.resolve`; ``npy``: the name its record gives, None:
    the one its name implies); a name pointing outside the data directory is the record's problem,
    a named file that is not there is counted (``named``, ``absent``)."""
    try:
        b.resolve(t, npy, expected)
    except ValueError as e:
        t.data_problem = str(e)
        b.problems.append(f"{b.source}:{lineno}: {e}")
        return
    if npy is not None:   # a record that names its file promises it
        b.named += 1
        if b.files is None or (t.data_file is None and npy not in b.files):
            b.absent.append(npy)


def _pooled_extra(pool: Dict[Any, Any], extra: dict) -> Optional[dict]:
    """The one shared copy of a small extra without a call spec, its data file's name left out
    (it moves to ``data_file``), or None: a call spec, more than 8 members or an unhashable value
    (kept as it is)."""
    if "call" in extra or len(extra) > 8:
        return None
    try:
        pairs = tuple((k, v) for k, v in extra.items() if k != "npy")
        items = ("extra",) + pairs
        shared = pool.get(items)
        if shared is None:
            shared = pool[items] = dict(pairs)
        return shared
    except TypeError:
        return None


def _shared_part(b: _Builder, rec: list, named: bool) -> Any:
    """What every record spelling this dtype, shape and extra alike shares, as
    :func:`_add_ptdbg_record` would make it: ``(dtype, shape, kept extra, whether the call spec
    is malformed, context)``, the dtype, shape and extra pooled (the kept extra None where it is
    each record's own: one naming its file with a call spec), or False for a record without an
    extra (its data file is looked up by its name) or keeping a dataflow: the checked path.
    ``named``: the records name their data file."""
    extra = rec[6] if len(rec) > 6 else None
    if not isinstance(extra, dict) or not extra or ("npy" in extra) != named or (
            isinstance(extra.get("call"), dict) and "src" in extra["call"]):
        return False   # (a key spelled with escapes, which the texts' checks do not see)
    pool = b.pool if b.pool is not None else {}
    dtype = pool.setdefault(rec[3], rec[3])
    shape = tuple(rec[4])   # (ints: the fast path's shape pattern)
    shape = pool.setdefault(shape, shape)
    kept = _pooled_extra(pool, extra)   # (an empty extra once its file's name is left out too)
    if kept is None and not named:
        kept = extra
    bad_call = "call" in extra and bool(call_problem(extra["call"]))
    ctx = str(extra["ctx"]) if extra.get("ctx") else ""
    return dtype, shape, kept, bad_call, ctx


def _add_fast(b: _Builder, rec: list, key: Tuple[str, str, str], src: Any, npy: Optional[str], lineno: int,
              names: Dict[str, Tuple[records.ParsedName, str]]) -> bool:
    """Add a tensor record :class:`_FastLines` parsed (``key``: its dtype, shape and extra texts,
    the extra's dataflow ``src`` and data file name ``npy`` split off), exactly as
    :func:`_add_ptdbg_record` would, with what depends on ``key`` alone (:func:`_shared_part`)
    worked out once per distinct key. False, nothing added: not such a record (its name does not
    split quickly, a stack record's name, no extra); the checked path takes it."""
    name = rec[0]
    quick = _split_name(name, names)
    if quick is None or name.endswith(records.STACK_SUFFIX):
        return False
    part = b.shared.get(key)
    if part is None:
        part = _shared_part(b, rec, npy is not None)
        if len(b.shared) >= FAST_CACHE_MAX:
            b.shared.clear()
        b.shared[key] = part
    if part is False:
        return False
    dtype, shape, kept, bad_call, ctx = part
    api_key, p, io, index, slot = quick
    stats = rec[5]
    t = TensorRec(name, api_key, io, index, p.direction, dtype, shape, stats, rec[6] if kept is None else kept,
                  lineno, slot=slot)
    a = b.apis.get(api_key) or b.api(api_key, p)
    if bad_call or len(stats) != 4:
        _check_record(b, t, lineno)
    else:   # stats_problem's common case inline (four finite floats in order); the rest checked
        mx, mn, me, l2 = stats
        if not (mx.__class__ is float and mn.__class__ is float and me.__class__ is float
                and l2.__class__ is float and _INF > mx >= mn > -_INF and -_INF < me < _INF
                and _INF > l2 >= 0.0):
            _check_record(b, t, lineno)
    if src is not None:
        _read_sources(b, a, src, lineno)
    if ctx:
        a.ctx = ctx
    a.tensors.append(t)
    if npy is not None:
        _look_up_data(b, t, npy, lineno, True)
    return True


_INF = float("inf")

#: at most this many input slots of one call carry a source
MAX_SOURCES = 4096


def _source_problem(src: Any) -> str:
    """Why a call spec's ``"src"`` is not ``{"input.N...": [forward key, "output.N..."], ...}``, or ``""``."""
    if not isinstance(src, dict):
        return f"it is {type(src).__name__}, not an object"
    if len(src) > MAX_SOURCES:
        return f"{len(src)} entries, more than {MAX_SOURCES}"
    for slot, v in src.items():
        if not slot.startswith("input.") or len(slot) > 200:
            return f"slot {slot[:40]!r} is not an input slot"
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], str)
                and 0 < len(v[0]) <= 400 and v[1].startswith("output.") and len(v[1]) <= 200):
            return f"the source of {slot[:40]} is not [forward key, output slot]: {str(v)[:60]}"
    return ""


def _read_sources(b: "_Builder", a: ApiRec, src: Any, lineno: int) -> None:
    """``ApiRec.sources`` from a call spec's ``"src"`` (the dataflow, a hint for pairing): a
    malformed one is ignored, noted (it fails nothing: pairing falls back to the call order)."""
    why = _source_problem(src)
    if why:
        if len(b.notes) < MAX_LINE_PROBLEMS:
            b.notes.append(f"{b.source}:{lineno}: call {a.key!r}: its dataflow (\"src\") is ignored: {why}")
        return
    if a.direction != records.FORWARD:
        return
    pool = b.pool
    if pool is None:
        a.sources = {slot: (v[0], v[1]) for slot, v in src.items()}
    else:   # a producer read before (the usual case) lends its key's string, the rest are pooled
        apis = b.apis

        def key(k: str) -> str:
            return apis[k].key if k in apis else pool.setdefault(("s", k), k)

        a.sources = {pool.setdefault(slot, slot): (key(v[0]), pool.setdefault(v[1], v[1])) for slot, v in src.items()}


def _check_record(b: "_Builder", t: TensorRec, lineno: int) -> None:
    """A record that contradicts itself (``dump/validate.py``) is unusable data, named."""
    why = stats_problem(t.stats, t.extra, t.shape)
    if not why and "call" in t.extra:
        why = call_problem(t.extra["call"])
        why = f"malformed call spec: {why}" if why else ""
    elif why:
        why = f"contradictory statistics: {why}"
    if why:
        where = f"{b.source}:{lineno}" if lineno else b.source
        b.problems.append(f"{where}: record {t.name!r}: {why} (unusable record)")


# ---------------------------------------------------------------------------------------- msprobe

_STACK_LINE = re.compile(r"^\s*File\s+(?P<file>.*?),\s+line\s+(?P<line>\d+),\s+in\s+(?P<func>[^,\n]*),?"
                         r"\s*\n?\s*(?P<code>.*)$", re.S)


def _frame(s: Any) -> list:
    if isinstance(s, (list, tuple)):
        return list(s)
    m = _STACK_LINE.match(str(s))
    if not m:
        return [str(s), 0, "", ""]
    return [m.group("file"), int(m.group("line")), m.group("func").strip(), m.group("code").strip()]


def _read_msprobe_stacks(path: str, problems: List[str]) -> Dict[str, list]:
    out: Dict[str, list] = {}
    if not os.path.isfile(path):
        return out
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        problems.append(f"{path}: unreadable stack file skipped ({e})")
        return out
    if not isinstance(data, dict):
        return out
    for k, v in data.items():
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], list) and all(isinstance(n, str) for n in v[0]):
            frames = [_frame(s) for s in (v[1] if isinstance(v[1], (list, tuple)) else [v[1]])]
            for name in v[0]:
                out[name] = frames
        elif isinstance(v, list):
            out[k] = [_frame(s) for s in v]
    return out


def _walk(value: Any, prefix: Tuple[Any, ...]):
    """Yield (index path, tensor dict) of tensors in a nested msprobe argument structure."""
    if isinstance(value, dict):
        if "dtype" in value and "shape" in value:
            yield prefix, value
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, prefix + (i,))


#: msprobe's ``{"type": ..., "value": ...}`` scalar types that become scalar records (as ptdbg lists them)
_MSPROBE_NUMBERS = {"int": int, "float": float, "bool": bool}


def _msprobe_spec(value: Any, slot: str) -> Any:
    """msprobe's description of one argument as a call-spec value (docs/DESIGN.md), as data only:
    a tensor is ``{"t": slot}``, numbers/str/bool/None as is, dtypes, devices and slices tagged."""
    if value is None:
        return None
    if isinstance(value, dict):
        if "dtype" in value and "shape" in value:
            return {"t": slot}
        kind, v = value.get("type"), value.get("value")
        if kind in _MSPROBE_NUMBERS or kind == "str":
            return v
        if kind in (None, "NoneType") and v is None:
            return None
        if kind == "torch.dtype":
            return {"dtype": str(v)}
        if kind == "torch.device":
            return {"device": str(v)}
        if kind == "slice" and isinstance(v, list):
            return {"slice": list(v)}
        if kind == "ellipsis":
            return {"ellipsis": True}
        return {"repr": str(value)[:200]}
    if isinstance(value, (list, tuple)):
        return [_msprobe_spec(v, f"{slot}.{i}") for i, v in enumerate(value)]
    return {"repr": str(value)[:200]}


def _msprobe_scalars(value: Any, prefix: Tuple[Any, ...]):
    """Yield (index path, type name, number) of the number arguments in an msprobe argument structure."""
    if isinstance(value, dict):
        if value.get("type") in _MSPROBE_NUMBERS and isinstance(value.get("value"), (int, float)):
            yield prefix, value["type"], value["value"]
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _msprobe_scalars(v, prefix + (i,))


def _read_msprobe(path: str, data_dir: Optional[str]) -> Dump:
    problems: List[str] = []
    with _open_regular(path, "the msprobe dump.json") as f:
        raw = f.read()
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not nesting_ok(doc, MAX_DEPTH):
            raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deep: not read") from None
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON (truncated or corrupt: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise ValueError(f"{path}: no 'data' map; not an msprobe dump.json")
    if doc.get("task") == "statistics":
        data_dir = None
    b = _Builder(path, data_dir, problems)
    stacks = _read_msprobe_stacks(os.path.join(os.path.dirname(path), MSPROBE_STACK), problems)
    for key, entry in doc["data"].items():
        try:
            p = records.parse_name(key)
        except ValueError as e:
            problems.append(f"{path}: {e}")
            continue
        if p.io is not None or not isinstance(entry, dict):
            problems.append(f"{path}: entry {key!r} is not an API entry")
            continue
        a = b.api(key, p)
        a.stack = stacks.get(key)
        groups = []
        call = None
        if "input_args" in entry or "input_kwargs" in entry:
            args = entry.get("input_args") or []
            kwargs = entry.get("input_kwargs") or {}
            args = list(args) if isinstance(args, (list, tuple)) else []
            kwargs = kwargs if isinstance(kwargs, dict) else {}
            # positional arguments are input.0, input.1, ...; keyword arguments input.{name}, as
            # msprobe names them (Functional.layer_norm.0.forward.input.weight)
            groups.append(("input", [((i,), v) for i, v in enumerate(args)] +
                           [((str(k),), v) for k, v in kwargs.items()]))
            call = {"args": [_msprobe_spec(v, f"input.{i}") for i, v in enumerate(args)],
                    "kwargs": {str(k): _msprobe_spec(v, f"input.{k}") for k, v in kwargs.items()}}
        elif "input" in entry:
            groups.append(("input", [((i,), v) for i, v in enumerate(entry.get("input") or [])]))
        if "output" in entry:
            out = entry.get("output")
            out = out if isinstance(out, (list, tuple)) else ([out] if out is not None else [])
            groups.append(("output", [((i,), v) for i, v in enumerate(out)]))
        first = True
        for io, values in groups:
            for top, value in values:
                for idx, tdict in _walk(value, top):
                    name = f"{key}.{io}." + ".".join(str(i) for i in idx)
                    try:
                        shape = _shape(tdict.get("shape"))
                    except ValueError as e:
                        problems.append(f"{path}: record {name!r}: {e}")
                        continue
                    stats = [tdict.get("Max"), tdict.get("Min"), tdict.get("Mean"), tdict.get("Norm")]
                    extra: Dict[str, Any] = {}
                    if "requires_grad" in tdict:
                        extra["rg"] = bool(tdict["requires_grad"])
                    if first and call is not None:
                        extra["call"] = call
                        first = False
                    t = TensorRec(name, key, io, idx, p.direction, str(tdict.get("dtype")), shape,
                                  stats, extra, 0)
                    a.tensors.append(t)
                    _check_record(b, t, 0)
                    dn = tdict.get("data_name")
                    if isinstance(dn, str) and dn and dn != "-1":
                        try:
                            b.resolve(t, dn)
                        except ValueError as e:
                            t.data_problem = str(e)
                            problems.append(f"{path}: {e}")
                if io == "input":
                    for idx, kind, v in _msprobe_scalars(value, top):
                        name = f"{key}.{io}." + ".".join(str(i) for i in idx)
                        a.tensors.append(TensorRec(name, key, io, idx, p.direction, kind, (), [v] * 4, {}, 0))
        if call is not None and first and a.tensors:
            a.tensors[0].extra["call"] = call
    dump = b.done("msprobe", str(doc.get("task", "")))
    dump.completeness = Completeness("unknown", f"{path}: msprobe dump: completeness unknown")
    dump.notes.append(dump.completeness.message)
    return dump
