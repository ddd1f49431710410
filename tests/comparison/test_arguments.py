"""Argument normalisation (comparison/arguments.py), against hand-written call specs."""
from types import SimpleNamespace as NS

from pytest_ptdbg.comparison import arguments as A


def _api(name, api_type, args, kwargs, in_shape=(2, 3, 4)):
    t = NS(slot="input.0", shape=in_shape, dtype="torch.float32",
           extra={"call": {"args": args, "kwargs": kwargs}})
    return NS(api_type=api_type, api_name=name, tensors=[t], key=f"{api_type}_{name}_0_forward")


def _by_param(leaves):
    return {(x.param, x.path): x for x in leaves}


def test_omitted_eps_equals_the_signature_default_and_a_change_names_both_values():
    x = {"t": "input.0"}
    given = _api("layer_norm", "Functional", [x, {"tuple": [4]}], {"eps": 1e-05})
    omitted = _api("layer_norm", "Functional", [x, {"tuple": [4]}], {})
    changed = _api("layer_norm", "Functional", [x, {"tuple": [4]}], {"eps": 0.01})
    leaves = _by_param(A.compare_arguments(given, omitted))
    assert leaves[("eps", ())].status == "same" and leaves[("normalized_shape", (0,))].status == "same"
    eps = _by_param(A.compare_arguments(omitted, changed))[("eps", ())]
    assert eps.status == "changed" and eps.message == "eps: 1e-05 (default) vs 0.01"
    assert eps.npu_slot == "" and eps.bench_slot == "input.2"   # kwargs are numbered after the args


def test_negative_dims_are_taken_modulo_the_input_rank():
    x = {"t": "input.0"}
    a = _api("softmax", "Torch", [x, -1], {})
    b = _api("softmax", "Torch", [x], {"dim": 2})
    assert _by_param(A.compare_arguments(a, b))[("dim", ())].status == "same"
    c = _api("softmax", "Torch", [x, 1], {})
    d = _by_param(A.compare_arguments(a, c))[("dim", ())]
    assert d.status == "changed" and d.message == "dim: 2 vs 1"
    # unsqueeze ranges over rank + 1: -1 on a 3-d input is 3
    u1, u2 = _api("unsqueeze", "Tensor", [x, -1], {}), _api("unsqueeze", "Tensor", [x, 3], {})
    assert _by_param(A.compare_arguments(u1, u2))[("dim", ())].status == "same"
    t1, t2 = _api("transpose", "Tensor", [x, -2, -1], {}), _api("transpose", "Tensor", [x, 1, 2], {})
    assert all(v.status == "same" for v in A.compare_arguments(t1, t2))


def test_ignored_parameters_strings_and_tolerance():
    x = {"t": "input.0"}
    a = _api("gelu", "Functional", [x], {"approximate": "none"})
    b = _api("gelu", "Functional", [x], {"approximate": "tanh"})
    g = _by_param(A.compare_arguments(a, b))[("approximate", ())]
    assert g.status == "changed" and g.message == "approximate: 'none' vs 'tanh'"
    s1 = _api("softmax", "Functional", [x], {"dim": -1, "_stacklevel": 3, "dtype": None})
    s2 = _api("softmax", "Functional", [x], {"dim": -1, "_stacklevel": 5, "dtype": None})
    lv = _by_param(A.compare_arguments(s1, s2))[("_stacklevel", ())]
    assert lv.status == "ignored"
    to1 = _api("to", "Tensor", [x, {"device": "cpu"}], {"non_blocking": True})
    to2 = _api("to", "Tensor", [x, {"device": "cuda:0"}], {})
    assert all(v.status in ("ignored", "unknown") for v in A.compare_arguments(to1, to2))
    m1 = _api("mul", "Tensor", [x, 0.1], {})
    m2 = _api("mul", "Tensor", [x, 0.1 * (1 + 1e-5)], {})     # a float from slightly other data
    m3 = _api("mul", "Tensor", [x, 0.2], {})
    assert A.compare_arguments(m1, m2)[0].status == "same"
    assert A.compare_arguments(m1, m3)[0].status == "changed"
    # x.to(q.dtype): bf16 under autocast, fp32 on the bench: a floating dtype follows the run's precision
    d1 = _api("softmax", "Torch", [x, -1], {"dtype": {"dtype": "torch.float"}})
    d2 = _api("softmax", "Torch", [x, -1], {"dtype": {"dtype": "torch.bfloat16"}})
    dt = _by_param(A.compare_arguments(d1, d2))[("dtype", ())]
    assert dt.status == "ignored" and dt.message.startswith("dtype: torch.float32 vs torch.bfloat16: a floating")
    f1 = _api("masked_fill", "Tensor", [x, {"t": "input.1"}, -3.4028234663852886e+38], {})
    f2 = _api("masked_fill", "Tensor", [x, {"t": "input.1"}, -3.3895313892515355e+38], {})
    assert _by_param(A.compare_arguments(f1, f2))[("value", ())].status == "ignored"
    i1 = _api("sum", "Tensor", [x], {"dtype": {"dtype": "torch.int64"}})
    i2 = _api("sum", "Tensor", [x], {"dtype": {"dtype": "torch.int32"}})
    it = _by_param(A.compare_arguments(i1, i2))[("dtype", ())]
    assert it.status == "changed" and it.message == "dtype: torch.int64 vs torch.int32"


def test_unknown_api_and_missing_spec():
    x = {"t": "input.0"}
    a = _api("frobnicate", "Tensor", [x, 3], {})
    b = _api("frobnicate", "Tensor", [x], {"k": 3})
    kinds = {v.param: v.status for v in A.compare_arguments(a, b)}
    assert kinds == {"arg1": "unknown", "k": "unknown"}          # not a failure, not a pass claim
    none = NS(api_type="Tensor", api_name="frobnicate", tensors=[NS(slot="input.0", shape=(2,), extra={})],
              key="k")
    assert A.compare_arguments(a, none) is None
