"""Benchmark: does the judgement name the planted culprit?

Plants single-call faults in one training step (forward, loss, backward, AdamW) of the example
models and of tiny ``transformers`` models (GPT-2, Llama, BERT, ViT, T5 from small configs with
random weights; skipped with a note when ``transformers`` does not import), each on two device
settings - float32 with 1e-6 weight noise and bf16 autocast, both on this CPU - against a float32
CPU bench. Half the faults are below capture (the recorded call is wrong for its recorded
inputs, like a faulty kernel), half in user code (an argument, dtype, extra call or gradient
hook changes). For each case it compares with ``compare(...)``'s default settings (and again
statistics-only) and checks whether the first suspect is the planted API key in the planted
direction. Faults smaller than 4x the correct kernel's own error in that dtype are listed as
"below resolution" and not scored. Clean pairs (bf16/fp16 autocast, weight noise, identical runs,
seeded dropout, ``torch.empty`` buffers) count false alarms (``passed`` False). The ``spell-*``
cases (issue 20) respell the device's calls (keyword arguments, ``torch.softmax`` for
``F.softmax``, ``torch.add`` for ``x + y``...; ``faults/spellings.py``): their faults must still be
found, their clean pairs must not alarm.

``python benchmarks/bench_diagnosis.py [--fast] [--only PATTERN] [--out results.json] [--keep DIR]``

The cases live in ``benchmarks/faults/`` (``registry.py`` lists them). This measures today's
judgement; it asserts nothing.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DEVICES_FOR_FAULTS = ("fp32", "bf16")


def _fmt(x: float) -> str:
    if x != x:
        return "-"
    if x == float("inf"):
        return "inf"
    return f"{x:.0e}"


def _yn(v) -> str:
    return "-" if v is None else ("yes" if v else "no")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help="a small subset (example models), < 60 s")
    ap.add_argument("--only", default="", help="glob or substring over case ids (fault id or clean pair id)")
    ap.add_argument("--out", default="", help="write every result as JSON here")
    ap.add_argument("--keep", default="", help="keep the dumps in this folder (default: a temporary one, removed)")
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from benchmarks.faults import archs, registry, runner

    have = set(archs.available_archs())
    note = archs.skipped_note()
    faults = [f for f in registry.FAULTS if f.arch in have]
    clean = [c for c in registry.CLEAN_PAIRS if c.arch in have]
    if a.fast:
        faults = [f for f in faults if f.id in registry.FAST_FAULTS]
        clean = [c for c in clean if c.id in registry.FAST_CLEAN]
    if a.only:
        pat = a.only if any(ch in a.only for ch in "*?[") else f"*{a.only}*"
        faults = [f for f in faults if fnmatch.fnmatch(f.id, pat)]
        clean = [c for c in clean if fnmatch.fnmatch(c.id, pat)]

    t_start = time.perf_counter()
    root = a.keep or tempfile.mkdtemp(prefix="ptdbg_diag_")
    ws = runner.Workspace(root)
    fres, cres = [], []
    hdr = (f"{'case':38s} {'arch':9s} {'dev':4s} {'planted':6s} {'size':>6s} {'expected':34s} "
           f"{'first suspect':38s} {'hit':4s} {'stats':5s} {'pass':4s} {'ratio':>7s} {'s':>5s}")
    print(hdr)
    print("-" * len(hdr))
    try:
        for f in faults:
            for dev in f.devices(DEVICES_FOR_FAULTS):
                r = runner.run_fault(f, dev, ws, keep=bool(a.keep))
                fres.append(r)
                where = "below" if r.where == "below capture" else "user"
                exp = f"{r.expected} {r.direction[:3]}" if r.expected else f"({r.family} {r.direction[:3]})"
                if r.plant_error:
                    sus, hit = f"PLANT ERROR: {r.plant_error}"[:38], "-"
                else:
                    sus = f"{r.suspect} {r.suspect_direction[:3]}" if r.suspect else "(none)"
                    hit = "n/a" if r.below_resolution else ("yes" if r.hit else "no")
                stats = "n/a" if (r.below_resolution or r.plant_error) else ("yes" if r.stats_hit else "no")
                size = f"{_fmt(r.e1)}"
                print(f"{r.fault:38s} {r.arch:9s} {dev:4s} {where:6s} {size:>6s} {exp[:34]:34s} {sus[:38]:38s} "
                      f"{hit:4s} {stats:5s} {_yn(r.passed):4s} {_fmt(r.ratio):>7s} {r.seconds:5.1f}", flush=True)
        if clean:
            print()
            print(f"{'clean pair':38s} {'arch':9s} {'dev':4s} {'what':38s} {'passed':6s} {'stats':5s} root causes")
        for c in clean:
            r = runner.run_clean(c, ws)
            cres.append(r)
            extra = f"ERROR {r.error}" if r.error else ("; ".join(r.root_causes[:2]) or "(no root cause)")
            print(f"{r.case:38s} {r.arch:9s} {r.device:4s} {r.what[:38]:38s} {_yn(r.passed):6s} "
                  f"{_yn(r.stats_passed):5s} {extra}", flush=True)
    finally:
        if not a.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    total = time.perf_counter() - t_start

    scored = [r for r in fres if r.scored]
    below = [r for r in fres if r.below_resolution and not r.plant_error]
    errors = [r for r in fres if r.plant_error]
    hits = sum(r.hit for r in scored)
    shits = sum(r.stats_hit for r in scored)
    caught = sum(r.passed is False for r in scored)
    fa = sum(r.false_alarm for r in cres)
    sfa = sum(r.stats_false_alarm for r in cres)
    named = sum(bool(r.suspect) for r in cres)
    n_archs = len({f.arch for f in faults})

    def rate(k: int, n: int) -> str:
        return f"{k}/{n} = {100.0 * k / n:.0f}%" if n else "0/0"

    print()
    if note:
        print(f"note: {note}")
    print(f"faults: {len(faults)} on {n_archs} architectures x {len(DEVICES_FOR_FAULTS)} devices = {len(fres)} cases; "
          f"scored {len(scored)}, below resolution {len(below)}, plant errors {len(errors)}")
    for where in ("below capture", "user code"):
        sub = [r for r in scored if r.where == where]
        print(f"  {where:14s}: first-suspect hit {rate(sum(r.hit for r in sub), len(sub))}, "
              f"stats-only hit {rate(sum(r.stats_hit for r in sub), len(sub))}")
    respelled = [d for d in dict.fromkeys(r.device for r in fres) if d not in DEVICES_FOR_FAULTS]
    for dev in list(DEVICES_FOR_FAULTS) + respelled:      # respelled: "fp32+kw", "bf16+ns"...
        sub = [r for r in scored if r.device == dev]
        print(f"  device {dev:7s}: first-suspect hit {rate(sum(r.hit for r in sub), len(sub))}")
    print(f"first-suspect hit rate: {rate(hits, len(scored))}")
    print(f"faults failing the gate (passed False): {rate(caught, len(scored))}")
    print(f"stats-only hit rate: {rate(shits, len(scored))}")
    print(f"false alarms on clean pairs (passed False): {rate(fa, len(cres))}; clean pairs naming a suspect: "
          f"{rate(named, len(cres))}")
    print(f"stats-only false alarms: {rate(sfa, len(cres))}")
    clean_ratios = [r.max_ratio for r in cres if r.max_ratio == r.max_ratio]
    by_replay = [r for r in scored if r.cause in ("own error over budget", "NaN/Inf origin") and r.ratio == r.ratio]
    fault_ratios = [r.ratio for r in by_replay]
    if clean_ratios:
        worst = max(cres, key=lambda r: r.max_ratio if r.max_ratio == r.max_ratio else -1)
        print(f"largest own-error/budget over clean calls: {max(clean_ratios):.3g} ({worst.case})")
    if fault_ratios:
        low = min(by_replay, key=lambda r: r.ratio)
        print(f"smallest own-error/budget over planted calls over budget: {low.ratio:.3g} ({low.case}) of "
              f"{len(by_replay)}; planted calls named by another cause (changed argument, code path): "
              f"{sum(1 for r in scored if r not in by_replay and r.cause)}; not a root cause: "
              f"{sum(1 for r in scored if not r.cause)}")
    unj: dict = {}
    for r in list(fres) + list(cres):
        for item in r.not_judged:
            api, _, why = item.partition(": ")
            unj.setdefault(why.split(" (")[0][:60], set()).add(api)
    n_unj = sum(len(v) for v in unj.values())
    print(f"calls not judged by replay (distinct keys over all cases): {n_unj}"
          + ("; " + "; ".join(f"{why}: {len(v)} ({', '.join(sorted(v)[:3])}{' ...' if len(v) > 3 else ''})"
                              for why, v in sorted(unj.items(), key=lambda x: -len(x[1]))) if unj else ""))
    rs = [r.replay_seconds for r in list(fres) + list(cres) if r.replay_seconds]
    if rs:
        print(f"replay time per compare: median {sorted(rs)[len(rs) // 2]:.2f} s, max {max(rs):.2f} s")
    print(f"time: {total:.0f} s")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump({"faults": [r.to_dict() for r in fres], "clean": [r.to_dict() for r in cres],
                       "summary": {"cases": len(fres), "scored": len(scored), "below_resolution": len(below),
                                   "plant_errors": len(errors), "hits": hits, "stats_hits": shits,
                                   "gate_caught": caught, "clean_pairs": len(cres), "false_alarms": fa,
                                   "stats_false_alarms": sfa, "seconds": total, "note": note}},
                      fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
