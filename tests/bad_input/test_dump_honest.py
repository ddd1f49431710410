"""A dump says only what is true of it (issue 18, dump side).

1. A long Python list argument (``torch.tensor(list_of_floats)``) is data: one tensor-like record
   (float64/int64/bool, statistics, ``.npy``), not a literal of every number in the call spec plus
   a scalar record per element; replay rebuilds the list from the saved data.
2. A re-dump killed before it deleted the old folder leaves ``rank0.old-*``: the next ``start()`` of
   that rank removes it (only a marked real folder), and ``compare --distributed`` is not stopped by it.
3. A rank folder moved while it is being written is never marked complete.
4. Records that name data files promise them: every ``.npy``, the data folder or everything but the
   ``.pkl`` and manifest gone makes the compare fail, naming the missing files or folder.

Real steps of small real computations (example_models' MLP, ``torch.tensor`` of real lists).
"""
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from locations import REPO_ROOT
import torch

import example_models as em
from pytest_ptdbg import PrecisionDebugger
from real_dumps import dump_one_step
from pytest_ptdbg.api import compare_distributed
from pytest_ptdbg.cli import main as cli_main
from pytest_ptdbg.format import records
from pytest_ptdbg.format.manifest import ASIDE_MARKER, read_manifest
from pytest_ptdbg.judge.own_error import Status

N_LIST = 50_000


def _rank(root, step=0):
    return records.rank_dir(str(root), step, 0)


def _pkl(rank):
    return os.path.join(rank, records.pkl_name("api_stack"))


def _lines(rank):
    with open(_pkl(rank), encoding="utf-8") as f:
        return [json.loads(ln) for ln in f]


def _by_name(rank):
    return {r[0]: r for r in _lines(rank) if not records.is_stack_record(r)}


def _verdicts(result):
    rep = result.judgement.replay if result.judgement is not None else None
    return {v.api: v for v in rep.verdicts} if rep is not None else {}


def _list_step(values, nested=None):
    """A step that builds tensors from Python lists, as data loading code does."""
    x = torch.tensor(values)
    y = (x * 2.0).sum()
    if nested is not None:
        y = y + torch.tensor(nested).float().mean()
    return y


def _dump_lists(dump_step, values, nested=None, summary_only=False):
    """The list-building step dumped into ``d``; returns its rank folder."""
    return dump_step("d", lambda: _list_step(values, nested), summary_only=summary_only).rank_dir


@pytest.fixture(scope="module")
def floats():
    rnd = random.Random(0)
    return [rnd.uniform(-3.0, 3.0) for _ in range(N_LIST)]


# ------------------------------------------------------------------------ 1. a long list is data

def test_long_list_argument_is_one_data_record_with_its_npy(floats, dump_step):
    nested = [[i * 7 % 13 for i in range(40)] for _ in range(30)]   # 1200 ints, shape [30, 40]
    rank = _dump_lists(dump_step, floats, nested)
    recs = _by_name(rank)
    rec = recs["Torch_tensor_0_forward_input.0"]
    assert not [n for n in recs if n.startswith("Torch_tensor_0_forward_input.0.")]  # no per-element records
    assert rec[3] == "torch.float64" and rec[4] == [N_LIST]
    ref = np.array(floats, dtype=np.float64)
    assert rec[5][0] == pytest.approx(ref.max()) and rec[5][1] == pytest.approx(ref.min())
    assert rec[5][2] == pytest.approx(ref.mean(), rel=1e-9, abs=1e-12)
    assert rec[5][3] == pytest.approx(np.linalg.norm(ref), rel=1e-9)
    assert rec[6]["call"] == {"args": [{"list_data": "input.0"}], "kwargs": {}}
    saved = np.load(os.path.join(rank, "api_stack_dump", rec[6]["npy"]), allow_pickle=False)
    assert saved.dtype == np.float64 and np.array_equal(saved, ref)   # the list itself, exactly
    ints = recs["Torch_tensor_1_forward_input.0"]
    assert ints[3] == "torch.int64" and ints[4] == [30, 40] and ints[6]["call"]["args"] == [{"list_data": "input.0"}]
    assert np.array_equal(np.load(os.path.join(rank, "api_stack_dump", ints[6]["npy"])), np.array(nested))
    _assert_small(rank)


