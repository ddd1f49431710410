"""The memo keys of the compare: equal only for values the memoised result cannot tell apart."""
import math

import pytest

from pytest_ptdbg.comparison import arguments as A
from pytest_ptdbg.comparison import pairing as P
from pytest_ptdbg.dump.reader import ApiRec, TensorRec


@pytest.mark.parametrize("a,b", [
    ([1], (1,)),                        # list vs tuple
    ([True], [1]),                      # bool vs int
    ([1], [1.0]),                       # int vs float
    ([0.0], [-0.0]),                    # the sign of zero
    ([1e-05], [1.0000000000000002e-05]),  # floats bit for bit
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # dict order (keyword order is the call's)
    ({"t": "input.0"}, {"t": "input.1"}),
    (["1"], [1]),
    ([None], [[]]),
])
def test_frozen_tells_different_values_apart(a, b):
    assert A._frozen(a) != A._frozen(b)


def test_frozen_is_equal_for_equal_values_built_apart():
    def spec():
        return ([{"t": "input.0"}, {"tuple": [32]}], {"eps": 1e-05, "weight": None, "approximate": "tanh",
                                                      "big": 1 << 70, "x": math.inf})
    assert A._frozen(spec()) == A._frozen(spec())
    shared = "tanh"
    assert A._frozen([shared, shared]) == A._frozen(["tan" + "h", "ta" + "nh"])   # no back-references


def test_frozen_refuses_what_is_not_a_built_in_value():
    class Tag(str):
        pass

    for v in ([Tag("x")], [object()], {"k": A.MISSING}):
        with pytest.raises(ValueError):
            A._frozen(v)


def _rec(slot, dtype="torch.float32", shape=(2, 3), param=""):
    io, _, index = slot.partition(".")
    t = TensorRec(f"Tensor_add_0_forward_{slot}", "Tensor_add_0_forward", io, tuple(int(i) for i in index.split(".")),
                  "forward", dtype, shape, [1.0, 0.0, 0.5, 2.0], {}, 1)
    t.param = param
    return t


def _call(op, recs, k=0):
    return ApiRec(f"Tensor_{op}_{k}_forward", "Tensor", op, k, "forward", k, recs, op=op)


def _fresh_structure(api):
    P._STRUCTURES.clear()
    return P.signature(api).structure


@pytest.mark.parametrize("op", ["add", "sub"])   # commutative or not
def test_signature_remembered_is_the_signature_computed(op):
    variants = [
        [_rec("input.0"), _rec("input.1", shape=(3,)), _rec("output.0")],
        [_rec("input.0"), _rec("input.1", shape=(3,)), _rec("output.0", dtype="torch.bfloat16")],
        [_rec("input.0"), _rec("input.1", shape=(3,)), _rec("output.0", dtype="torch.int64")],
        [_rec("input.0"), _rec("input.1", shape=(2, 3)), _rec("output.0")],
        [_rec("input.0", param="input.input"), _rec("input.1", shape=(3,), param="input.other"), _rec("output.0")],
        [_rec("input.0", param="input.other"), _rec("input.1", shape=(3,), param="input.input"), _rec("output.0")],
        [_rec("input.0"), _rec("input.1", dtype="float", shape=()), _rec("output.0")],   # a Python number
        [_rec("input.0"), _rec("input.1", dtype="torch.float32", shape=()), _rec("output.0")],   # a 0-d tensor
    ]
    fresh = [_fresh_structure(_call(op, recs)) for recs in variants]
    P._STRUCTURES.clear()
    for k in range(3):   # each variant met again, in another order, under another call index
        for recs, want in list(zip(variants, fresh))[::(-1 if k % 2 else 1)]:
            sig = P.signature(_call(op, list(recs), k))
            assert sig.structure == want
            assert (sig.family, sig.call_index) == (op, k)


def test_signature_of_an_unhashable_shape_is_computed():
    api = _call("add", [_rec("input.0", shape=[2, 3]), _rec("output.0")])
    assert P.signature(api).structure == (("input.0", "float", (2, 3)), ("output.0", "float", (2, 3)))


def test_signature_remembered_per_operation():
    recs = [_rec("input.0", param="input.input"), _rec("input.1", shape=(3,), param="input.other"), _rec("output.0")]
    P._STRUCTURES.clear()
    add, sub = P.signature(_call("add", recs)).structure, P.signature(_call("sub", recs)).structure
    assert add != sub   # add's operands are named by order (commutative), sub's by parameter
    assert (add, sub) == (_fresh_structure(_call("add", recs)), _fresh_structure(_call("sub", recs)))
