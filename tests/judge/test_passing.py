"""judge/passing.py: the one function that decides whether a compared step passes."""
import numpy as np

from pytest_ptdbg.judge.passing import passes


def test_passes_only_when_nothing_fails():
    assert passes()
    assert passes(failing_rows=np.zeros(3, bool), checks=[True, True])
    assert not passes(root_causes=["Torch_add_0_forward"])
    assert not passes(failing_rows=np.array([False, True]))
    assert not passes(unusable=["CSV line 2: unpaired"])
    assert not passes(problems=["unreadable dump"])
    assert not passes(checks=[True, False])          # e.g. the golden's own check failed
    assert passes(failing_rows=np.zeros(0, bool))    # an empty table has no failing row