def _assert_small(rank):
    """No line holds the numbers (the old literal + a record per element: ~8 MB for 50 000)."""
    with open(_pkl(rank), "rb") as f:
        raw = f.read()
    assert len(raw) < 100_000 and max(len(ln) for ln in raw.split(b"\n")) < 10_000


def test_small_literals_stay_literals(dump_step):
    """A list of up to SEQ_DATA_MIN numbers (shapes, dims, small tensors) is recorded as before."""
    rank = _dump_lists(dump_step, [0.5, -1.0, 2.0])
    recs = _by_name(rank)
    assert recs["Torch_tensor_0_forward_input.0.0"][6]["call"] == {"args": [[0.5, -1.0, 2.0]], "kwargs": {}}
    assert [recs[f"Torch_tensor_0_forward_input.0.{i}"][5][0] for i in range(3)] == [0.5, -1.0, 2.0]


def test_self_compare_of_a_long_list_dump_passes_and_replays_from_the_data(floats, dump_step, compare_pair):
    rank = _dump_lists(dump_step, floats)
    r = compare_pair(rank, rank)
    assert r.passed and not r.problems, r.problems
    v = _verdicts(r)["Torch_tensor_0_forward"]
    assert v.status == Status.WITHIN, v.reason   # replayed: torch.tensor(list rebuilt from the .npy)


def test_replay_of_a_long_list_uses_the_saved_data_never_a_false_pass(floats, dump_step, compare_pair):
    """The list's saved data no longer gives the recorded output: the replay says so."""
    rank = _dump_lists(dump_step, floats)
    path = os.path.join(rank, "api_stack_dump", "Torch_tensor_0_forward_input.0.npy")
    arr = np.load(path)
    os.unlink(path)
    np.save(path, arr * 1.01)
    r = compare_pair(rank, rank)
    v = _verdicts(r)["Torch_tensor_0_forward"]
    assert v.status == Status.ROOT_CAUSE and not r.passed


def test_mixed_long_list_is_data_but_named_not_replayable(floats, dump_step, compare_pair):
    mixed = [1] + floats[:999]            # ints and floats: the list cannot be rebuilt exactly
    rank = _dump_lists(dump_step, mixed)
    rec = _by_name(rank)["Torch_tensor_0_forward_input.0"]
    assert rec[4] == [1000] and "repr" in rec[6]["call"]["args"][0]
    v = _verdicts(compare_pair(rank, rank))["Torch_tensor_0_forward"]
    assert v.status == Status.NOT_JUDGED and "recorded as data" in v.reason


def test_statistics_only_dump_of_a_long_list_has_no_literal_and_passes(floats, dump_step, compare_pair):
    rank = _dump_lists(dump_step, floats, summary_only=True)
    rec = _by_name(rank)["Torch_tensor_0_forward_input.0"]
    assert rec[4] == [N_LIST] and "npy" not in rec[6]
    _assert_small(rank)
    r = compare_pair(rank, rank)
    assert r.passed and not r.problems, r.problems


# ------------------------------------------------------------------------ 2. leftovers of a killed re-dump

_KILLED_REDUMP = textwrap.dedent("""
    import os, shutil, sys, signal
    import example_models as em
    from pytest_ptdbg import PrecisionDebugger
    # the process dies exactly where a re-dump deletes the folder it set aside
    shutil.rmtree = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    model, batch = em.mlp(seed=0)
    dbg = PrecisionDebugger(dump_path=sys.argv[1], step=[0])
    with dbg:
        em.train_step(model, batch)
    dbg.close()
""")


