"""Small pieces of the plugin, without inner sessions: the rule a threshold selects, summary lines."""
import pytest

from pytest_ptdbg.plugin.options import Settings, per_test
from pytest_ptdbg.plugin.summary import entry_line


def test_the_judgement_is_the_default_and_a_threshold_selects_its_rule():
    base = Settings()
    assert base.rule == "judge"
    assert per_test(base, {"rtol": 1e-3}, "marker").rule == "dtype"
    assert per_test(base, {"max_fail_fraction": 0.01}, "marker").rule == "dtype"
    assert per_test(base, {"cosine": 0.999}, "marker").rule == "ptdbg"
    assert per_test(base, {"rule": "ptdbg"}, "marker").rule == "ptdbg"
    with pytest.raises(ValueError, match="allowed: judge, ptdbg, dtype"):
        per_test(base, {"rule": "fuzzy"}, "marker")


def test_a_passing_comparison_names_no_first_suspect():
    suspect = {"api": "VF_lstm_0_forward", "location": "models.py:285"}
    passed = entry_line({"verdict": "passed", "nodeid": "t.py::a", "first_suspect": suspect})
    failed = entry_line({"verdict": "failed", "nodeid": "t.py::a", "first_suspect": suspect})
    assert "first suspect: none" in passed and "VF_lstm" not in passed
    assert "first suspect: VF_lstm_0_forward (models.py:285)" in failed
