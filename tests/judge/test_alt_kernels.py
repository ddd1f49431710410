"""A correct device kernel is never a root cause; a wrong one still is (issue 22).

The diagnosis benchmark's correct alternative kernels (``benchmarks/faults/alt_kernels.py``:
split-K GEMMs, Welford batch/layer norms, Winograd 3x3 convolutions, online softmax, blocked
sequential sums, libm functions within 2 ulp, AdamW ops in another association) are planted below
capture on two real models - the CNN in float32, tiny GPT under bf16 autocast - and the dump is
compared with a plain float32 CPU bench by ``compare(...)`` with default settings: it passes with
no root cause. With the budget the CPU reference kernel's error alone gives (no kernel bound), the
same dumps had a root cause each (a Welford batch norm, a 2-ulp exp). A real fault planted at such
a call, on top of the alternative kernels, is still the root cause the judgement names.
"""
from __future__ import annotations

import contextlib
import sys

import pytest

from locations import REPO_ROOT

torch = pytest.importorskip("torch")

if REPO_ROOT not in sys.path:  # ``benchmarks`` is imported from the repository root
    sys.path.insert(0, REPO_ROOT)

import torch.nn.functional as F  # noqa: E402

from benchmarks.faults import alt_kernels as AK, dumps, runner  # noqa: E402
from benchmarks.faults.planting import BelowCapture, Site  # noqa: E402
from pytest_ptdbg.judge import own_error  # noqa: E402


class _Below:
    """Alternative kernels, and optionally a planted fault over them, below capture."""

    layer = "below"

    def __init__(self, families, fault=None):
        self.alt = AK.AltKernels(families)
        self.fault = fault
        self.mode = self

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self.alt)
        if self.fault is not None:
            self._stack.enter_context(self.fault)
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)


CASES = {
    # arch, device, kernel families, the call the old budget failed, a fault at such a call
    "cnn-fp32": ("cnn", "same", ["welford", "winograd", "splitk", "seqsum", "adamw"], "Functional_batch_norm",
                 lambda: BelowCapture(Site(lambda: F.batch_norm, 1), "alt-bn1", 1e-3)),
    "gpt-bf16": ("tiny_gpt", "bf16", ["libm", "splitk", "welford", "online_softmax", "seqsum"], "Tensor_exp",
                 lambda: BelowCapture(Site(lambda: torch.Tensor.exp, 0), "alt-exp0", 1e-4)),
}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return runner.Workspace(str(tmp_path_factory.mktemp("alt")))


def _dump_and_compare(ws, arch, device, plant, name):
    out = ws.scratch(name)
    dumps.dump_step(arch, out + "/dump", dumps.DEVICES[device], plant)
    return runner._compare(out + "/dump", ws.clean_dump(arch, None), out + "/cmp", False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_correct_alternative_kernels_pass_and_a_fault_among_them_is_named(ws, case, monkeypatch):
    arch, device, fams, api, fault = CASES[case]
    plant = _Below(fams)
    res = _dump_and_compare(ws, arch, device, plant, case)
    assert plant.alt.used, "no alternative kernel ran"
    causes = [c.api for c in res.judgement.root_causes]
    assert res.passed and not causes, causes
    assert any(v.api.startswith(api) for v in res.judgement.replay.judged)

    # the old budget (the CPU reference kernel's error alone) calls a correct kernel a root cause
    with monkeypatch.context() as m:
        m.setattr(own_error.A, "kernel_bound", lambda *a, **k: 0.0)
        old = _dump_and_compare(ws, arch, device, _Below(fams), case + "-old")
        assert any(c.api.startswith(api) for c in old.judgement.root_causes)

    faulty = _Below(fams, fault())
    res = _dump_and_compare(ws, arch, device, faulty, case + "-fault")
    assert faulty.fault.record.fired_at is not None
    causes = [c.api for c in res.judgement.root_causes]
    assert not res.passed and causes and causes[0].startswith(api), causes
