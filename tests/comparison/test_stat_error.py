"""The range-scaled statistics error (comparison/stat_error.py) against hand-computed values."""
import math

import numpy as np

from pytest_ptdbg.comparison.stat_error import largest_difference, range_scaled, scaled_one, value_range


def test_value_range():
    r = value_range(np.array([2.0, -1.0, np.nan, math.inf, np.nan]), np.array([-3.0, 0.5, 4.0, 1.0, np.nan]))
    assert r[:4].tolist() == [3.0, 1.0, 4.0, math.inf] and math.isnan(r[4])
    f = value_range(np.array([math.inf, np.nan]), np.array([-2.0, np.nan]), finite_only=True)
    assert f.tolist() == [2.0, 0.0]   # a non-finite statistic does not set the scale


def test_largest_difference():
    d = largest_difference(np.array([0.1, np.nan]), np.array([-0.3, np.nan]), np.array([0.2, 0.05]))
    assert d.tolist() == [0.3, 0.05]


def test_range_scaled():
    e = range_scaled(np.array([0.5, 0.0, 2.0, 0.0, np.nan]), np.array([2.0, 0.0, 0.0, 3.0, 0.0]))
    assert e.tolist() == [0.25, 0.0, 1.0, 0.0, 0.0]
    t = range_scaled(np.array([2.0, 0.0]), np.array([0.0, 0.0]), when_zero=math.inf)
    assert t.tolist() == [math.inf, 0.0]
    assert math.isnan(float(range_scaled(np.nan, 2.0)))


def test_scaled_one_is_range_scaled_of_one_value():
    values = [0.0, 0.5, 2.0, 1e-300, 1e308, math.inf, math.nan]
    for d in values:
        for s in [0.0, 2.0, 1e-308, 3.0, math.inf, math.nan, -1.0]:
            for wz in (1.0, math.inf):
                got, want = scaled_one(d, s, wz), float(range_scaled(d, s, when_zero=wz))
                assert got == want or (math.isnan(got) and math.isnan(want)), (d, s, wz)
    assert scaled_one(0.5, 2.0) == 0.25 and scaled_one(2.0, 0.0) == 1.0 and scaled_one(0.0, 0.0) == 0.0
    assert scaled_one(1e308, 1e-10) == math.inf and math.isnan(scaled_one(math.nan, 2.0))
