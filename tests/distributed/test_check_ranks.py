"""Cross-rank consistency of one real 4-process gloo data-parallel step (``ptdbg check-ranks``).

One spawn dumps the same step four times (``dp_step.py``): clean and with rank 2's first
all_reduce result off by 1e-3 (below the debugger: the dump holds what the faulty link returned),
each with full tensors and statistics only.
"""
import json
import os
import shutil
import sys

import pytest
import torch.distributed as dist

from pytest_ptdbg.api import check_ranks
from pytest_ptdbg.cli import main as cli_main
from pytest_ptdbg.format import records

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_step  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")

WORLD = 4
PLANTED = 2
N_PARAMS = 6   # the MLP's weights and biases: one all_reduce and one SGD update each


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    dumps = {"clean": (False, -1), "planted": (False, PLANTED), "clean_stats": (True, -1),
             "planted_stats": (True, PLANTED)}
    dp_step.run(root, [(str(root / name), summary, plant) for name, (summary, plant) in dumps.items()],
                world=WORLD, timeout=90)
    return {name: records.step_dir(str(root / name), 0) for name in dumps}


def _copy(src, dst, ranks=None):
    os.makedirs(dst)
    for r in (ranks if ranks is not None else range(WORLD)):
        shutil.copytree(os.path.join(src, f"rank{r}"), os.path.join(dst, f"rank{r}"))
    return str(dst)


@pytest.mark.parametrize("name", ["clean", "clean_stats"])
def test_a_clean_data_parallel_step_agrees_on_every_rank(steps, name):
    res = check_ranks(steps[name])
    assert res.passed, res.summary()
    assert res.ranks == [0, 1, 2, 3] and res.expected_ranks == WORLD
    assert res.divergences == [] and res.problems == []
    # 6 all_reduce + broadcast + all_gather + all_gather_into_tensor, 6 SGD updates, 3 linears of the
    # next forward reading the updated parameters
    assert res.calls_checked == N_PARAMS + 3 + N_PARAMS + 3
    # outputs: 6 + 1 + 4 gathered + 1; optimizer: param, grad, lr, output; next forward: weight, bias
    assert res.tensors_checked == N_PARAMS + 1 + WORLD + 1 + 4 * N_PARAMS + 2 * 3


@pytest.mark.parametrize("name, compared", [("planted", "data"), ("planted_stats", "statistics")])
def test_a_rank_whose_all_reduce_result_differs_is_named_first(steps, name, compared):
    res = check_ranks(steps[name])
    assert not res.passed
    assert res.problems == []
    first = res.first
    assert (first.rank, first.api, first.slot, first.kind) == (PLANTED, "Distributed_all_reduce_0_forward",
                                                                "output.0", "collective")
    assert first.tensor == "Distributed_all_reduce_0_forward_output.0"
    assert first.reference == (0, 1, 3) and first.compared == compared
    assert res.diverging_ranks == [PLANTED]
    if compared == "data":
        assert first.max_abs == pytest.approx(dp_step.PLANT_DELTA, rel=1e-3)
        assert first.n_diff == first.n_total == 64 * 32
    else:
        assert first.max_abs > 0 and first.n_diff >= 1
    # the fault flows on: the optimizer's gradient and update of that parameter, then the next forward
    later = [(d.api, d.slot, d.kind) for d in res.divergences[1:]]
    assert later == [("Tensor_add__0_forward", "input.1", "optimizer"),
                     ("Tensor_add__0_forward", "output.0", "optimizer"),
                     ("Functional_linear_3_forward", "input.1", "parameter")]
    assert "First divergence: rank2: Distributed_all_reduce_0_forward output.0" in res.summary()


def test_two_ranks_that_differ_are_judged_against_rank0(steps, tmp_path):
    step = tmp_path / "step0"
    os.makedirs(step)
    shutil.copytree(os.path.join(steps["clean"], "rank0"), step / "rank0")
    shutil.copytree(os.path.join(steps["planted"], f"rank{PLANTED}"), step / "rank1")
    res = check_ranks(str(step))
    assert not res.passed
    # the all_gather gathered four tensors: ranks 2 and 3 are missing, and named
    assert len(res.problems) == 1 and "rank folder(s) missing: rank2, rank3" in res.problems[0]
    assert (res.first.rank, res.first.api, res.first.reference) == (1, "Distributed_all_reduce_0_forward", (0,))


