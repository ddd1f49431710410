"""Benchmark: `ptdbg compare --distributed` under torchrun at scale, measured, not assumed.

A real data-parallel step is dumped on 4 gloo processes (``tests/distributed/dp_step.py``: an MLP,
forward, backward, all_reduce of every gradient, SGD, broadcast, all_gather; full tensors). Its
rank folders are repeated into N synthetic ranks (default 64: rank i is a hard-linked copy of real
rank i % 4), spread over P "node" folders (rank i on node i % P) on the device and on the bench
side. For P = 1, 2 and 4 launcher processes (``python -m torch.distributed.run --nproc-per-node P``
with ``--rank-path-template '{root}/node*/rank{rank}'``: each process compares its own subset, as
separate nodes would) it measures the wall time, each process's peak memory, the size of what was
gathered to process 0 and the merge time (the merged report's ``measured``), and checks that every
rank passed. What is gathered is per-rank summaries only (verdict, a few root causes, counts, report
paths): its size grows with the number of ranks, not with tensor sizes.

``python benchmarks/bench_distributed.py [--ranks 64] [--procs 1,2,4] [--keep DIR]``

It asserts nothing; the machine has 2 cores, so more than 2 processes cannot run faster here.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "distributed")):
    if p not in sys.path:
        sys.path.insert(0, p)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _real_step(work: str) -> str:
    """Dump the 4-rank gloo step once; its step folder (``.../step0`` holding rank0..rank3)."""
    import dp_step

    dump = os.path.join(work, "real")
    dp_step.run(work, [(dump, False, None)])
    return os.path.join(dump, "ptdbg_dump_v4.0", "step0")


def _synthesize(step: str, root: str, n_ranks: int, nodes: int) -> str:
    """``root/node<k>/rank<i>`` for i in 0..n_ranks-1, rank i hard-linked from real rank i % 4."""
    real = sorted(int(d[4:]) for d in os.listdir(step) if d.startswith("rank") and d[4:].isdigit())
    for i in range(n_ranks):
        src = os.path.join(step, f"rank{real[i % len(real)]}")
        dst = os.path.join(root, f"node{i % nodes}", f"rank{i}")
        shutil.copytree(src, dst, copy_function=os.link)
    return root


def _launch(procs: int, dev: str, bench: str, out: str, n_ranks: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           "-m", "pytest_ptdbg.cli", "compare", "--distributed", dev, bench, "-o", out, "-q",
           "--ranks", str(n_ranks), "--rank-path-template", "{root}/node*/rank{rank}"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    found = [f for f in os.listdir(out) if f.startswith("distributed_summary_") and f.endswith(".json")]
    if not found:
        raise RuntimeError(f"no merged report (exit {proc.returncode}): {proc.stderr[-2000:]}")
    with open(os.path.join(out, found[0])) as f:
        merged = json.load(f)
    m = merged.get("measured", {})
    rss = [v for v in m.get("peak_rss_mib", {}).values() if v is not None]
    return {"procs": procs, "exit": proc.returncode, "passed": merged["passed"], "wall_s": wall,
            "ranks_passed": sum(r["state"] == "passed" for r in merged["ranks"]),
            "peak_rss_mib_max": max(rss) if rss else None, "peak_rss_mib_min": min(rss) if rss else None,
            "gathered_bytes": m.get("gathered_bytes"), "merge_s": m.get("merge_s")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--keep", default=None, help="keep the dumps and reports in this folder")
    args = ap.parse_args(argv)
    procs = [int(x) for x in args.procs.split(",") if x]
    work = args.keep or tempfile.mkdtemp(prefix="bench_distributed_")
    os.makedirs(work, exist_ok=True)
    try:
        t0 = time.perf_counter()
        step = _real_step(work)
        print(f"real 4-rank gloo step dumped in {time.perf_counter() - t0:.1f} s: {step}", flush=True)
        rows = []
        for p in procs:
            base = os.path.join(work, f"p{p}")
            dev = _synthesize(step, os.path.join(base, "device"), args.ranks, p)
            bench = _synthesize(step, os.path.join(base, "bench"), args.ranks, p)
            rows.append(_launch(p, dev, bench, os.path.join(base, "out"), args.ranks))
            r = rows[-1]
            print(f"  {p} process(es): {r['wall_s']:.1f} s, {r['ranks_passed']}/{args.ranks} ranks passed, "
                  f"exit {r['exit']}", flush=True)
        print(f"\ncompare --distributed of {args.ranks} ranks (full tensors), torchrun on this machine:")
        print(f"{'processes':>9} {'wall s':>8} {'speed-up':>8} {'peak MiB/process':>17} {'gathered KiB':>12} "
              f"{'merge ms':>9} {'ranks passed':>12}")
        base_wall = rows[0]["wall_s"] if rows else float("nan")
        for r in rows:
            print(f"{r['procs']:>9} {r['wall_s']:>8.1f} {base_wall / r['wall_s']:>8.2f} "
                  f"{r['peak_rss_mib_min']:>8.0f}-{r['peak_rss_mib_max']:<8.0f} {r['gathered_bytes'] / 1024:>12.1f} "
                  f"{r['merge_s'] * 1000:>9.1f} {r['ranks_passed']:>5}/{args.ranks}")
        print(json.dumps(rows))
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
