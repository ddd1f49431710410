"""Time (or profile) ``build_table`` alone on the ``--big`` statistics pair, without reading the dumps.

``python benchmarks/bench_table.py [--dir /tmp/ptdbg_bench_compare] [--big 50000] [--reps 3]
[--profile] [--top 40] [--roots ROOT,ROOT...] [--digest]``; make the pair first with
``python benchmarks/bench_compare.py --big 50000``.

Each repetition reads both dumps afresh (``bind_apis`` mutates the records; never a pickled
copy: dumps are data) and times ``build_table(npu, bench, summary=True)`` only. ``--roots``: the
package trees to time, each in its own process, alternated rep by rep (old vs new in one run);
``--digest`` prints a hash of the table (values and dtypes), to see two trees build the same one.

Measured 2026-12-04 20:00 UTC (shared 2-core VM, another benchmark running; 50 085 calls, 161 700
rows; ``--roots OLD,NEW --reps 5``): build_table 3.69 s at f1bc09b, 2.72 s with the h-table changes
(rows as tuples, marshal memo keys, the structure memo of ``pairing.signature``, the deferred rows'
cells as arrays); under cProfile 8.9 -> 6.0 s. The whole statistics compare (``bench_compare.py
--measure-big``, 1 rep, alternated, median of 3): 11.98 -> 10.95 s, peak RSS 446 -> 449 MiB.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _one(a: argparse.Namespace) -> None:
    import cProfile
    import gc
    import hashlib
    import pstats

    from pytest_ptdbg.comparison.table import build_table
    from pytest_ptdbg.dump.reader import read_dump
    from pytest_ptdbg.format import records

    import pandas  # noqa: F401  (imported by the compare before the table; not timed here)

    base = os.path.join(a.dir, f"big{a.big}_stats")
    times = []
    for rep in range(a.reps):
        # read afresh for each repetition (bind_apis mutates the records), not timed
        npu, bench = (read_dump(records.rank_dir(base + s)) for s in ("_npu", "_bench"))
        gc.collect()
        prof = cProfile.Profile() if a.profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        table = build_table(npu, bench, summary=True)
        if prof:
            prof.disable()
        times.append(time.perf_counter() - t0)
        if prof and rep == a.reps - 1:
            st = pstats.Stats(prof)
            st.sort_stats("cumulative").print_stats(a.top)
            st.sort_stats("tottime").print_stats(a.top // 2)
        if a.digest and rep == 0:
            h = hashlib.sha256()
            h.update(repr([str(t) for t in table.dtypes]).encode())
            for c in table.columns:
                h.update(repr((c, table[c].tolist())).encode())
            print(f"digest {h.hexdigest()} rows {len(table)}", flush=True)
        del table, npu, bench
    print("times " + " ".join(f"{t:.3f}" for t in times), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ptdbg_bench_compare")
    ap.add_argument("--big", type=int, default=50000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--digest", action="store_true")
    ap.add_argument("--roots", default="", help="comma-separated package trees, timed alternately")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.roots:
        if not a.child:
            sys.path.insert(0, os.path.dirname(HERE))
        _one(a)
        return
    roots = a.roots.split(",")
    got: dict = {r: [] for r in roots}
    args = ["--child", "--dir", a.dir, "--big", str(a.big), "--reps", "1"]
    args += ["--digest"] if a.digest else []
    for rep in range(a.reps):
        for r in (roots if rep % 2 == 0 else roots[::-1]):
            env = dict(os.environ, PYTHONPATH=r)
            p = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, env=env, cwd=r,
                               capture_output=True, text=True, check=True)
            for line in p.stdout.splitlines():
                if line.startswith("times "):
                    got[r].append(float(line.split()[1]))
                elif line.startswith("digest ") and rep == 0:
                    print(r, line)
    for r in roots:
        ts = sorted(got[r])
        print(f"{r}: median {ts[len(ts) // 2]:.3f} s of {' '.join(f'{t:.3f}' for t in got[r])}")


if __name__ == "__main__":
    main()
