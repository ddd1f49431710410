"""Two ranks (gloo, torch.multiprocessing): each writes its own rank folder with its collectives."""
import json
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pytest_ptdbg.format import records

from locations import REPO_ROOT

ROOT = REPO_ROOT


def _worker(rank, world, init_file, out):
    sys.path.insert(0, ROOT)
    from example_models import mlp
    from pytest_ptdbg import PrecisionDebugger

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, batch = mlp(seed=rank)
        dbg = PrecisionDebugger(dump_path=out, step=[0])
        dbg.configure_hook(mode="api_stack", summary_only=True)
        dbg.start()
        loss = model.loss(batch)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        t = torch.tensor([float(rank)])
        dist.broadcast(t, src=0)
        dbg.stop()
        dbg.step()
        dbg.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_two_rank_gloo_dump(tmp_path):
    out = str(tmp_path / "dump")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), out), nprocs=2, join=True)
    step = records.step_dir(out, 0)
    assert sorted(os.listdir(step)) == ["rank0", "rank1"]
    for rank in (0, 1):
        with open(os.path.join(step, f"rank{rank}", "api_stack_dump.pkl")) as f:
            recs = [json.loads(line) for line in f]
        keys = {records.parse_name(r[0]).api_key for r in recs if not records.is_stack_record(r)}
        n_params = 6
        assert {f"Distributed_all_reduce_{i}_forward" for i in range(n_params)} <= keys
        assert "Distributed_broadcast_0_forward" in keys
        # the in-place collective's output record is the reduced tensor, different per rank before
        bc = [r for r in recs if r[0] == "Distributed_broadcast_0_forward_output.0"][0]
        assert bc[5][0] == 0.0  # rank 0's value everywhere
        assert "Functional_linear_0_forward" in keys and "Functional_linear_0_backward" in keys