def test_leftover_of_a_killed_redump_is_removed_at_next_start_and_compare_distributed_passes(tmp_path):
    root = tmp_path / "d"
    rank = dump_one_step(root).rank_dir
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "tests"),
                                                       os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", _KILLED_REDUMP, str(root)], env=env, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == -9, p.stderr
    step = os.path.dirname(rank)
    left = glob.glob(os.path.join(step, "rank0.old-*"))
    assert len(left) == 1 and os.path.isfile(os.path.join(left[0], "api_stack_dump.pkl"))
    # the leftover alone does not stop compare --distributed (the killed rank0 is incomplete: exit 1)
    out = tmp_path / "out"
    assert cli_main(["compare", "--distributed", "--no-replay", "-q", "-o", str(out), step, step]) == 1
    dump_one_step(root)                   # a successful re-dump
    assert glob.glob(os.path.join(step, "rank0.old-*")) == []
    assert cli_main(["compare", "--distributed", "--no-replay", "-q", "-o", str(out), step, step]) == 0


def test_only_marked_real_folders_are_removed_and_lookalikes_are_named(tmp_path):
    root = tmp_path / "d"
    rank = dump_one_step(root).rank_dir
    step = os.path.dirname(rank)
    mine = tmp_path / "users_folder"
    mine.mkdir()
    (mine / ASIDE_MARKER).write_text("")              # even marked: reached through a link only
    (mine / "keep.txt").write_text("the user's")
    os.symlink(mine, os.path.join(step, "rank0.old-1-2"))
    unmarked = os.path.join(step, "rank0.old-3-4")
    os.mkdir(unmarked)
    with open(os.path.join(unmarked, "notes.txt"), "w") as f:
        f.write("not made by pytest-ptdbg")
    dump_one_step(root)                               # start(): removes nothing of these
    assert os.path.islink(os.path.join(step, "rank0.old-1-2")) and (mine / "keep.txt").exists()
    assert os.path.isfile(os.path.join(unmarked, "notes.txt"))
    with pytest.raises(ValueError) as e:
        compare_distributed(step, step, str(tmp_path / "out"), replay_check=False, workers=1)
    assert "rank0.old-3-4" in str(e.value) and "interrupted re-dump" in str(e.value)


# ------------------------------------------------------------------------ 3. a folder moved mid-step

def test_rank_folder_moved_between_segments_is_never_complete(tmp_path, compare_pair):
    """Two start/stop segments of one step; the rank folder is renamed between them. The moved
    folder holds the first half's records: its manifest must not say complete, and its self-compare
    fails naming the folder."""
    model, batch = em.mlp(seed=0)
    root = tmp_path / "d"
    dbg = PrecisionDebugger(dump_path=str(root), step=[0])
    rank = _rank(root)
    dbg.start()
    loss = model.loss(batch)
    dbg.stop()
    moved = str(tmp_path / "moved")
    os.rename(rank, moved)
    dbg.start()
    loss.backward()
    dbg.stop()
    dbg.close()
    doc = read_manifest(_pkl(moved))
    assert doc["complete"] is False and rank in doc["reason"], doc
    r = compare_pair(moved, moved, replay_check=False)
    assert not r.passed and any(rank in p for p in r.problems), r.problems


@pytest.mark.parametrize("summary_only", [True, False], ids=["summary", "full"])
def test_rank_folder_moved_before_stop_is_marked_incomplete_where_it_went(tmp_path, summary_only, compare_pair):
    model, batch = em.mlp(seed=0)
    root = tmp_path / "d"
    dbg = PrecisionDebugger(dump_path=str(root), step=[0])
    dbg.configure_hook(summary_only=summary_only)
    rank = _rank(root)
    dbg.start()
    em.train_step(model, batch)
    dbg.sinks[0].flush()                      # the folder exists and holds records
    moved = str(tmp_path / "moved")
    os.rename(rank, moved)
    em.train_step(model, batch)
    dbg.stop()
    dbg.close()
    doc = read_manifest(_pkl(moved))
    assert doc["complete"] is False and "moved" in doc["reason"] and rank in doc["reason"], doc
    r = compare_pair(moved, moved, replay_check=False)
    assert not r.passed and any("moved" in p for p in r.problems), r.problems


