"""One list of arguments that never change values, shared by the compare and the judgement."""
from types import SimpleNamespace as NS

import pytest

from pytest_ptdbg.comparison import arguments as A


def _api(name, api_type, kwargs):
    t = NS(slot="input.0", shape=(2, 3), dtype="torch.float32",
           extra={"call": {"args": [{"t": "input.0"}], "kwargs": kwargs}})
    return NS(api_type=api_type, api_name=name, tensors=[t], key=f"{api_type}_{name}_0_forward")


@pytest.mark.parametrize("name,a,b", [("requires_grad", True, False), ("pin_memory", True, False),
                                      ("layout", {"layout": "torch.strided"}, {"layout": "torch.sparse_coo"})])
def test_the_compare_ignores_what_the_judgement_ignores(name, a, b):
    # before: the compare compared requires_grad/pin_memory/layout (a changed argument, a failing
    # row) while the judgement's changed_args ignored them
    leaves = {x.param: x for x in A.compare_arguments(_api("zeros_like", "Torch", {name: a}),
                                                      _api("zeros_like", "Torch", {name: b}))}
    assert leaves[name].status == "ignored"
    assert leaves[name].message == f"{name}: not compared (does not change the result)"


def test_one_list_each_with_why():
    from pytest_ptdbg.judge.own_error import IGNORED_ARGUMENTS, changed_arguments

    assert IGNORED_ARGUMENTS is A.IGNORED
    assert set(A.IGNORED_WHY) == A.IGNORED >= {"device", "_stacklevel", "inplace", "non_blocking",
                                               "memory_format", "layout", "pin_memory", "requires_grad", "out"}
    assert all(isinstance(w, str) and w for w in A.IGNORED_WHY.values())
    spec = {"args": [{"t": "input.0"}], "kwargs": {"requires_grad": True}}
    assert changed_arguments(spec, {"args": [{"t": "input.0"}], "kwargs": {"requires_grad": False}}) == []
