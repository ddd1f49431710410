"""advise/ranking.apply_judgement ranks the judgement's Findings first and leaves the advisor's
own suspects as they were (no text is parsed: the category and advice read the Finding's fields)."""
import copy

from synthetic import api, synthetic_table

from pytest_ptdbg.advise.advisor import advise
from pytest_ptdbg.advise.ranking import apply_judgement
from pytest_ptdbg.judge.finding import Cause, Evidence, Finding
from pytest_ptdbg.judge.step import StepJudgement


def test_judgement_ranks_findings_first_without_mutating_the_advisors_suspects():
    t = synthetic_table([api("Torch_add_0_forward", [0.0], [2e-2]),
                         api("Functional_softmax_0_forward", [2e-2], [2.1e-2])])
    advice = advise(t)
    before = [copy.deepcopy(s) for s in advice.suspects]
    originals = list(advice.suspects)
    f = Finding("Functional_softmax_0_forward", "forward", Cause.OVER_BUDGET, Evidence.REPLAY, order=1, row=2,
                family="Functional_softmax", ratio=8.0, own_error=4e-3, budget=5e-4, worst="output.0",
                compute_dtype="torch.float32", matches_dtype="torch.bfloat16")
    out = apply_judgement(advice, StepJudgement(False, [f]), t)
    assert out.suspects[0].api == f.api
    assert out.suspects[0].fault == "reduced-precision kernel"      # from matches_dtype, not text
    assert out.suspects[0].output_error == 4e-3
    assert "loses precision by itself" in out.suspects[0].advice
    assert [s.to_dict() for s in originals] == [s.to_dict() for s in before]   # nothing relabelled in place
