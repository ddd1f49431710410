"""judge/finding.py: a root cause's words are built from its fields; its category reads fields."""
import math

from pytest_ptdbg.judge.finding import Cause, Evidence, FaultCategory, Finding
from pytest_ptdbg.judge.own_error import CallVerdict, Status


def _replayed(**kw):
    base = dict(api="Functional_softmax_1_forward", direction="forward", cause=Cause.OVER_BUDGET,
                evidence=Evidence.REPLAY, ratio=12.0, own_error=3e-3, budget=2.5e-4, worst="output.0",
                compute_dtype="torch.float32")
    base.update(kw)
    return Finding(**base)


def test_replay_detail_is_the_verdicts_words():
    f = _replayed(matches_dtype="torch.bfloat16")
    v = CallVerdict(f.api, "forward", 0, "Functional_softmax", Status.ROOT_CAUSE, ratio=12.0, own_error=3e-3,
                    budget=2.5e-4, worst="output.0", compute_dtype="torch.float32", matches_dtype="torch.bfloat16")
    assert v.text() == f"{f.api}: {f.detail}"
    assert f.detail.endswith("x12 of budget; it matches a torch.bfloat16 computation)")


def test_category_from_fields_not_text():
    assert _replayed(matches_dtype="torch.float16").category == FaultCategory.REDUCED_PRECISION
    assert _replayed(compute_dtype="torch.bfloat16").category == FaultCategory.REDUCED_PRECISION
    assert _replayed().category == FaultCategory.WRONG_FORMULA
    # a tensor named like a dtype does not make a reduced-precision kernel
    assert _replayed(worst="(bfloat16 output").category == FaultCategory.WRONG_FORMULA
    one = Finding("Tensor_to_3_forward", "forward", Cause.ONE_SIDED, Evidence.TABLE,
                  why="value-changing: a cast to lower precision (torch.float16) on this side only")
    assert one.category == FaultCategory.CODE_PATH
    assert one.detail == ("only on the device side: value-changing: a cast to lower precision "
                          "(torch.float16) on this side only")


def test_other_details():
    arg = Finding("Functional_layer_norm_0_forward", "forward", Cause.CHANGED_ARGUMENT, Evidence.TABLE,
                  changes=("eps: 1e-05 vs 0.001",))
    assert arg.detail == "eps: 1e-05 vs 0.001"
    assert Finding("a", "forward", Cause.CHANGED_ARGUMENT, Evidence.TABLE).detail == "a non-tensor argument differs"
    inp = Finding("a", "forward", Cause.INPUTS_DIFFER, Evidence.TABLE, tensor="0", input_error=0.5)
    assert inp.detail.startswith(inp.inputs_text + " before any recorded call differed")
    st = Finding("a", "forward", Cause.STATISTICS, Evidence.STATISTICS, ratio=2.0, own_error=0.2, budget=0.1,
                 input_error=1e-4, replay_missed=True)
    assert st.detail.startswith("statistics off by ") and st.detail.endswith(
        "(judged from statistics: the replay could not judge this call)")
    d = st.to_dict()
    assert list(d) == ["api", "direction", "detail", "order", "row", "family", "side", "ctx", "cause",
                       "ratio", "own_error", "budget"]
    assert d["cause"] == "own error by statistics" and d["ratio"] == 2.0
    assert Finding("a", "forward", Cause.NONFINITE, Evidence.STATISTICS, ratio=math.inf).to_dict()["ratio"] is None
