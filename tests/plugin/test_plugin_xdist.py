"""The plugin under pytest-xdist (``-n 2``): per-worker dump folders, complete summary on the
controller. Runs in a subprocess (xdist starts its own worker processes)."""
import json
import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytest.importorskip("xdist")

TESTS = """
import pytest
import torch
import torch.nn as nn


def make(k=1.0):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), torch.randn(5, 4)


def step(model, x):
    return model(x).pow(2).mean().backward()


@pytest.mark.parametrize("i", range(2))
def test_pass(ptdbg_dump, i):
    model, x = make()
    ptdbg_dump(model, x, step=step).assert_precision()


def test_fail(ptdbg_dump):
    model, x = make()

    def flipped(m, x):
        return m(-x).pow(2).mean().backward()
    ptdbg_dump.compare_runs(flipped, step, model, x).assert_precision()
"""


def test_xdist_two_workers_complete_summary(pytester):
    pytester.makepyfile(test_x=TESTS)
    dump = pytester.path / "dumps"
    res = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "--ptdbg-golden=none",
                                        f"--ptdbg-dump-dir={dump}", "--ptdbg-keep=all")
    res.assert_outcomes(passed=2, failed=1)
    res.stdout.fnmatch_lines(["*ptdbg precision summary*",
                              "*ptdbg: 3 comparison(s): 1 failed, 2 passed; artifacts in*"])
    doc = json.loads((dump / "ptdbg_summary.json").read_text())
    assert doc["counts"] == {"failed": 1, "passed": 2}
    assert sorted(t["nodeid"] for t in doc["tests"]) == [
        "test_x.py::test_fail", "test_x.py::test_pass[0]", "test_x.py::test_pass[1]"]
    workers = {t["dump_dir"][len(str(dump)) + 1:].split("/")[0] for t in doc["tests"]}
    assert workers <= {"gw0", "gw1"} and workers  # one folder per worker, no collisions
    dirs = [t["dump_dir"] for t in doc["tests"]]
    assert len(set(dirs)) == 3
    (fail,) = [t for t in doc["tests"] if t["verdict"] == "failed"]
    assert "neg" in fail["first_suspect"]["api"]  # -x: the sign flip
    assert (pytester.path / fail["html"]).is_file()


GOLDEN_TESTS = """
import torch
import torch.nn as nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), torch.randn(5, 4)


def test_a(ptdbg_dump):
    ptdbg_dump(*make(), summary_only=True).assert_precision()


def test_b(ptdbg_dump):
    ptdbg_dump(*make(), summary_only=True).assert_precision()


def test_gone(ptdbg_dump):
    ptdbg_dump(*make(), summary_only=True).assert_precision()
"""


def test_xdist_goldens_counted_and_unused_ones_aggregated(pytester, monkeypatch):
    """Workers collect and deselect (-k) on their side: the controller still knows test_b
    exists, counts every worker's goldens, and fails the run on the one no test uses."""
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_g=GOLDEN_TESTS)
    args = ["-p", "no:cacheprovider", f"--ptdbg-dump-dir={pytester.path / 'dumps'}"]
    res = pytester.runpytest_subprocess("-p", "no:xdist", *args, "--ptdbg-update")
    res.assert_outcomes(passed=3)
    res.stdout.fnmatch_lines(["*ptdbg goldens: 3 created, 0 updated, 0 unchanged*"])
    pytester.makepyfile(test_g=GOLDEN_TESTS.split("def test_gone")[0])
    res = pytester.runpytest_subprocess("-n", "2", "-k", "test_a", *args)
    res.assert_outcomes(passed=1)
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["*unused goldens*: 1", "*test_g.py::test_gone*",
                              "*ptdbg goldens: 0 created, 0 updated, 1 unchanged, 0 differs, "
                              "0 missing, 1 unused*"])
    doc = json.loads((pytester.path / "dumps" / "ptdbg_summary.json").read_text())
    assert [s["nodeid"] for s in doc["unused_goldens"]] == ["test_g.py::test_gone"]


def test_plain_converts_numpy_scalars_for_the_wire():
    import execnet
    import numpy as np

    from pytest_ptdbg.plugin import plain

    entry = {"first_suspect": {"api": np.str_("Functional_linear_0"), "direction": np.str_("f")},
             "suspects": [np.str_("a")], "worst": {"rel": np.float32(0.5), "n": np.int64(3)},
             "ok": np.bool_(True), "arr": np.arange(3), "t": (1, np.float64(2.0)), 5: None}
    out = plain(entry)
    assert out == {"first_suspect": {"api": "Functional_linear_0", "direction": "f"},
                   "suspects": ["a"], "worst": {"rel": 0.5, "n": 3}, "ok": True,
                   "arr": [0, 1, 2], "t": [1, 2.0], "5": None}
    assert type(out["first_suspect"]["api"]) is str and type(out["worst"]["n"]) is int
    assert type(out["ok"]) is bool and type(out["worst"]["rel"]) is float
    execnet.dumps(out)  # what xdist's workers send: raises DumpError for numpy types
    with pytest.raises(execnet.DataFormatError):
        execnet.dumps(entry["first_suspect"])


CHANGED_MODEL = """
import os

import pytest
import torch

import example_models as em


@pytest.mark.parametrize("seed", [0, 1])
def test_step(ptdbg_dump, seed):
    model, batch = em.mlp(seed=seed)
    with torch.no_grad():   # the model change: its first weight 1% larger
        next(model.parameters()).mul_(float(os.environ.get("SCALE", "1")))
    ptdbg_dump(model, batch, step=em.train_step).assert_precision()
"""


def test_xdist_failing_golden_is_reported_not_an_internal_error(pytester, monkeypatch):
    """A model change under ``-n 2``: every golden test fails and is reported, exit 1, as
    serially (the advisor's suspects in the workers' summary entries are numpy strings:
    INTERNALERROR ... DumpError, exit 3, 0 tests reported)."""
    monkeypatch.delenv("CI", raising=False)
    repo = str(Path(__file__).resolve().parents[2])   # the inner sessions import example_models
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_g=CHANGED_MODEL)
    args = ["-p", "no:cacheprovider", f"--ptdbg-dump-dir={pytester.path / 'dumps'}"]
    pytester.runpytest_subprocess("-p", "no:xdist", *args, "--ptdbg-update").assert_outcomes(
        passed=2)
    monkeypatch.setenv("SCALE", "1.01")
    res = pytester.runpytest_subprocess("-n", "2", *args)
    assert "INTERNALERROR" not in res.stdout.str() + res.stderr.str()
    res.assert_outcomes(failed=2)
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    doc = json.loads((pytester.path / "dumps" / "ptdbg_summary.json").read_text())
    assert sorted(t["verdict"] for t in doc["tests"]) == ["failed"] * 2
    assert all(t["first_suspect"] and t["first_suspect"]["api"] for t in doc["tests"])
