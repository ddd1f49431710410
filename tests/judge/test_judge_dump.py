"""judge_dump on real dumped training steps: every call by its own error, one dump by itself."""
import os

import pytest

from real_dumps import dump_one_step, patched, relu_times

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from pytest_ptdbg.judge import judge_dump  # noqa: E402


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    mk = tmp_path_factory.mktemp
    clean = dump_one_step(mk("clean")).rank_dir
    bad = dump_one_step(mk("bad"), around=lambda: patched(torch, "relu", relu_times(1.001)(torch.relu))).rank_dir
    stats = dump_one_step(mk("stats"), summary_only=True).rank_dir
    return {"clean": clean, "bad": bad, "stats": stats}


def test_a_clean_step_is_within_budget_everywhere_adamw_included(dumps):
    j = judge_dump(dumps["clean"])
    assert j.passed and j.judged and not j.not_judged, j.text()
    opt = [v for v in j.verdicts if v.ctx == "optimizer"]
    assert opt and all(str(v.status) == "within budget" for v in opt)  # 0-d in-place step_t += 1 too
    assert max(v.ratio for v in j.judged) <= 1.0 and j.seconds > 0


def test_a_faulty_kernel_is_the_only_root_cause(dumps):
    j = judge_dump(dumps["bad"])
    # the scaling inside the kernel is differentiated too: its backward is wrong for its inputs
    assert [v.api for v in j.root_causes] in (["Torch_relu_0_forward"],
                                              ["Torch_relu_0_forward", "Torch_relu_0_backward"]), j.text()
    v = j.root_causes[0]
    assert 5e-4 < v.own_error < 2e-3 and v.ratio > 100 and v.compute_dtype == "torch.float32"


def test_statistics_only_dump_is_listed_not_judged(dumps):
    j = judge_dump(dumps["stats"])
    assert j.verdicts and not j.judged and j.passed
    assert {v.reason for v in j.not_judged} == {"statistics only (no saved tensors)"}


def test_full_device_dump_against_a_statistics_only_golden_is_judged_by_replay(dumps, compare_pair):
    def pkl(rank):
        return os.path.join(rank, "api_stack_dump.pkl")

    def data(rank):
        return os.path.join(rank, "api_stack_dump")

    r = compare_pair(pkl(dumps["bad"]), pkl(dumps["stats"]), npu_data=data(dumps["bad"]))
    assert r.summary_compare and r.judgement.replay is not None
    assert not r.passed and r.first_suspect.api == "Torch_relu_0_forward", r.advice.text()
    assert compare_pair(pkl(dumps["clean"]), pkl(dumps["stats"]), "ok", npu_data=data(dumps["clean"])).passed
    assert os.path.exists(r.advisor_path)


def test_multihead_attention_with_dropout_is_not_judged_without_a_generator_state(dump_step):
    """nn.TransformerEncoderLayer in training: F.multi_head_attention_forward drops attention
    weights (dropout_p=0.1) that a replay cannot draw again; a clean step has no root cause, the
    attention calls are listed as not judged, the rest is judged."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1)
    x = torch.randn(6, 2, 32)
    # the second call's inputs require grad
    rank = dump_step("dump", lambda: layer(layer(x)).sum().backward()).rank_dir
    j = judge_dump(rank)
    assert j.passed and not j.root_causes, j.text()
    mha = [v for v in j.not_judged if v.family == "Functional_multi_head_attention_forward"]
    assert len(mha) == 4 and all("dropout_p=0.1" in v.reason for v in mha), j.text()
    assert any(v.family == "Functional_linear" and str(v.status) == "within budget" for v in j.verdicts)


def test_a_call_the_replay_cannot_judge_is_judged_from_its_statistics(dump_step, compare_pair, monkeypatch):
    """A faulty API outside the replay allowlist (here relu, taken out of the table) must not pass
    unseen: the calls around it are right for their own inputs, so only its statistics show it."""
    from pytest_ptdbg.replayer import allowlist

    clean = dump_step("clean")
    bad = dump_step("bad", around=lambda: patched(torch, "relu", relu_times(1.05)(torch.relu)))
    for key in [k for k in allowlist.REPLAYABLE if k.endswith("_relu")]:
        monkeypatch.delitem(allowlist.REPLAYABLE, key)

    r = compare_pair(bad, clean)
    relu = [v for v in r.judgement.replay.not_judged if v.family == "Torch_relu"]
    assert relu, r.judgement.text()                       # the replay could not judge it ...
    assert not r.passed                                   # ... and the step still fails, on it
    assert r.judgement.first.api == "Torch_relu_0_forward", r.judgement.text()
    assert "judged from statistics" in r.judgement.first.detail
    assert compare_pair(clean, clean, "ok").passed
