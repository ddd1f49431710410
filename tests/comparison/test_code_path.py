"""The one-sided call classification's kernels (comparison/code_path.py), on hand-computed values."""
from types import SimpleNamespace as NS

import numpy as np

from pytest_ptdbg.comparison import code_path as CP


def test_statistics_relation_scales_the_mean_by_the_largest_magnitude():
    eps = 2.0 ** -10                       # float16's unit
    a = [4.0, -4.0, 0.001, 10.0]           # max, min, mean (near zero), l2norm
    # the mean moved by 0.003: 3 times its own size, but well inside eps x 4 (= 0.0039)
    assert CP.stats_relation(a, [4.0, -4.0, 0.004, 10.0], eps) == "rounding"
    # beyond eps x 4 it is not a rounding
    assert CP.stats_relation(a, [4.0, -4.0, 0.006, 10.0], eps) == "different"
    # max, min and the norm are judged against themselves: 10 -> 10.02 is 2e-3 > eps
    assert CP.stats_relation(a, [4.0, -4.0, 0.001, 10.02], eps) == "different"
    assert CP.stats_relation(a, list(a), eps) == "equal"


def test_a_rounding_into_float16_allows_its_subnormal_step():
    src = NS(dtype="torch.float32")
    out = NS(dtype="torch.float16")
    a = np.array([1e-8, 3e-8, 0.5, 2.0])                     # gradients below fp16's normal range
    b = a.astype(np.float16).astype(np.float64)              # what a cast to float16 makes of them
    data = {id(src): a, id(out): b}
    assert CP._data_relation(src, out, 2.0 ** -11, lambda t: data[id(t)]) == "rounding"
    b2 = b.copy()
    b2[2] = 0.51                                             # a changed value is not a rounding
    data[id(out)] = b2
    assert CP._data_relation(src, out, 2.0 ** -11, lambda t: data[id(t)]) == "different"


def test_a_lossless_cast_to_a_new_16_bit_dtype_is_flagged_and_a_known_one_is_not():
    cast = NS(direction="forward", tensors=[NS(io="input", dtype="torch.float32"),
                                            NS(io="output", dtype="torch.float16")])
    assert CP.new_half_precision(cast, {"torch.float32"}) == "torch.float16"
    assert CP.new_half_precision(cast, {"torch.float32", "torch.float16"}) == ""   # autocast had it
    back = NS(direction="backward", tensors=cast.tensors)
    assert CP.new_half_precision(back, set()) == ""
