"""Profile one statistics ``compare()`` (no replay) of the ``--big`` pair, stage by stage (cProfile).

``python benchmarks/profile_compare.py [--dir /tmp/ptdbg_bench_compare] [--big 50000] [--top 45]
[--kind stats|full] [--stages]``; make the pair first with ``python benchmarks/bench_compare.py --big 50000``.
``--stages``: the wall-clock time of each stage of one compare, without the profiler.

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

``--stages`` 2026-12-04 19:52 (load ~1.5; after the reader's fused path, before the table work of
that evening): compare() 9.98 s = reading both dumps 3.71 s, the table 3.64 s, judging 0.39 s, the
reports 2.01 s (CSV, advice and HTML written 1.39 s, of which formatting the CSV's cells ~1.3 s;
advisor 0.37 s; HTML 0.24 s). cProfile roughly doubles the per-call Python work, so its shares
above overstate reading and the table against numpy and the CSV.
"""
import argparse
import cProfile
import os
import pstats
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _stage_times(param: dict, out: str) -> None:
    """One compare, each stage timed by the wall clock (no profiler: cProfile inflates per-call
    Python work ~2x, so its shares are not the real ones)."""
    import functools
    import time

    from pytest_ptdbg import api
    from pytest_ptdbg.advise import advisor
    from pytest_ptdbg.dump import reader
    from pytest_ptdbg.report import html_report, outputs

    spent: dict = {}

    def timed(owner: object, name: str, label: str) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def g(*args: object, **kwargs: object) -> object:
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, g)

    stages = ((reader, "read_dump", "read both dumps"), (api, "build_table", "build the table"),
              (api, "_judge", "judge"), (api, "_finish", "reports (all)"),
              (advisor, "advise", "  advisor"), (html_report, "render_html", "  HTML"),
              (outputs.ReportSet, "write", "  write CSV, advice, HTML"))
    for owner, name, label in stages:
        timed(owner, name, label)
    t0 = time.perf_counter()
    api.compare(param, out, replay_check=False)
    print(f"compare() {time.perf_counter() - t0:.2f} s")
    for _, _, label in stages:
        print(f"  {label:28s} {spent.get(label, 0.0):6.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ptdbg_bench_compare")
    ap.add_argument("--big", type=int, default=50000)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--kind", choices=("stats", "full"), default="stats")
    ap.add_argument("--stages", action="store_true", help="wall-clock time per stage instead of a profile")
    a = ap.parse_args()
    from pytest_ptdbg import api

    base = os.path.join(a.dir, f"big{a.big}_{a.kind}")
    param = {"npu_pkl_path": base + "_npu", "bench_pkl_path": base + "_bench", "is_print_compare_log": False}
    if a.stages:
        _stage_times(param, os.path.join(a.dir, "out_prof"))
        return
    prof = cProfile.Profile()
    prof.enable()
    api.compare(param, os.path.join(a.dir, "out_prof"), replay_check=False)
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(a.top)
    st.sort_stats("tottime").print_stats(a.top // 2)


if __name__ == "__main__":
    main()
