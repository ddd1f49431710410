"""Shared fixtures of the test suite, and ``tests/`` on ``sys.path``.

Test files sit in one folder per stage (``tests/format``, ``tests/dump``, ``tests/bad_input``...);
the helper modules here (``dumps``: hand-written ptdbg v4 dumps; ``real_dumps``: dumps of real
example-model steps; ``comparing``: one compare of two dumps, ptdbg's ``input_param``;
``synthetic``: compare tables for advisor tests; ``locations``: paths, and ``step_paths`` of a
dump) are imported by name from any of them. The fixtures below put those helpers in a test's ``tmp_path``:

* ``dump_step(name, model="mlp", **kw)``: a dump of one step in ``tmp_path / name`` (a
  :class:`real_dumps.StepDump`); ``model`` is an ``example_models`` name (``kw``: the arguments of
  :func:`real_dumps.dump_one_step`) or a callable running a step the test wrote.
* ``compare_pair(npu, bench, out="out", **options)``: the ``CompareResult`` of ``npu`` against
  ``bench`` (dumps or paths) written into ``tmp_path / out`` (:func:`comparing.run_compare`).
"""
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def dump_step(tmp_path):
    """Factory: dump one step into ``tmp_path / name`` and return its :class:`real_dumps.StepDump`."""
    import real_dumps  # imports torch: only tests that dump pay for it

    def make(name, model="mlp", **kw):
        path = tmp_path / name
        if callable(model):
            return real_dumps.dump_user_step(path, model, **kw)
        return real_dumps.dump_one_step(path, model, **kw)
    return make


@pytest.fixture
def compare_pair(tmp_path):
    """Factory: compare ``npu`` against ``bench`` into ``tmp_path / out``; returns the CompareResult."""
    from comparing import run_compare

    def run(npu, bench, out="out", **options):
        return run_compare(npu, bench, tmp_path / out, **options)
    return run


#: classes whose attributes tests patch (``monkeypatch``, ``real_dumps.patched``): a test must leave
#: them as it found them, or every later test of the same worker runs another capture
_WATCHED = (("pytest_ptdbg.capture.engine", "CaptureEngine"), ("pytest_ptdbg.dump.writer", "DumpSink"),
            ("pytest_ptdbg.dump.writer", "RankWriter"), ("pytest_ptdbg.dump.writer", "AsyncRankWriter"))


def _class_attributes() -> dict:
    """``{class name: {attribute: value}}`` of the watched classes, imported here once torch is (tests
    that never load torch stay without it)."""
    out = {}
    for module, name in _WATCHED:
        mod = sys.modules.get(module)
        if mod is None and "torch" in sys.modules:
            import importlib

            mod = importlib.import_module(module)
        cls = getattr(mod, name, None) if mod is not None else None
        if cls is not None:
            out[name] = dict(vars(cls))
    return out


@pytest.fixture(autouse=True)
def _capture_classes_left_as_found():
    """Fails the test that leaves an attribute of capture's or the dump writer's classes changed."""
    before = _class_attributes()
    yield
    after = _class_attributes()
    changed = sorted(f"{cls}.{attr}" for cls, attrs in before.items()
                     for attr in set(attrs) | set(after.get(cls, {}))
                     if attrs.get(attr, _MISSING) is not after.get(cls, {}).get(attr, _MISSING))
    if changed:
        pytest.fail("this test left " + ", ".join(changed) + " changed: later tests in this process "
                    "would run another capture (restore with monkeypatch or real_dumps.patched)")


_MISSING = object()
