"""``benchmarks/device_check.py``, the one command a machine with an accelerator runs. No test here
needs one: the skip line is checked where there is none, detection with ``torch.accelerator`` and
the ``torch_npu`` import mocked, and the whole device path with the CPU standing in (``--fast``)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import types

import pytest

from locations import REPO_ROOT

torch = pytest.importorskip("torch")

if REPO_ROOT not in sys.path:  # ``benchmarks`` is imported from the repository root
    sys.path.insert(0, REPO_ROOT)

from benchmarks import device_check as dc  # noqa: E402

SCRIPT = os.path.join(REPO_ROOT, "benchmarks", "device_check.py")


def _run(args, tmp_path, timeout=120):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="")   # no CUDA device even where there is one
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(tmp_path), env=env)
    return proc, time.perf_counter() - t0


# ------------------------------------------------------------------------------- no accelerator

@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None,
                    reason="torch_npu is installed: an NPU may be found (detection is tested mocked)")
def test_without_an_accelerator_it_says_skipped_and_what_it_looked_for(tmp_path):
    proc, _ = _run(["--out", "r.json"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(dc.SKIP_LINE), line
    assert len(line.splitlines()) == 1
    assert "torch_npu is not importable" in line and "torch.accelerator: none available" in line
    assert not (tmp_path / "r.json").exists()   # nothing ran


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed")
def test_a_device_asked_for_and_missing_exits_2_with_the_same_line(tmp_path):
    proc, _ = _run(["--device", "npu"], tmp_path)
    assert proc.returncode == 2
    assert proc.stdout.startswith(dc.SKIP_LINE + ": npu asked for but not found")


# ------------------------------------------------------------------------------- detection, mocked

@pytest.fixture
def no_torch_npu(monkeypatch):
    """``import torch_npu`` fails as it does without CANN (None in sys.modules: ImportError)."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)


def _accelerator(monkeypatch, current, available=True):
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: available)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: current)


def test_a_cuda_accelerator_is_chosen_and_torch_npu_failing_is_said(monkeypatch, no_torch_npu):
    _accelerator(monkeypatch, torch.device("cuda", 0))
    found = dc.detect("auto")
    assert found.device == "cuda" and not found.stand_in
    assert found.message == "device under test: cuda"
    halted = "torch_npu is not importable (ModuleNotFoundError: import of torch_npu halted"
    assert any(halted in x for x in found.looked_for)
    assert dc.detect("cuda").device == "cuda"
    npu = dc.detect("npu")
    assert npu.device is None
    assert npu.message.startswith(dc.SKIP_LINE + ": npu asked for but not found")
    assert "torch_npu is not importable" in npu.message


def test_torch_npu_importing_makes_the_npu_the_device(monkeypatch):
    imported = []

    def fake_import(name, *a, **k):
        imported.append(name)
        return types.ModuleType(name)

    monkeypatch.setattr(dc.importlib, "import_module", fake_import)
    # torch_npu registers the NPU as torch's accelerator (a CPU build cannot make torch.device("npu"))
    _accelerator(monkeypatch, types.SimpleNamespace(type="npu"))
    found = dc.detect("auto")
    assert imported == ["torch_npu"]
    assert found.device == "npu"
    assert "torch_npu: imported" in found.looked_for
    assert dc.detect("cuda").device is None


