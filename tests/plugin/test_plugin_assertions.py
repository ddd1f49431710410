"""assert_precision / evaluate on a plain CompareResult (outside the fixture), on real dumps:
thresholds and rules given to the helper judge the table again (``comparison/rejudge.py``)."""
import dataclasses
import math

import pandas as pd
import pytest
import torch

import example_models as em
from comparing import input_param_for
from pytest_ptdbg import PrecisionError, assert_precision, compare
from pytest_ptdbg.plugin.assertions import evaluate
from pytest_ptdbg.plugin.compat import to_thresholds
from pytest_ptdbg.plugin.options import Settings
from pytest_ptdbg.comparison.rejudge import rejudge_table
from pytest_ptdbg.plugin.run import preserved_rng, run_model


def _flip_second_layer(model, batch):
    # the device under test computes fc2 with a wrong sign; flipped through numpy (no recorded
    # call: an extra call on one side would fail the compare as unpaired, whatever the thresholds)
    w = model.fc2.weight.data.numpy()
    w *= -1.0
    return em.train_step(model, batch)


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    """MLP train step dumped three ways on CPU: fc2 sign-flipped, bf16 autocast, fp32 bench."""
    root = tmp_path_factory.mktemp("dumps")
    model, batch = em.mlp()
    cpu = torch.device("cpu")
    out = {}
    with preserved_rng([cpu]):
        for name, step, dtype in (("flip", _flip_second_layer, "float32"),
                                  ("bf16", em.train_step, "bfloat16"),
                                  ("bench", em.train_step, "float32")):
            out[name] = run_model(model, batch, step, device=cpu, dtype=dtype,
                                  dump_path=str(root / name), settings=Settings(),
                                  summary_only=False)
    return out, root


@pytest.fixture(scope="module")
def dumps(sides):
    out, root = sides
    return input_param_for(out["flip"], out["bench"]), root


def _compare(params, out, settings, **kw):
    return compare(params, str(out), rule=settings.rule, thresholds=to_thresholds(settings),
                   replay_check=False, **kw)


def test_failure_message_and_sufficient_tolerance(dumps):
    params, root = dumps
    # the per-tensor threshold rule (the default judgement offers no tolerance: see below)
    result = compare(params, str(root / "out"), stack_mode=True, rule="ptdbg")
    with pytest.raises(PrecisionError) as exc:
        assert_precision(result)
    msg = str(exc.value)
    assert "first suspect: " in msg and "would have passed with: assert_precision(" in msg
    assert result.html_path in msg and result.csv_path in msg
    ev = exc.value.evaluation
    assert not ev.passed and ev.n_failed > 0 and ev.needed
    # the tolerance the message offers does pass when given to compare
    loose = Settings(thresholds=ev.needed)
    again = compare(params, str(root / "loose"), rule="ptdbg", thresholds=to_thresholds(loose))
    assert evaluate(again).passed
    # under the default judgement the same change is a root cause, and no tolerance is offered
    judged = compare(params, str(root / "judged"), stack_mode=True)
    with pytest.raises(PrecisionError) as exc:
        assert_precision(judged)
    msg = str(exc.value)
    assert "root cause(s) found by the judgement" in msg and "would have passed with" not in msg
    assert exc.value.evaluation.root_causes and not exc.value.evaluation.needed


def test_ignore_lists_on_a_compare_result(dumps):
    params, root = dumps
    result = compare(params, str(root / "out2"), stack_mode=True)
    # only the first linear (before the flipped layer) is judged: it agrees
    assert_precision(result, only=["Functional_linear_0_forward"])
    assert evaluate(result, ignore=["linear_0"]).n_ignored > 0