# ------------------------------------------------------------------------ 4. missing data

@pytest.fixture(scope="module")
def full_dump(tmp_path_factory):
    return dump_one_step(tmp_path_factory.mktemp("full") / "d").rank_dir


def _copy(rank, dst):
    shutil.copytree(rank, dst)
    return str(dst)


def _all_npy(rank, tmp):
    for f in glob.glob(os.path.join(rank, "api_stack_dump", "*.npy")):
        os.unlink(f)
    return rank


def _data_folder(rank, tmp):
    shutil.rmtree(os.path.join(rank, "api_stack_dump"))
    return rank


def _pkl_and_manifest(rank, tmp):
    dst = os.path.join(tmp, "copied")
    os.makedirs(dst)
    for name in ("api_stack_dump.pkl", "api_stack_dump.manifest.json"):
        shutil.copy(os.path.join(rank, name), dst)
    return dst


@pytest.mark.parametrize("damage, named", [
    (_all_npy, "have no file there"), (_data_folder, "data folder"), (_pkl_and_manifest, "data folder"),
], ids=["every_npy", "data_folder", "pkl_and_manifest_only"])
def test_missing_data_fails_the_compare_naming_it(full_dump, tmp_path, damage, named, compare_pair):
    rank = damage(_copy(full_dump, tmp_path / "c"), str(tmp_path))
    n = sum(1 for r in _lines(rank) if not records.is_stack_record(r) and "npy" in r[6])
    r = compare_pair(rank, rank, replay_check=False)
    assert not r.passed
    msg = [p for p in r.problems if named in p]
    assert msg and f"{n} " in msg[0] and "Functional_linear_0_forward_input.0.npy" in msg[0], r.problems
    # the command line too (a folder, and the .pkl itself), with exit status 1
    for path in (rank, _pkl(rank)):
        assert cli_main(["compare", "--no-replay", "-q", "-o", str(tmp_path / "cli"), path, path]) == 1


def test_a_missing_file_fails_a_statistics_compare_against_a_summary_dump(full_dump, tmp_path, compare_pair):
    """The bench has statistics only, so the compare reads no file: the device dump's record whose
    file was deleted still fails it, named (a full compare fails its row, as before)."""
    rank = _copy(full_dump, tmp_path / "c")
    gone = os.path.join(rank, "api_stack_dump", "Functional_linear_2_forward_output.0.npy")
    os.unlink(gone)
    bench = dump_one_step(tmp_path / "bench", summary_only=True).rank_dir
    r = compare_pair(rank, bench, replay_check=False)
    assert r.summary_compare and not r.passed
    assert any("1 of the" in p and os.path.basename(gone) in p for p in r.problems), r.problems


def test_statistics_only_by_choice_still_passes(full_dump, tmp_path, compare_pair):
    """``data_dir=''`` / ``--summary``: the user asked for statistics only; nothing is looked up."""
    rank = _data_folder(_copy(full_dump, tmp_path / "c"), str(tmp_path))
    r = compare_pair(_pkl(rank), _pkl(rank), npu_data="", bench_data="", replay_check=False)
    assert r.passed and not r.problems, r.problems
    assert cli_main(["compare", "--summary", "--no-replay", "-q", "-o", str(tmp_path / "cli"), rank, rank]) == 0


def test_intact_full_dump_self_compare_passes(full_dump, compare_pair):
    r = compare_pair(full_dump, full_dump, replay_check=False)
    assert r.passed and not r.problems, r.problems