def test_no_accelerator_says_no_cuda_build(monkeypatch, no_torch_npu):
    _accelerator(monkeypatch, None, available=False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    found = dc.detect("auto")
    assert found.device is None
    assert found.message.startswith(dc.SKIP_LINE + ": looked for ")
    assert "no CUDA build (torch " in found.message and "torch_npu is not importable" in found.message


def test_a_cuda_build_without_a_visible_device_says_so(monkeypatch, no_torch_npu):
    _accelerator(monkeypatch, None, available=False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    found = dc.detect("auto")
    assert found.device is None and "no CUDA device is visible" in found.message


def test_another_kind_of_accelerator_is_named_and_not_run_on(monkeypatch, no_torch_npu):
    _accelerator(monkeypatch, types.SimpleNamespace(type="xpu"))
    found = dc.detect("auto")
    assert found.device is None
    assert "'xpu', which this check does not run on" in found.message


def test_a_failing_accelerator_query_is_said_not_raised(monkeypatch, no_torch_npu):
    def broken():
        raise RuntimeError("driver too old")

    monkeypatch.setattr(torch.accelerator, "is_available", broken)
    found = dc.detect("auto")
    assert found.device is None and "RuntimeError: driver too old" in found.message


def test_cpu_is_the_stand_in_without_looking():
    found = dc.detect("cpu")
    assert found.device == "cpu" and found.stand_in and "for testing this script" in found.message


# ------------------------------------------------------------------------------- flags and rows

def test_the_tf32_modes_put_every_flag_back():
    before = dc.flag_state("cpu")
    with dc.arithmetic("cpu", True) as on:
        assert on["torch.backends.cuda.matmul.allow_tf32"] is True
        assert on["torch.backends.cudnn.allow_tf32"] is True
        assert on["torch.get_float32_matmul_precision()"] == "high"
    assert dc.flag_state("cpu") == before
    with pytest.raises(ValueError):
        with dc.arithmetic("cpu", False) as off:
            assert off["torch.backends.cuda.matmul.allow_tf32"] is False
            assert off["torch.get_float32_matmul_precision()"] == "highest"
            raise ValueError("a row fails inside")
    assert dc.flag_state("cpu") == before


def test_a_row_that_raises_is_its_own_error_and_the_others_go_on(tmp_path):
    ctx = dc.Context(torch.device("cpu"), torch.device("cpu"), str(tmp_path), True, 1, False)

    def boom(ctx):
        raise RuntimeError("kernel not implemented\nsecond line")

    def fine(ctx):
        return dc.PASS, "ok", {}

    rows = dc.run_rows(ctx, [(dc.Row("a", "raises"), boom), (dc.Row("b", "passes"), fine)], 60,
                       say=lambda m: None)
    assert [(r.name, r.result) for r in rows] == [("a", dc.ERROR), ("b", dc.PASS)]
    assert rows[0].reason == "RuntimeError: kernel not implemented"
    assert "Traceback" in rows[0].details["traceback"]
    assert dc.verdict(rows) == (False, ["a"])
    late = dc.run_rows(ctx, [(dc.Row("c", "never"), fine)], -1, say=lambda m: None)
    assert late[0].result == dc.ERROR and "time budget" in late[0].reason


def test_an_info_row_failing_fails_nothing():
    rows = [dc.Row("x", "", dc.INFO, dc.FAIL), dc.Row("y", "", dc.MUST, dc.PASS)]
    assert dc.verdict(rows) == (True, [])


def test_the_full_plan_covers_every_model_and_mode():
    names = [row.name for row, _ in dc.plan(fast=False)]
    for m in dc.MODELS:
        for mode in ("default", "tf32_off", "tf32_on", "bf16"):
            assert f"suite:{m}:{mode}" in names
    assert names[-6:] == ["dropout", "adamw_foreach", "adamw_fused", "planted_fault", "planted_fault_vs_bench",
                          "dump_cost"]
    fast = [row.name for row, _ in dc.plan(fast=True)]
    assert [n for n in fast if n.startswith("suite:")] == [
        "suite:mlp:default", "suite:mlp:tf32_off", "suite:mlp:tf32_on", "suite:mlp:bf16"]


# ------------------------------------------------------------------------------- the device path

def test_the_cpu_stand_in_runs_the_fast_subset_end_to_end(tmp_path):
    proc, seconds = _run(["--device", "cpu", "--fast", "--out", "r.json"], tmp_path, timeout=180)
    out = proc.stdout
    assert proc.returncode in (0, 1), out + proc.stderr
    assert "the CPU stands in for the device" in out
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == [row.name for row, _ in dc.plan(fast=True)]
    assert "name" in out and "gate  result  time(s)" in out
    for name, row in rows.items():
        assert row["result"] in (dc.PASS, dc.FAIL, dc.ERROR), row
        assert f"\n{name} " in out and row["reason"] in out
    # what the CPU can already show: the suite, shared dropout masks, the planted fault, the cost
    for name in ("suite:mlp:default", "suite:mlp:tf32_off", "suite:mlp:bf16", "dropout", "planted_fault",
                 "planted_fault_vs_bench", "dump_cost"):
        assert rows[name]["result"] == dc.PASS, rows[name]
    assert rows["dropout"]["details"]["dropout_rows"] > 0
    assert rows["dropout"]["details"]["dropout_rows_unpaired"] == 0
    for name in ("planted_fault", "planted_fault_vs_bench"):
        assert rows[name]["details"]["passed"] is False
        assert rows[name]["details"]["first_suspect"]["api"] in rows[name]["reason"]
        assert " in softmax: " in rows[name]["details"]["first_suspect"]["location"]
    cost = rows["dump_cost"]["details"]
    assert cost["reps"] == 3 and all(len(v) == 3 for v in cost["times_s"].values())
    assert cost["ratio_to_plain"]["full"] > 0 and cost["ratio_to_plain"]["statistics"] > 0
    assert report["stand_in"] is True and report["device"] == "cpu" and report["flags_restored"] is True
    assert report["environment"]["cpu_threads"] == 1
    assert report["kept"] is None and all(r["details"].get("html") is None for r in report["rows"])
    # the exit code is the must rows' verdict
    must_bad = [n for n, r in rows.items() if r["gate"] == dc.MUST and r["result"] != dc.PASS]
    assert report["not_passed"] == must_bad and report["passed"] == (not must_bad)
    assert proc.returncode == (1 if must_bad else 0)
    assert ("PASSED" if not must_bad else "FAILED") in out.splitlines()[-2]
    assert seconds < 180


def test_the_fault_rows_fail_when_nothing_is_caught(tmp_path):
    # the rows' own negative control: a clean step against itself is "not caught", a FAIL
    import example_models as em

    ctx = dc.Context(torch.device("cpu"), torch.device("cpu"), str(tmp_path), True, 1, False)
    model, batch = em.mlp()
    result, reason, details = dc._fault_verdict(dc.run_pair(ctx, "clean", model, batch, em.train_step,
                                                            em.train_step))
    assert result == dc.FAIL and reason.startswith("the planted fault was not caught: passed")
    assert details["passed"] is True