def test_thresholds_on_a_compare_result_judge_its_table_again(sides, dumps):
    params, root = dumps
    failing = compare(params, str(root / "out3"), replay_check=False, rule="ptdbg")
    with pytest.raises(PrecisionError):
        assert_precision(failing)
    needed = evaluate(failing).needed
    assert_precision(failing, **needed)                 # looser: the failing result passes
    assert not failing.table["_passed"].all()           # the result itself is left as it was

    out, _ = sides
    bf16 = input_param_for(out["bf16"], out["bench"])
    passing = compare(bf16, str(root / "out4"), replay_check=False, rule="ptdbg")
    assert_precision(passing)                           # bf16 rounding passes ptdbg's defaults
    strict = {"cosine": 0.99999, "max_abs": 1e-6}
    with pytest.raises(PrecisionError, match="precision check failed"):
        assert_precision(passing, **strict)             # stricter: the passing result fails
    # the verdict of every row is the one compare() gives with the same thresholds
    for kw in (strict, dict(rule="dtype", rtol=0.05, atol=0.01),
               dict(rule="dtype", rtol=1e-9, atol=1e-12)):
        s = Settings(rule=kw.get("rule", "ptdbg"),
                     thresholds={k: v for k, v in kw.items() if k != "rule"})
        again = _compare(bf16, root / f"again-{len(kw)}-{s.rule}", s)
        mine = evaluate(passing, **kw)
        assert list(mine.table["_passed"]) == list(again.table["_passed"]), kw
        assert mine.passed == again.passed
    # statistics-only compare: exact under both rules
    summ = compare(bf16, str(root / "out5"), summary_compare=True, replay_check=False)
    for kw in ({"summary_rel": 1e-4}, {"rule": "dtype"}):
        s = Settings(rule=kw.get("rule", "ptdbg"),
                     thresholds={k: v for k, v in kw.items() if k != "rule"})
        again = _compare(bf16, root / f"summ-{s.rule}", s, summary_compare=True)
        assert list(evaluate(summ, **kw).table["_passed"]) == list(again.table["_passed"]), kw


def test_dtype_rule_rows_the_table_cannot_decide(sides, dumps):
    out, root = sides
    bf16 = input_param_for(out["bf16"], out["bench"])
    result = compare(bf16, str(root / "out6"), replay_check=False)
    assert result.input_param["npu_pkl_path"] == bf16["npu_pkl_path"]
    # without its inputs, the rows the table cannot decide are named
    bare = dataclasses.replace(result, input_param={})
    with pytest.raises(ValueError, match="cannot be judged from the compare table"):
        assert_precision(bare, rule="dtype")
    # compare() records its inputs, so those rows are compared again
    ev = evaluate(result, rule="dtype")
    again = _compare(bf16, root / "out7", Settings(rule="dtype"))
    assert list(ev.table["_passed"]) == list(again.table["_passed"]) and not ev.passed


def _row(**kw):
    base = {"NPU Name": "x", "NPU Tensor Dtype": "torch.float32",
            "Bench Tensor Dtype": "torch.float32", "NPU Tensor Shape": [4],
            "Bench Tensor Shape": [4], "Cosine": 1.0, "MaxAbsErr": 0.0, "MaxRelativeErr": 0.0,
            "One Thousandth Err Ratio": 1.0, "Five Thousandths Err Ratio": 1.0,
            "Bench max": 2.0, "Bench min": -1.0, "Accuracy Reached or Not": "Yes",
            "_paired": True, "_nan_mismatch": False, "_passed": True}
    base.update(kw)
    return base


def test_rejudge_table_dtype_bounds_by_hand():
    from pytest_ptdbg.comparison.verdict import Thresholds

    th = Thresholds(tolerances={"float32": (0.01, 0.001)})      # rtol 1e-2, atol 1e-3; A = 2
    table = pd.DataFrame([
        _row(**{"NPU Name": "abs_ok", "MaxAbsErr": 0.0009, "MaxRelativeErr": 5.0}),  # <= atol
        _row(**{"NPU Name": "rel_ok", "MaxAbsErr": 0.015, "MaxRelativeErr": 0.009}),  # <= rtol
        _row(**{"NPU Name": "fails", "MaxAbsErr": 0.0211, "MaxRelativeErr": 0.02,   # > .001+.02
                "One Thousandth Err Ratio": 0.5, "Five Thousandths Err Ratio": 0.6}),
        _row(**{"NPU Name": "between", "MaxAbsErr": 0.015, "MaxRelativeErr": 0.5,
                "One Thousandth Err Ratio": 0.9, "Five Thousandths Err Ratio": 0.95}),
        _row(**{"NPU Name": "unpaired", "MaxAbsErr": math.nan, "_paired": False,
                "Accuracy Reached or Not": "No", "_passed": False}),
    ])
    table.attrs["summary_compare"] = False
    out, undecided = rejudge_table(table, "dtype", th)
    assert list(out["Accuracy Reached or Not"]) == ["Yes", "Yes", "No", "Yes", "No"]
    assert undecided == ["between"]
    # 10% of elements may fail: 95% of "between"'s elements are within 5e-3 relative error,
    # half of "fails"'s are beyond it
    th.max_fail_fraction = 0.1
    out, undecided = rejudge_table(table, "dtype", th)
    assert undecided == ["fails"] and out.loc[3, "Accuracy Reached or Not"] == "Yes"
