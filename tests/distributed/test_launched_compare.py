"""``ptdbg compare --distributed`` under torchrun: every process compares its ranks, process 0
writes one merged report (``pytest_ptdbg/cli/distributed.py``).

Sixteen synthetic ranks (``dumps.mlp_apis``: numpy dumps, no model to run) in four "node" folders,
compared by four torchrun processes with ptdbg's rule and no replay (these dumps record no calls to
replay), in subprocesses with a timeout well below 120 s: nothing may hang.
"""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from pytest_ptdbg.cli import distributed
from pytest_ptdbg.format import records

import dumps

pytest.importorskip("torch.distributed")

N_RANKS, NODES = 16, 4
FAULTY = 5


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(root, fault_rank=None):
    """``root/node<K>/rank<N>`` (ranks 4K..4K+3 on node K); ``fault_rank`` with a planted fault."""
    src = str(root) + "_src"
    for rank in range(N_RANKS):
        fault = "backward" if rank == fault_rank else None
        dumps.write_dump(src, dumps.mlp_apis(seed=rank, fault=fault, fault_scale=0.5), rank=rank)
        dest = os.path.join(str(root), f"node{rank // (N_RANKS // NODES)}", f"rank{rank}")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.move(records.rank_dir(src, 0, rank), dest)
    return str(root)


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    root = tmp_path_factory.mktemp("launched")
    return {"clean": _nodes(root / "clean"), "bad": _nodes(root / "bad", FAULTY),
            "bench": _nodes(root / "bench")}


