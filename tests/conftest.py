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
