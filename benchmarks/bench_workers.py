"""Benchmark: the large-tensor table build with 1 and 2 workers (runtime/pool.py's worker processes).

Uses ``bench_compare.py``'s full-tensor TransformerEncoder dumps (made in DIR if missing, ~1.1 GB).
Each configuration runs in a fresh process (one untimed build first: page cache), ``--reps``
timed ``build_table`` calls; 1 and 2 workers alternate ``--rounds`` times. Printed per run: wall
time (median, min), CPU seconds of this process and its workers together, and how many tensor
chunks the workers and this process computed. Also: a worker's start-up to its first answer.

``python benchmarks/bench_workers.py [--dir DIR] [--reps 3] [--rounds 2] [--against SRC]``
(``--against``: also time another source tree, e.g. ``git archive`` of an older commit).
Numbers move by tens of percent with the load of the machine: compare runs of the same round.

Measured 2026-12-02 06:58 (load average 1.4-1.9 on the shared 2-core machine; 3 rounds of 3 reps;
``--against`` ce9cd34, the fork/spawn pool before issue 17): 1.118 GB of distinct tensor files,
2248 rows. This tree: 1 worker 0.98 / 1.03 / 1.06 s, 2 workers 0.65 / 0.68 / 0.62 s (1.5-1.7x;
CPU 1.00-1.08 s vs 1.13-1.22 s: the worker's start-up); ce9cd34: 0.91 / 0.95 / 1.21 s and 0.51 /
0.53 / 0.68 s (1.6-1.8x). Worker start-up to first answer: 0.17-0.32 s. At load 3.5 (about one free
core) two workers were slower than one in both trees (this one 1.18-1.43 s vs 0.73-1.08 s).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _cpu() -> float:
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def measure(d: str, workers: int, reps: int) -> dict:
    """In a fresh process: time ``build_table`` with ``workers``."""
    from pytest_ptdbg.comparison import table
    from pytest_ptdbg.dump import reader

    npu, bench = reader.read_dump(os.path.join(d, "npu")), reader.read_dump(os.path.join(d, "bench"))
    table.build_table(npu, bench, workers=workers)
    walls, cpus = [], []
    for _ in range(reps):
        c, t = _cpu(), time.perf_counter()
        table.build_table(npu, bench, workers=workers)
        walls.append(time.perf_counter() - t)
        cpus.append(_cpu() - c)
    try:
        from pytest_ptdbg.runtime import pool
        chunks = dict(pool.LAST_RUN) if workers > 1 else None
    except ImportError:   # an older tree
        chunks = None
    return {"workers": workers, "wall_med": statistics.median(walls), "wall_min": min(walls),
            "cpu_med": statistics.median(cpus), "chunks": chunks}


def start_up(reps: int = 5) -> float:
    """Median seconds from starting a worker to its answer to an empty chunk list."""
    import pickle

    from pytest_ptdbg.runtime import pool

    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        p = pool._start()
        pool._write(p.stdin, pickle.dumps(("pytest_ptdbg.comparison.table", "_compare_specs", [])))
        assert pool._read(p.stdout)[0] == "ready" and pool._read(p.stdout) == ("ok", [])
        ts.append(time.perf_counter() - t)
        pool._close(p)
    return statistics.median(ts)


def _fresh(args: list, code: str) -> dict:
    p = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, capture_output=True, text=True,
                       cwd=code, env=dict(os.environ, PYTHONPATH=code))
    if p.returncode:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ptdbg_bench_compare")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--against", default="")
    ap.add_argument("--measure", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--start-up", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.dir, a.measure, a.reps)))
        return
    if a.start_up:
        print(json.dumps({"start_up_s": start_up()}))
        return
    sys.path.insert(0, HERE)
    from bench_compare import make_dumps

    os.makedirs(a.dir, exist_ok=True)
    make_dumps(a.dir)
    codes = [ROOT] + ([os.path.abspath(a.against)] if a.against else [])
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[:3]}", flush=True)
    for r in range(a.rounds):
        for code in codes:
            for w in (1, 2):
                res = _fresh(["--dir", a.dir, "--reps", str(a.reps), "--measure", str(w)], code)
                who = "" if code == ROOT else f" [{code}]"
                print(f"round {r + 1}, workers={w}: build_table {res['wall_med']:.2f} s (min {res['wall_min']:.2f}), "
                      f"CPU {res['cpu_med']:.2f} s, chunks {res['chunks']}{who}", flush=True)
    print(f"worker start-up to first answer: {_fresh(['--start-up'], ROOT)['start_up_s']:.2f} s")
    with open("/proc/loadavg") as f:
        print(f"load average after: {f.read().split()[:3]}")


if __name__ == "__main__":
    main()