def _torchrun(npu, bench, out, *extra, nproc=4, env=None, timeout=100):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "--monitor-interval", "0.2",
           "-m", "pytest_ptdbg.cli", "compare", "--distributed", npu, bench, "-o", str(out),
           "--rule", "ptdbg", "--no-replay", "--dist-timeout", "30", *extra]
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    e["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), e.get("PYTHONPATH", "")) if p)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)


def _merged(out):
    [name] = [n for n in os.listdir(out) if n.startswith("distributed_summary_") and n.endswith(".json")]
    stem = name[len("distributed_summary_"):-len(".json")]
    assert {f"distributed_summary_{stem}.{x}" for x in ("txt", "html")} <= set(os.listdir(out))
    with open(os.path.join(out, name)) as f:
        return json.load(f), open(os.path.join(out, f"distributed_summary_{stem}.txt")).read()


TEMPLATE = "{root}/node*/rank{rank}"


def test_a_faulty_and_a_missing_rank_are_named_in_one_merged_report(sides, tmp_path):
    npu = str(tmp_path / "npu")
    shutil.copytree(sides["bad"], npu)
    shutil.rmtree(os.path.join(npu, "node2", "rank9"))          # rank 9 missing on the device side
    r = _torchrun(npu, sides["bench"], tmp_path / "out", "--rank-path-template", TEMPLATE)
    assert r.returncode == 1, r.stdout + r.stderr
    merged, text = _merged(tmp_path / "out")
    assert merged["failing_ranks"] == [FAULTY, 9] and merged["expected_ranks"] == N_RANKS
    assert merged["gathered_from"] == [0, 1, 2, 3] and not merged["lost_processes"]
    by_rank = {x["rank"]: x for x in merged["ranks"]}
    assert by_rank[FAULTY]["state"] == "failed" and by_rank[9]["state"] == "missing"
    assert "only in the bench dump" in by_rank[9]["error"]
    assert merged["first_divergent"] == {"rank": FAULTY, "api": "Torch_relu_0_backward",
                                         "order": merged["first_divergent"]["order"]}
    assert all(os.path.isfile(p) for p in by_rank[FAULTY]["reports"].values()) and by_rank[FAULTY]["reports"]
    assert "First divergent (earliest in execution order): rank5: Torch_relu_0_backward" in text
    assert "Failing ranks: rank5, rank9" in text
    html = next(n for n in os.listdir(tmp_path / "out") if n.startswith("distributed_summary_") and n.endswith(".html"))
    assert os.path.basename(by_rank[FAULTY]["reports"]["csv"]) in open(tmp_path / "out" / html).read()


def test_all_clean_over_two_nodes_passes_with_each_node_listing_its_own_folder(sides, tmp_path):
    """Two torchrun agents (--nnodes 2), each given its own node's folder holding half the ranks."""
    npu, bench = tmp_path / "npu", tmp_path / "bench"
    for k in range(2):   # node k holds ranks 8k..8k+7 of both sides, as its local step folder
        for side, src in ((npu, sides["clean"]), (bench, sides["bench"])):
            for rank in range(8 * k, 8 * k + 8):
                shutil.copytree(os.path.join(src, f"node{rank // 4}", f"rank{rank}"),
                                os.path.join(str(side), f"host{k}", "step0", f"rank{rank}"))
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(k),
         "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
         "-m", "pytest_ptdbg.cli", "compare", "--distributed", str(npu / f"host{k}" / "step0"),
         str(bench / f"host{k}" / "step0"), "-o", str(tmp_path / "out"), "--rule", "ptdbg", "--no-replay",
         "--dist-timeout", "30"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for k in range(2)]
    try:
        outs = [p.communicate(timeout=100)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    merged, text = _merged(tmp_path / "out")
    assert merged["passed"] and merged["expected_ranks"] == N_RANKS and not merged["failing_ranks"]
    assert {x["process"] for x in merged["ranks"]} == {0, 1, 2, 3}
    # what the scale benchmark reads: each process's peak memory, what was gathered, the merge time
    m = merged["measured"]
    assert sorted(m["peak_rss_mib"]) == ["0", "1", "2", "3"] and all(v > 10 for v in m["peak_rss_mib"].values())
    assert 0 < m["gathered_bytes"] < 100_000 and 0 <= m["merge_s"] < 5
    assert "All ranks agree." in text


def test_a_process_that_dies_mid_compare_is_named_and_nothing_hangs(sides, tmp_path):
    r = _torchrun(sides["clean"], sides["bench"], tmp_path / "out", "--rank-path-template", TEMPLATE,
                  env={distributed.TEST_EXIT_ENV: "2"})
    assert r.returncode != 0, r.stdout + r.stderr
    merged, text = _merged(tmp_path / "out")
    assert not merged["passed"]
    # process 2 (ranks 2, 6, 10, 14) died after its first rank: its others are never a pass
    by_rank = {x["rank"]: x for x in merged["ranks"]}
    assert len(by_rank) == N_RANKS
    assert all(by_rank[r]["state"] in ("lost", "interrupted") for r in (6, 10, 14)), text
    assert 2 in merged["lost_processes"] and "process 2" in text


def test_launcher_detection_and_the_template_split(sides, tmp_path):
    assert not distributed.launched({"RANK": "0", "WORLD_SIZE": "1"})
    assert distributed.launched({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    proc = distributed.Process(rank=1, world=4, local_rank=1, local_world=4)
    a = distributed.assign(proc, sides["clean"], sides["bench"], TEMPLATE, n_ranks=None)
    assert sorted(a.ranks) == [1, 5, 9, 13] and all(n and b for n, b, _ in a.ranks.values())
    assert distributed.template_ranks(TEMPLATE, sides["clean"]) == list(range(N_RANKS))


def test_merge_names_ranks_no_process_reported():
    ok = [distributed.rank_summary(r, "d", "b", state="passed") for r in (0, 1, 2)]
    for r in ok:
        r["state"] = "passed"
    merged = distributed.merge({0: {"process": 0, "ranks": [0, 1, 2], "results": ok}}, 1, 5, [0])
    assert merged["failing_ranks"] == [3, 4] and not merged["passed"]
    assert {x["state"] for x in merged["ranks"][3:]} == {"missing"}
    lost = distributed.merge({0: {"process": 0, "ranks": [0, 1], "results": ok[:2]}, 1: None}, 2, None, [0])
    assert lost["lost_processes"] == [1] and lost["expected_ranks"] == 2 and not lost["passed"]


def test_a_process_that_failed_before_comparing_fails_the_job_even_when_every_rank_seen_passed():
    """Process 1 could not list its node's step folder (an error before any rank was assigned): the
    ranks it would have compared are unknown, so the merged verdict cannot be green."""
    ok = [distributed.rank_summary(r, "d", "b", state="passed") for r in (0, 1)]
    procs = {0: {"process": 0, "ranks": [0, 1], "results": ok, "error": ""},
             1: {"process": 1, "ranks": [], "results": [], "error": "/node1/step0: not a step folder"}}
    merged = distributed.merge(procs, 2, None, [0, 1])
    assert not merged["failing_ranks"] and not merged["passed"]
    assert merged["process_errors"] == {"1": "/node1/step0: not a step folder"}
    text = distributed.merged_text(merged, "dev", "bench")
    assert "Process 1 failed: /node1/step0: not a step folder" in text and "1 process(es) failed" in text


def test_merge_lists_the_highest_ranks_of_processes_lost_before_reporting():
    """Processes 2 and 3 (ranks 2, 6, 10, 14 and 3, 7, 11, 15) were lost before reporting: the
    ranks the others found (16) are all listed, 14 and 15 too, lost, and the job fails; a process
    file's impossible rank count is not believed."""
    def passed(ranks):
        out = [distributed.rank_summary(r, "d", "b", state="passed") for r in ranks]
        for r in out:
            r["state"] = "passed"
        return out

    procs = {0: {"process": 0, "ranks": [0, 4, 8, 12], "n_ranks": 16, "results": passed([0, 4, 8, 12]), "error": ""},
             1: {"process": 1, "ranks": [1, 5, 9, 13], "n_ranks": 16, "results": passed([1, 5, 9, 13]), "error": ""},
             2: None, 3: None}
    merged = distributed.merge(procs, 4, None, [0, 1])
    assert merged["expected_ranks"] == 16 and len(merged["ranks"]) == 16 and not merged["passed"]
    by_rank = {x["rank"]: x for x in merged["ranks"]}
    assert all(by_rank[r]["state"] == "lost" for r in (2, 3, 6, 7, 10, 11, 14, 15))
    procs[1]["n_ranks"] = 10 ** 12
    assert distributed.merge(procs, 4, None, [0, 1])["expected_ranks"] == 16
