"""Profile one statistics ``compare()`` (no replay) of the ``--big`` pair, stage by stage (cProfile).

``python benchmarks/profile_compare.py [--dir /tmp/ptdbg_bench_compare] [--big 50000] [--top 45]``;
make the pair first with ``python benchmarks/bench_compare.py --big 50000``.

Measured 2026-12-04 04:20 UTC (shared 2-core VM, load ~1), 50 085 calls, 161 700 rows:
without the profiler (``bench_compare.py --measure-big``, fresh process, 1 rep) compare() 30.9 s,
peak RSS 723 MiB (368 MiB after making/checking the pair). Under cProfile (71 s in all), cumulative:
reading both dumps 38.3 s = 54 % (``_add_ptdbg_record`` 20.6 s for 313 000 records, of which
``parse_split`` 9.8 s, ``_split_name`` 3.9 s, ``_check_record`` 2.9 s, ``_shape`` 1.5 s;
``json.loads`` 5.1 s; ``_read_ptdbg``'s own loop 4.0 s); build_table 23.3 s (``_row`` 4.5 s per
row dicts, ``_arg_rows`` 3.4 s, pairing ``pair_dumps`` 3.6 s, ``bind_apis`` 3.3 s); judge 3.7 s
(``statistics_causes`` 3.3 s); CSV 3.1 s (``column_cells`` 2.3 s for 400 column chunks: the float
formatting); advisor 1.5 s. So the reader (one Python object per record, per-record validation in
Python) is the largest share, then per-row objects in the table; CSV formatting is ~10 %.
"""
import argparse
import cProfile
import os
import pstats
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ptdbg_bench_compare")
    ap.add_argument("--big", type=int, default=50000)
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args()
    from pytest_ptdbg import api

    base = os.path.join(a.dir, f"big{a.big}_stats")
    param = {"npu_pkl_path": base + "_npu", "bench_pkl_path": base + "_bench", "is_print_compare_log": False}
    prof = cProfile.Profile()
    prof.enable()
    api.compare(param, os.path.join(a.dir, "out_prof"), replay_check=False)
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(a.top)
    st.sort_stats("tottime").print_stats(a.top // 2)


if __name__ == "__main__":
    main()
