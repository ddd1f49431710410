"""pytest plugin entry point (``pytest11: ptdbg``): options, marker, ``ptdbg_dump`` fixture, summary.

Imported by pytest for every session, so nothing heavy at import: torch and pandas are imported
by ``fixture.py``/``run.py`` when a test first uses the fixture.

Artifacts of a session go under the dump directory (``--ptdbg-dump-dir``; default
``<basetemp>/ptdbg`` with ``--basetemp``, else ``.pytest_cache/d/ptdbg/run-<time>-<pid>/``, the
last three sessions kept): one folder per test (``<worker>/`` in front under xdist), and at the top
``ptdbg_summary.json`` and ``index.html`` (links to every kept HTML report).

Goldens (``golden.py``: the store and its text format; ``golden_check.py``: the checks and the
reference dump for ``compare()``; ``callkeys.py``: stable call keys) are the reference where the
device under test and the bench are the same device in the same dtype. The controller counts
them from the tests' summary entries and, at the end, fails the run on unused ones
(``--ptdbg-unused``) or removes them (``--ptdbg-update``). A comparison that failed and that the
test never asserted turns its passing call report into a failure (``_fail_unasserted``).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from typing import TYPE_CHECKING, Any, Dict, Generator, Iterable, Iterator, Optional, Sequence, Set

import pytest

from pytest_ptdbg.plugin import options as plugin_options
from pytest_ptdbg.plugin.golden import ci_mode, partial_files, remove as remove_golden, \
    unused_goldens
from pytest_ptdbg.plugin.summary import REPORT_ATTR, SessionSummary

if TYPE_CHECKING:
    from pytest_ptdbg.plugin.fixture import PtdbgDump

#: marker file in each test's artifact folder; the session start clears only folders holding it
ARTIFACT_MARK = ".ptdbg-artifacts"


class PtdbgState:
    """Per-process plugin state (config.stash)."""

    def __init__(self, config: pytest.Config, settings: plugin_options.Settings, dump_root: str,
                 run_dir: str) -> None:
        self.config = config
        self.settings = settings
        self.dump_root = dump_root
        self.run_dir = run_dir
        self.worker_id: Optional[str] = (getattr(config, "workerinput", None) or {}).get("workerid")
        self.summary = SessionSummary(dump_root, settings.golden, run_dir)
        #: node ids the collectors found (selected or not); under xdist, sent by every worker
        self.known_ids: Set[str] = set()
        #: False when some worker did not send its ids (crashed): unused goldens are not judged
        self.ids_complete = True
        self.basetemp_ready = False
        #: missing goldens are never written (``--ptdbg-golden-ci``, ini, or a CI variable)
        self.golden_ci = ci_mode(settings.golden_ci)
        #: node ids whose call phase passed (a golden of a call they no longer make is unused)
        self.ran_whole: Set[str] = set()

    @property
    def is_worker(self) -> bool:
        return self.worker_id is not None

    def test_root(self) -> str:
        """Where this process puts its tests' folders (per worker under xdist)."""
        return os.path.join(self.run_dir, self.worker_id) if self.worker_id else self.run_dir


STATE = pytest.StashKey[PtdbgState]()
CALL_REPORT = pytest.StashKey[Dict[str, Any]]()
#: key of a worker's known node ids in xdist's ``workeroutput``
KNOWN_IDS_KEY = "ptdbg_known_ids"


def pytest_addoption(parser: pytest.Parser) -> None:
    plugin_options.addoption(parser)


def _default_dump_root(config: pytest.Config) -> str:
    basetemp = config.getoption("basetemp", None)
    if basetemp:
        return os.path.join(os.path.abspath(str(basetemp)), "ptdbg")
    cache = getattr(config, "cache", None)
    if cache is not None:  # the path of cache.mkdir("ptdbg"), created only when a test dumps
        cachedir = getattr(cache, "_cachedir", None)
        return os.path.join(str(cachedir), "d", "ptdbg") if cachedir else str(cache.mkdir("ptdbg"))
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"pytest-ptdbg-{user}")


RUN_PREFIX = "run-"
KEEP_RUNS = 3


