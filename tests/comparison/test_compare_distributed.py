import os

import pytest

from pytest_ptdbg import compare_distributed
from pytest_ptdbg.format import records

import dumps


def _ranks(root, faults):
    for rank, fault in faults.items():
        dumps.write_dump(root, dumps.mlp_apis(seed=rank, fault=fault, fault_scale=0.5), rank=rank)
    return records.step_dir(root, 0)


def test_two_ranks_one_diverging(tmp_path):
    npu = _ranks(str(tmp_path / "npu"), {0: None, 1: "backward"})
    bench = _ranks(str(tmp_path / "bench"), {0: None, 1: None})
    # ptdbg's rule as the gate: these numpy dumps have no recorded calls to replay, and their 1%
    # gradient perturbation is below what the statistics-only default judgement resolves
    res = compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False, rule="ptdbg")
    assert list(res.results) == [(0, 0), (1, 1)]
    assert res.diverging == [(1, 1)] and not res.passed
    assert res.first_suspect_rank == (1, 1)
    assert res.results[(1, 1)].first_suspect.api == "Torch_relu_0_backward"
    names = sorted(os.listdir(tmp_path / "out"))
    assert any(n.startswith("compare_result_rank0-rank0_") and n.endswith(".csv") for n in names)
    assert any(n.startswith("advisor_rank1-rank1_") for n in names)
    assert "Diverging ranks: rank1-rank1" in res.summary and "Torch_relu_0_backward" in res.summary
    assert open(res.summary_path).read() == res.summary


def test_ranks_pair_numerically(tmp_path):
    npu = _ranks(str(tmp_path / "npu"), {2: None, 10: None})
    bench = _ranks(str(tmp_path / "bench"), {2: None, 10: None})
    res = compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False)
    assert list(res.results) == [(2, 2), (10, 10)] and res.passed and res.first_suspect_rank is None


def test_mismatched_rank_sets_are_named(tmp_path):
    npu = _ranks(str(tmp_path / "npu"), {0: None, 1: None})
    bench = _ranks(str(tmp_path / "bench"), {0: None})
    res = compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False)
    assert list(res.results) == [(0, 0)] and not res.passed
    assert "rank1 is only in the device dump" in res.errors[(1, 1)]
    os.makedirs(os.path.join(bench, "notes"))
    with pytest.raises(ValueError, match="only rank<N> folders.*notes"):
        compare_distributed(npu, bench, str(tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match="missing"):
        compare_distributed(npu, str(tmp_path / "missing"), str(tmp_path / "out"))


def test_an_unreadable_rank_is_named_and_the_others_compared(tmp_path):
    npu = _ranks(str(tmp_path / "npu"), {0: None, 1: None})
    bench = _ranks(str(tmp_path / "bench"), {0: None, 1: None})
    os.remove(os.path.join(bench, "rank1", "api_stack_dump.pkl"))
    res = compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False)
    assert list(res.results) == [(0, 0)] and res.results[(0, 0)].passed
    assert not res.passed and "rank1" in res.errors[(1, 1)]
    assert "rank1-rank1: not compared" in res.summary


def test_sixteen_ranks_in_worker_processes_with_per_rank_progress(tmp_path, capsys):
    npu = _ranks(str(tmp_path / "npu"), {r: ("backward" if r == 11 else None) for r in range(16)})
    bench = _ranks(str(tmp_path / "bench"), {r: None for r in range(16)})
    # ptdbg's rule as the gate, as in test_two_ranks_one_diverging (no calls to replay)
    res = compare_distributed(npu, bench, str(tmp_path / "out"), workers=2, replay_check=False, rule="ptdbg")
    assert list(res.results) == [(r, r) for r in range(16)]
    assert res.diverging == [(11, 11)] and res.first_suspect_rank == (11, 11)
    assert res.results[(11, 11)].first_suspect.api == "Torch_relu_0_backward"
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if "ranks]" in x]
    assert len(lines) == 16 and any("rank11-rank11: diverges" in x for x in lines)
    assert sum("[16/16 ranks]" in x for x in lines) == 1
    serial = compare_distributed(npu, bench, str(tmp_path / "out1"), workers=1, replay_check=False,
                                 is_print_compare_log=False, rule="ptdbg")
    assert serial.diverging == res.diverging
    assert capsys.readouterr().out.count("ranks]") == 0   # log off: nothing printed per rank
