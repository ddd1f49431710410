"""The memo keys of the compare: equal only for values the memoised result cannot tell apart."""
import math

import pytest

from pytest_ptdbg.comparison import arguments as A


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