def _new_run_dir(root: str) -> str:
    """A fresh ``run-<time>-<pid>`` folder under the shared default root; older runs beyond the
    last few are cleared of what the plugin wrote there (marked test folders, as
    :func:`_clear_marked`; never through a symbolic link) and removed once empty. Sessions running
    at the same time (same checkout) never collide."""
    names = os.listdir(root) if os.path.isdir(root) else []
    runs = [os.path.join(root, n) for n in names if n.startswith(RUN_PREFIX)]
    runs = [p for p in runs if _is_real_dir(p)]
    runs.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0.0)
    for old in runs[: max(0, len(runs) - (KEEP_RUNS - 1))]:
        _clear_marked(old)
        try:
            os.rmdir(old)  # only when nothing but the plugin's folders was in it
        except OSError:
            pass
    return os.path.join(root, f"{RUN_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


#: marker file at the top of a dump directory: the files there that the plugin wrote (JSON)
ROOT_MARK = ".ptdbg-dump-dir"
#: the files at the top of a dump directory that the plugin writes
ROOT_FILES = ("ptdbg_summary.json", "index.html")


def _is_real_dir(path: str) -> bool:
    """A directory, not a symbolic link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_real_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _root_files(root: str) -> Set[str]:
    """The top-level files the plugin wrote under ``root`` (from its marker; none without)."""
    mark = os.path.join(root, ROOT_MARK)
    if not _is_real_file(mark):
        return set()
    try:
        with open(mark, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return set()
    names = doc.get("files") if isinstance(doc, dict) else None
    return {n for n in names if n in ROOT_FILES} if isinstance(names, list) else set()


def _mark_root(root: str, written: Iterable[Optional[str]]) -> None:
    """Note the top-level files this session wrote, so that the next session removes them."""
    names = sorted({os.path.basename(p) for p in written if p} & set(ROOT_FILES))
    if not names or not _is_real_dir(root):
        return
    try:
        with open(os.path.join(root, ROOT_MARK), "w", encoding="utf-8") as f:
            json.dump({"written by": "pytest-ptdbg", "files": names}, f)
    except OSError:
        pass


def _clear_previous(root: str) -> None:
    """Remove the test folders and summary of an earlier session: only what the plugin wrote
    (folders holding its marker, the top-level files its root marker names, folders that
    became empty by that), never through a symbolic link."""
    if not os.path.isdir(root):
        return
    for name in _root_files(root):
        path = os.path.join(root, name)
        if _is_real_file(path):
            os.remove(path)
    if _is_real_file(os.path.join(root, ROOT_MARK)):
        os.remove(os.path.join(root, ROOT_MARK))
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if _is_real_dir(path):
            _clear_marked(path)


def _clear_marked(path: str) -> bool:
    """Remove ``path`` when it holds the artifact marker, else the marked folders below it,
    then ``path`` itself if that left it empty; True when something was removed."""
    if _is_real_file(os.path.join(path, ARTIFACT_MARK)):
        shutil.rmtree(path, ignore_errors=True)
        return True
    try:
        names = os.listdir(path)
    except OSError:
        return False
    removed = False
    for name in names:
        sub = os.path.join(path, name)
        if _is_real_dir(sub):
            removed = _clear_marked(sub) or removed
    if removed:
        try:
            os.rmdir(path)  # only when empty, and only when this cleaning emptied it
        except OSError:
            pass
    return removed


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", plugin_options.MARKER_HELP)
    try:
        settings, dump_dir = plugin_options.session_settings(config)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    workerinput = getattr(config, "workerinput", None)
    basetemp = config.getoption("basetemp", None)
    if workerinput and workerinput.get("ptdbg_dump_root"):
        root, run_dir = workerinput["ptdbg_dump_root"], workerinput["ptdbg_run_dir"]
    elif dump_dir or basetemp:
        root = run_dir = dump_dir or _default_dump_root(config)
        # <basetemp>/ptdbg is wiped by pytest when first used (the fixture asks for it then);
        # an explicit dump directory is cleared of the previous session's artifacts here
        if dump_dir:
            _clear_previous(root)
    else:  # shared default (pytest's cache): one folder per session, the summary at the top
        root = _default_dump_root(config)
        run_dir = _new_run_dir(root)
    state = PtdbgState(config, settings, root, run_dir)
    if dump_dir or not config.getoption("basetemp", None) or workerinput:
        state.basetemp_ready = True
    config.stash[STATE] = state
    config.pluginmanager.register(_SessionHooks(state), "ptdbg-session")


class _SessionHooks:
    """Hooks that need the session's state (registered per config in pytest_configure)."""

    def __init__(self, state: PtdbgState) -> None:
        self.state = state

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist controller: every worker writes under the controller's dump directory."""
        node.workerinput["ptdbg_dump_root"] = self.state.dump_root
        node.workerinput["ptdbg_run_dir"] = self.state.run_dir

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Any) -> None:
        self.state.known_ids.update(ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: a worker's known ids (deselected ones included) arrive here."""
        ids = (getattr(node, "workeroutput", None) or {}).get(KNOWN_IDS_KEY)
        if ids is None:
            self.state.ids_complete = False
        else:
            self.state.known_ids.update(ids)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # every test a collector found, before any -k/-m/`::` selection or plugin filtering
        if report.passed:
            self.state.known_ids.update(x.nodeid for x in report.result
                                        if isinstance(x, pytest.Item))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        state = self.state
        state.known_ids.update(item.nodeid for item in session.items)
        if state.is_worker:
            state.config.workeroutput[KNOWN_IDS_KEY] = sorted(state.known_ids)  # type: ignore[attr-defined]  # set by pytest-xdist on a worker

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self.state.known_ids.update(item.nodeid for item in items)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when == "call" and report.passed:
            _fail_unasserted(item, report)
        item.stash.setdefault(CALL_REPORT, {})[report.when] = report
        if report.when == "teardown":
            entries = getattr(item, "_ptdbg_entries", None)
            if entries:
                setattr(report, REPORT_ATTR, [plain(e) for e in entries])
        # xdist sends the report to the controller: only types its serializer knows
        report.user_properties = [tuple(plain(list(p))) if isinstance(p, (tuple, list)) else
                                  plain(p) for p in report.user_properties]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # xdist: the controller gets every worker's reports here; without xdist, our own.
        if self.state.is_worker:
            return
        if report.when == "call" and report.passed:
            self.state.ran_whole.add(report.nodeid)
        if report.when == "teardown":
            self.state.summary.add_report(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        state = self.state
        if state.is_worker:
            return
        config = session.config
        settings = state.settings
        # --lf drops tests of a file silently: then no file is known to be collected whole
        if settings.golden != plugin_options.GOLDEN_OFF and state.ids_complete and \
                not config.getoption("lf", False) and not session.shouldstop and \
                not session.shouldfail:
            partial = partial_files(config.args, str(config.invocation_params.dir),
                                    str(config.rootpath))
            used = {os.path.abspath(e["golden"]) for e in state.summary.entries
                    if e.get("golden")}
            in_golden_mode = {e["nodeid"] for e in state.summary.entries if e.get("golden")}
            unused = unused_goldens(state.known_ids, used, state.ran_whole & in_golden_mode,
                                    str(config.rootpath), settings.golden, partial)
            if settings.update_golden:
                for item in unused:
                    remove_golden(item["path"])
                state.summary.removed = unused
            else:
                state.summary.unused = unused
                state.summary.unused_fail = settings.unused == "fail"
                if unused and settings.unused == "fail" and session.exitstatus == 0:
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if state.summary.write_json():
            _mark_root(state.dump_root, (getattr(state.summary, "json_path", None),
                                         getattr(state.summary, "index_path", None)))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.state.is_worker:
            self.state.summary.write_terminal(terminalreporter)


def plain(obj: Any) -> Any:
    """``obj`` as plain Python (what pytest-xdist's serializer sends): numpy scalars (``np.str_``,
    ``np.float32``, ``np.bool_``...) and arrays as their values, tuples and sets as lists, dict
    keys as strings, anything else unknown as its ``str``."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if isinstance(obj, dict):
        return {str(plain(k)): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=str) if isinstance(obj, (set, frozenset)) else obj
        return [plain(v) for v in items]
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    item = getattr(obj, "item", None)  # numpy scalars and 0-d arrays, torch scalars
    tolist = getattr(obj, "tolist", None)
    try:
        ndim = getattr(obj, "ndim", 0)
        if callable(tolist) and ndim:
            return plain(tolist())
        if callable(item):
            value = item()
            if value is not obj and type(value) in (bool, int, float, str, complex, bytes):
                return plain(value) if not isinstance(value, (complex, bytes)) else str(value)
    except Exception:  # noqa: BLE001 - a value that cannot convert itself is shown as text
        pass
    return str(obj)


def _fail_unasserted(item: pytest.Item, report: pytest.TestReport) -> None:
    """A comparison that failed and that the test never asserted fails the test (strict)."""
    dump = getattr(item, "_ptdbg_fixture", None)
    if dump is None:
        return
    missed = dump.unasserted()
    if not missed:
        return
    from pytest_ptdbg.plugin.assertions import unasserted_message

    report.outcome = "failed"
    report.longrepr = unasserted_message(missed)


@pytest.fixture
def ptdbg_dump(request: pytest.FixtureRequest) -> Iterator[PtdbgDump]:
    """Run a step on the device under test and on the bench under the dump hooks, and compare;
    where device and bench are the same device in the same dtype, judge against the test's golden.

    ``result = ptdbg_dump(model, inputs, step=None, loss_fn=None, **settings)``;
    ``result.assert_precision()`` (or ``result.expect_failure()``: a failing result the test
    never asserts fails it). Also ``ptdbg_dump.compare_runs(run, reference, *args)`` for two
    callables on one device.
    """
    from pytest_ptdbg.plugin.fixture import PtdbgDump

    state = request.config.stash[STATE]
    if not state.basetemp_ready:
        request.getfixturevalue("tmp_path_factory").getbasetemp()  # pytest wipes --basetemp first
        state.basetemp_ready = True
    dump = PtdbgDump(request, state, ARTIFACT_MARK)
    yield dump
    dump.finish(request.node.stash.get(CALL_REPORT, {}))
