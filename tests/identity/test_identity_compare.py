"""Issue 20 acceptance, compare: a call is what it computes, not how it was spelled.

One training step (forward, loss, backward, SGD) of the identity model (``idmodel``) is dumped in
its original spelling (the bench) and in a respelled or regressed variant (the device), and the
two dumps are compared with ``compare()``'s defaults (the replay judgement, full tensors):

* a pure refactor (the same numbers, bit for bit) passes with **every call paired**: no row is on
  one side only, no argument row differs, nothing is unusable;
* a regression (a change of what one call of block 0 computes) fails, and its first suspect is
  the changed call.
"""
import re

import pytest
import torch

import idmodel
from idmodel import REFACTORS, make, train_step
from real_dumps import dump_user_step


def _step(variant):
    """The step to dump: the model is built before the debugger starts (its initialisation is
    no part of the step)."""
    model, batch = make(variant)
    return lambda: train_step(model, batch)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The original spelling's dump, made once for the module."""
    torch.set_num_threads(1)
    return dump_user_step(tmp_path_factory.mktemp("identity") / "bench", _step(""))


def _device(dump_step, variant):
    torch.set_num_threads(1)
    return dump_step("dev_" + variant, _step(variant))


def _failing_rows(result):
    t = result.table
    return t.loc[~t["_passed"] | ~t["_paired"], ["NPU Name", "Bench Name", "Err_message"]].to_string()


def _unpaired(result):
    """Calls with a tensor on one side only (an argument row of a parameter that never changes the
    result, such as F.softmax's ``_stacklevel``, is on one side when the other spelling has no such
    parameter: it is not compared, and a changed argument is asserted on its own)."""
    t = result.table
    one = t[~t["_paired"] & (t["_arg"] == "")]
    return sorted(set(one["_api"]))


@pytest.mark.parametrize("variant", REFACTORS)
def test_pure_refactor_pairs_every_call_and_passes(variant, bench, dump_step, compare_pair):
    r = compare_pair(_device(dump_step, variant), bench)
    assert _unpaired(r) == [], f"{variant}: calls on one side only: {_unpaired(r)}"
    assert r.problems == [], r.problems
    t = r.table
    assert not t["_arg_changed"].any(), _failing_rows(r)
    assert not t["_unusable"].any(), _failing_rows(r)
    assert r.passed, f"{variant}: first suspect {r.first_suspect and r.first_suspect.api}\n{_failing_rows(r)}"
    assert r.first_suspect is None


def test_the_original_spelling_against_itself_pairs_every_call_and_passes(bench, dump_step, compare_pair):
    """The control: what every refactor must match (today's code passes it)."""
    r = compare_pair(_device(dump_step, ""), bench)
    assert _unpaired(r) == [] and r.problems == [] and r.passed


def test_device_passing_every_argument_by_keyword_pairs_every_call(bench, dump_step, compare_pair):
    """The device passes by keyword every argument the bench passes positionally (``F.linear(
    input=h, weight=w, bias=b)``, ``torch.add(input=x, other=a)``, ``x.view(size=...)``, ...):
    every call pairs with the bench's positional one, argument for argument."""
    r = compare_pair(_device(dump_step, "all_keywords"), bench)
    t = r.table
    assert _unpaired(r) == [], f"calls on one side only: {_unpaired(r)}"
    assert (t["_bench_api"] != "").all()
    assert not t["_arg_changed"].any(), _failing_rows(r)
    # every call of the bench is there, once
    assert t["_bench_api"].nunique() == t["_api"].nunique()
    assert r.passed, _failing_rows(r)


#: regression -> what the first suspect's API key must contain (the changed call; the hand-written
#: fp16 softmax may be named by its cast, its exp, or as the softmax it replaced)
REGRESSION_CULPRITS = {
    "reg_ln_eps": ("layer_norm",),
    "reg_softmax_fp16_nomax": ("Tensor_to", "exp", "softmax"),
    "reg_bf16_roundtrip": ("Tensor_to",),
    "reg_gelu_tanh": ("gelu",),
    "reg_scale_1001": ("mul",),
}


@pytest.mark.parametrize("variant", idmodel.REGRESSIONS)
def test_regression_fails_the_compare_naming_the_changed_call(variant, bench, dump_step, compare_pair):
    r = compare_pair(_device(dump_step, variant), bench)
    assert not r.passed, f"{variant} passed"
    first = r.first_suspect
    assert first is not None, f"{variant}: failed with no suspect: {r.problems}"
    culprits = REGRESSION_CULPRITS[variant]
    assert any(c in first.api for c in culprits), f"{variant}: first suspect {first.api}, expected {culprits}"
    assert first.direction == "forward"
    # block 0's call: the first call of its API on the device side
    m = re.search(r"_(\d+)(?:_forward|_backward)?$", first.api)
    assert m and m.group(1) == "0", f"{variant}: first suspect {first.api} is not block 0's call"
