"""A real data-parallel training step on ``world`` gloo processes, dumped by the debugger on every rank.

:func:`run` spawns the processes (``torch.multiprocessing``, a file rendezvous: no port) and each
runs :func:`_worker`: the same MLP on every rank (seed 0), its own batch (seed ``100 + rank``),
forward, backward, ``dist.all_reduce`` of each gradient then ``/= world``, an SGD step
(``foreach=False``: one visible update per parameter), a broadcast, an ``all_gather``, an
``all_gather_into_tensor``, and the next step's forward (the updated parameters as its inputs).

``plant_rank``: that rank's ``dist.all_reduce`` (patched before the debugger wraps it, so the dump
records what the faulty "link" returned) adds ``plant_delta`` to the result of its ``plant_call``-th call.
Each entry of ``dumps`` is ``(dump_path, summary_only, plant_rank)``: the workers dump one step into each.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from locations import REPO_ROOT

PLANT_DELTA = 1e-3


def _step(rank, world, dump_path, summary_only, plant_rank, plant_call):
    from example_models import mlp
    from example_models.models import make_optimizer
    from pytest_ptdbg import PrecisionDebugger

    model, _ = mlp(seed=0)
    _, batch = mlp(seed=100 + rank)
    opt = make_optimizer(model, lr=0.1, optimizer="sgd")
    orig = dist.all_reduce
    if rank == plant_rank:
        calls = [0]

        def faulty_all_reduce(tensor, *args, **kwargs):
            out = orig(tensor, *args, **kwargs)
            if calls[0] == plant_call:
                with torch.no_grad():
                    tensor.add_(PLANT_DELTA)
            calls[0] += 1
            return out

        dist.all_reduce = faulty_all_reduce
    try:
        dbg = PrecisionDebugger(dump_path=dump_path, step=[0])
        dbg.configure_hook(mode="api_stack", summary_only=summary_only)
        dbg.start()
        opt.zero_grad(set_to_none=True)
        loss = model.loss(batch)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        t = torch.full((3,), float(rank))
        dist.broadcast(t, src=0)
        gathered = [torch.empty(2) for _ in range(world)]
        dist.all_gather(gathered, torch.full((2,), float(rank)))
        flat = torch.empty(2 * world)
        dist.all_gather_into_tensor(flat, torch.full((2,), float(rank) + 0.5))
        model.loss(batch)   # the next step's forward: the updated parameters are its inputs
        dbg.stop()
        dbg.step()
        dbg.close()
    finally:
        dist.all_reduce = orig


def _worker(rank, world, init_file, dumps, plant_call):
    sys.path.insert(0, REPO_ROOT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for dump_path, summary_only, plant_rank in dumps:
            _step(rank, world, dump_path, summary_only, plant_rank, plant_call)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def run(tmp_dir, dumps, world=4, plant_call=0, timeout=120.0):
    """Run the step on ``world`` processes into each of ``dumps`` (see the module docstring)."""
    ctx = mp.start_processes(_worker, args=(world, os.path.join(str(tmp_dir), "init"), list(dumps), plant_call),
                             nprocs=world, join=False, start_method="spawn")
    import time

    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"the {world}-process gloo step did not finish within {timeout:.0f} s")
