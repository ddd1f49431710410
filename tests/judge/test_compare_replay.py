"""compare() with the replay check on real dumps: an API imprecise by itself vs one that amplifies.

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

from pytest_ptdbg import compare  # noqa: E402

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


def _dump(root, fault=False, noise=0.0):
    def prepare(model):
        if noise:
            perturb(model, "fc1.weight", rel=noise)
        return [model.fc2.register_forward_hook(lambda m, i, o: F.softmax(o * SCALE, dim=-1))]

    around = (lambda: patched(F, "linear", _bf16_linear(F.linear, 2))) if fault else None
    return dump_one_step(root, prepare=prepare, around=around).rank_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mk = tmp_path_factory.mktemp
    return {"bench": _dump(mk("bench")), "fault": _dump(mk("fault"), fault=True),
            "amp": _dump(mk("amp"), noise=1e-6)}


def _compare(runs, npu, out, **kw):
    return compare({"npu_pkl_path": runs[npu], "bench_pkl_path": runs["bench"], "is_print_compare_log": False},
                   str(out), stack_mode=True, rule="dtype", **kw)


def test_reduced_precision_api_is_imprecise_on_identical_inputs(runs, tmp_path):
    r = _compare(runs, "fault", tmp_path)
    first = r.first_suspect
    assert first.api == "Functional_linear_2_forward" and first.kind == "own", r.advice.text()
    assert first.replay == "own"
    assert "imprecise on identical inputs" in first.advice
    (v,) = [v for v in r.advice.replay if v.api == first.api]
    assert v.own_error > 1e-4 and v.oracle_error > 1e-4 and v.bench_oracle_error < 1e-5
    text = open(r.advisor_path).read()
    assert "Replay check" in text and "OWN" in text and "imprecise on identical inputs" in text
    html = open(r.html_path).read()
    assert "<h2>Replay check</h2>" in html and "replay: own error" in html
    assert not [p for p in r.problems if "replay" in p]


def test_amplified_upstream_difference_is_called_inherited(runs, tmp_path):
    r = _compare(runs, "amp", tmp_path)
    softs = [s for s in r.advice.root_causes if s.family == "Functional_softmax"]
    assert softs and all(s.kind == "own" for s in softs), r.advice.text()  # the advisor alone blames it
    for soft in softs:
        assert soft.replay == "inherited" and soft.role == "amplifier"
        assert "inherited and amplified" in soft.advice and "Look upstream" in soft.advice
        (v,) = [v for v in r.advice.replay if v.api == soft.api]
        assert v.own_error < 1e-9 and v.amplification > 10 and v.oracle_error < 1e-6
        text = open(r.advisor_path).read()
        assert f"{soft.api}: INHERITED" in text and "amplifies" in text
    # demoted: every suspect confirmed by the replay check ranks before them
    ranks = [s.api for s in r.advice.root_causes]
    assert all(ranks.index(s.api) < ranks.index(softs[0].api) for s in r.advice.root_causes if s.replay == "own")


def test_replay_check_can_be_switched_off(runs, tmp_path):
    r = _compare(runs, "amp", tmp_path, replay_check=False)
    assert r.advice.replay == [] and all(s.replay == "" for s in r.advice.suspects)
    assert r.advice.root_causes and all("Replay" not in s.advice for s in r.advice.suspects)
    assert "Replay check" not in open(r.advisor_path).read()