@pytest.mark.parametrize("gone, named", [(3, "rank3"), (1, "rank1")])
def test_a_missing_rank_folder_is_a_named_failure(steps, tmp_path, gone, named):
    step = _copy(steps["clean"], tmp_path / "step0", [r for r in range(WORLD) if r != gone])
    res = check_ranks(step)
    assert not res.passed
    assert res.expected_ranks == WORLD   # rank3's absence is seen from the all_gather's four tensors
    assert any(f"rank folder(s) missing: {named}" in p for p in res.problems), res.problems
    assert res.divergences == []


def test_a_missing_rank_beyond_what_the_dump_shows_needs_world_size(steps, tmp_path):
    step = _copy(steps["clean"], tmp_path / "step0")
    assert check_ranks(step, world_size=WORLD).passed
    res = check_ranks(step, world_size=WORLD + 1)
    assert not res.passed and any("rank4" in p for p in res.problems)


def test_an_incomplete_or_unreadable_rank_is_a_named_failure(steps, tmp_path):
    step = _copy(steps["clean"], tmp_path / "step0")
    pkl = os.path.join(step, "rank1", records.pkl_name("api_stack"))
    with open(pkl, "rb") as f:
        data = f.read()
    with open(pkl, "wb") as f:   # killed mid-write: half the records
        f.write(data[: len(data) // 2])
    npy = os.path.join(step, "rank2", "api_stack_dump", "Distributed_all_reduce_3_forward_output.0.npy")
    os.unlink(npy)
    res = check_ranks(step)
    assert not res.passed
    text = "\n".join(res.problems)
    assert "rank1:" in text and "incomplete" in text
    assert "rank2:" in text and "Distributed_all_reduce_3_forward_output.0" in text
    # a call the truncated rank never recorded is named, never skipped
    assert any("not recorded on rank1" in p for p in res.problems), res.problems


def test_cli_check_ranks_exit_status_and_reports(steps, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli_main(["check-ranks", steps["clean"], "-o", str(out)]) == 0
    assert "All ranks agree." in capsys.readouterr().out
    dump_path = os.path.dirname(os.path.dirname(steps["planted"]))   # a dump_path with one step is enough
    assert cli_main(["check-ranks", dump_path, "-o", str(out), "-q"]) == 1
    line = capsys.readouterr().out
    assert "FAILED; first divergence: rank2 Distributed_all_reduce_0_forward output.0" in line
    reports = sorted(os.listdir(out))
    assert sum(r.endswith(".txt") for r in reports) == 2 and sum(r.endswith(".json") for r in reports) == 2
    failed = [json.load(open(out / r)) for r in reports if r.endswith(".json")]
    failed = [j for j in failed if not j["passed"]][0]
    assert failed["first"]["rank"] == PLANTED and failed["first"]["api"] == "Distributed_all_reduce_0_forward"
    assert failed["diverging_ranks"] == [PLANTED]
    assert cli_main(["check-ranks", str(tmp_path / "nowhere")]) == 2


def test_a_step_with_nothing_to_check_across_ranks_never_passes(tmp_path):
    """Two ranks of a step with no collective and no optimizer step (a forward only): nothing was
    compared, so the check cannot say the ranks agree."""
    import example_models as em
    from real_dumps import dump_user_step

    model, batch = em.mlp(seed=0)
    dump_user_step(str(tmp_path / "d"), lambda: model.loss(batch))
    step = os.path.dirname(records.rank_dir(str(tmp_path / "d"), 0))
    shutil.copytree(os.path.join(step, "rank0"), os.path.join(step, "rank1"))
    res = check_ranks(step)
    assert res.tensors_checked == 0 and not res.passed
    assert any("nothing to check" in p for p in res.problems)
