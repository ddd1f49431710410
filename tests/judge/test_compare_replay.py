"""compare()'s default judgement on real dumps: an API imprecise by itself vs one that amplifies.

Both runs train the MLP for one step with a softmax over large logits (fc2's output x 1000) in
the middle. Against a clean bench:

* "fault": the 3rd ``F.linear`` call (fc3) rounds its output to bfloat16 inside the call (a
  reduced-precision kernel); everything before it is identical;
* "amp": fc1's weights carry relative noise of 1e-6; the softmax turns that into a large
  difference although it computes exactly what the bench computes from the same inputs.
"""
import pytest

from real_dumps import dump_one_step, patched, perturb

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

SCALE = 1000.0


def _bf16_linear(orig, call_index):
    state = {"n": 0}

    def linear(*args, **kwargs):
        ts = tuple(a for a in args if isinstance(a, torch.Tensor))
        if torch.overrides.has_torch_function(ts):
            return torch.overrides.handle_torch_function(linear, ts, *args, **kwargs)
        k, state["n"] = state["n"], state["n"] + 1
        out = orig(*args, **kwargs)
        if k == call_index:
            with torch._C.DisableTorchFunction():  # part of the kernel, not an API call
                out = out.to(torch.bfloat16).to(out.dtype)
        return out

    linear.__module__ = "torch.nn.functional"
    return linear


def _planted(fault=False, noise=0.0):
    """``dump_one_step`` arguments of a run: the large-logit softmax, ``noise`` on fc1, the fault."""
    def prepare(model):
        if noise:
            perturb(model, "fc1.weight", rel=noise)
        return [model.fc2.register_forward_hook(lambda m, i, o: F.softmax(o * SCALE, dim=-1))]

    around = (lambda: patched(F, "linear", _bf16_linear(F.linear, 2))) if fault else None
    return dict(prepare=prepare, around=around)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mk = tmp_path_factory.mktemp
    return {"bench": dump_one_step(mk("bench"), **_planted()).rank_dir,
            "fault": dump_one_step(mk("fault"), **_planted(fault=True)).rank_dir,
            "amp": dump_one_step(mk("amp"), **_planted(noise=1e-6)).rank_dir}


def test_reduced_precision_api_is_a_root_cause_over_its_budget(runs, compare_pair):
    r = compare_pair(runs["fault"], runs["bench"], stack_mode=True)
    assert not r.passed and r.gate == "judge"
    first = r.first_suspect
    assert first.api == "Functional_linear_2_forward" and first.kind == "own", r.advice.text()
    assert first.fault == "reduced-precision kernel" and first.replay == "own"
    (rc,) = [c for c in r.judgement.root_causes if c.api == first.api]
    assert rc.cause == "own error over budget" and rc.ratio > 10
    assert 1e-4 < rc.own_error < 1e-2 and rc.budget < 1e-5  # bf16 rounding vs an fp32 budget
    v = r.judgement.replay.by_api()[first.api]
    assert v.matches_dtype == "torch.bfloat16" and v.compute_dtype == "torch.float32"
    # every other call of the step is within its budget; the in-kernel bf16 round trip also
    # rounds the gradient flowing back through it, so its backward is a root cause too
    assert [c.api for c in r.judgement.root_causes] == [first.api, "Functional_linear_2_backward"]
    text = open(r.advisor_path).read()
    assert "Judgement: FAILED" in text and "ROOT CAUSE Functional_linear_2_forward" in text
    assert "float32" in first.advice and not r.problems


def test_amplified_upstream_difference_is_within_budget_and_labelled(runs, compare_pair):
    # 1e-6 weight noise: no root cause
    assert compare_pair(runs["amp"], runs["bench"], "default", stack_mode=True).passed
    # the dtype rule fails the softmax's rows ...
    r = compare_pair(runs["amp"], runs["bench"], stack_mode=True, rule="dtype")
    assert not r.passed and r.gate == "dtype"
    assert r.judgement.passed, r.judgement.text()  # ... the default judgement does not
    verdicts = r.judgement.replay.by_api()
    softs = [s for s in r.advice.suspects if s.family == "Functional_softmax"]
    assert softs, r.advice.text()  # the table alone blames the softmax: it amplifies the noise
    assert all(s.kind == "inherited" for s in softs)
    relabelled = [s for s in softs if s.replay == "inherited"]  # the table called these "own"
    assert relabelled, r.advice.text()
    for soft in relabelled:
        assert soft.role == "amplifier" and "amplified from upstream" in soft.advice
        assert str(verdicts[soft.api].status) == "within budget" and verdicts[soft.api].ratio <= 1


def test_without_replay_the_step_is_judged_from_statistics(runs, compare_pair):
    r = compare_pair(runs["fault"], runs["bench"], stack_mode=True, replay_check=False)
    assert r.judgement.replay is None and r.judgement.by_statistics
    # the bf16 rounding (2e-3 of the range) is below what statistics resolve (1%): weaker, and said
    assert "localisation is weaker" in open(r.advisor_path).read()
    from pytest_ptdbg.judge.step import rescan_hint

    assert rescan_hint(["Functional_linear_2_forward", "Functional_linear_2_backward"]) == (
        'debugger.configure_hook(mode="list", scope=[\'Functional_linear_2_\'], summary_only=False)')
