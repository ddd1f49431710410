"""Benchmark: does the budget hold for any correct kernel? (issue 22)

Runs one training step of each architecture with correct *alternative* kernels planted below
capture (``faults/alt_kernels.py``: split-K GEMMs, blocked sequential sums, online softmax,
Welford norms, Winograd 3x3 convolutions, AdamW ops in another association, libm functions
within 2 ulp), each family alone and all together, in float32 and under bf16 autocast. The device
dump (alternative kernels) is compared with the plain float32 CPU bench by ``compare(...)`` with
default settings (the judgement on). A false alarm is ``passed`` False or any root cause. For
every judged call it takes own error / budget; it prints the largest clean ratio per kernel family
(over the calls that family's kernels computed) and, from ``bench_diagnosis``'s planted faults
(``--faults RESULTS.json`` from ``bench_diagnosis.py --out``, else the fast faults run here by the
same runner), the smallest ratio of a fault found over budget: the margin both ways.

``python benchmarks/bench_alt_kernels.py [--fast] [--archs a,b] [--faults X.json] [--out Y.json]``
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ARCHS = ("mlp", "cnn", "tiny_gpt", "gpt2", "llama", "bert", "vit", "t5")
FAST_ARCHS = ("mlp", "cnn", "tiny_gpt", "gpt2", "bert")
DEVICES = {"fp32": "same", "bf16": "bf16"}   # our name -> a key of faults.dumps.DEVICES


@dataclass
class AltResult:
    """One architecture, one device setting, one set of alternative kernel families."""

    arch: str
    device: str
    families: str
    used: Dict[str, int] = field(default_factory=dict)
    passed: Optional[bool] = None
    root_causes: List[str] = field(default_factory=list)
    #: family -> (largest own error / budget over the calls its kernels computed, that call)
    worst: Dict[str, List[Any]] = field(default_factory=dict)
    judged: int = 0
    error: str = ""
    seconds: float = 0.0

    @property
    def false_alarm(self) -> bool:
        return self.passed is False or bool(self.root_causes)


class _Plant:
    layer = "below"

    def __init__(self, mode: Any) -> None:
        self.mode = mode


def run_alt(arch: str, device: str, families: List[str], ws: Any) -> AltResult:
    """Dump ``arch`` on ``device`` with the alternative kernels of ``families``; compare with the bench."""
    from benchmarks.faults import alt_kernels as AK, dumps, runner

    t0 = time.perf_counter()
    res = AltResult(arch, device, "+".join(families) if len(families) < len(AK.FAMILIES) else "all")
    out = ws.scratch(f"alt__{arch}__{device}__{res.families}")
    try:
        bench = ws.clean_dump(arch, None)
        mode = AK.AltKernels(families)
        dumps.dump_step(arch, os.path.join(out, "dump"), dumps.DEVICES[DEVICES[device]], _Plant(mode))
        res.used = dict(mode.used)
        if res.used:
            full = runner._compare(os.path.join(out, "dump"), bench, os.path.join(out, "cmp"), False)
            res.passed = bool(full.passed)
            _, _, ratios = runner._replay_facts(full)
            res.judged = len(ratios)
            res.root_causes = [f"{c.api} [{c.cause}]" for c in getattr(full.judgement, "root_causes", [])]
            for key, r in ratios.items():
                fam = AK.family_of(key)
                if fam in families and r == r and r > res.worst.get(fam, [-1.0])[0]:
                    res.worst[fam] = [r, key]
    except Exception as e:  # a broken case is reported, the benchmark goes on
        res.error = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(out, ignore_errors=True)
    res.seconds = time.perf_counter() - t0
    return res


def fault_ratios(path: str, ws: Any) -> List[Dict[str, Any]]:
    """The scored planted faults found over budget by replay, with their ratios: from a
    ``bench_diagnosis.py --out`` file, else the fast faults run here."""
    from benchmarks.faults import registry, runner

    if path:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)["faults"]
    else:
        rows = []
        for flt in registry.FAULTS:
            if flt.id in registry.FAST_FAULTS:
                for dev in flt.devices(("fp32", "bf16")):
                    rows.append(runner.run_fault(flt, dev, ws).to_dict())
    return [r for r in rows if r.get("scored") and r.get("cause") in ("own error over budget", "NaN/Inf origin")
            and isinstance(r.get("ratio"), (int, float)) and r["ratio"] == r["ratio"]]


def stress() -> List[Dict[str, Any]]:
    """Long reductions and contractions (a device's real sizes), judged directly by the budget's
    kernels: own error (alternative kernel vs float64) / budget, with the budget the CPU reference
    alone gives (``old``) and with the kernel bound (``new``)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from benchmarks.faults import alt_kernels as AK
    from pytest_ptdbg.judge import algorithms as A, budget as B

    g = torch.Generator().manual_seed(5)

    def r(*shape: int, shift: float = 0.0) -> Any:
        return torch.randn(*shape, generator=g) + shift

    t = {"t": "input.0"}
    cases = [
        ("seqsum", "sum of 32768 positive", "sum", F.relu(r(4, 32768)) + 0.1, [t, -1], torch.sum, (-1,)),
        ("seqsum", "mean of 32768", "mean", r(4, 32768, shift=1.0), [t, -1], torch.mean, (-1,)),
        ("welford", "batch_norm 32x4x32x32 (32768 per channel)", "batch_norm", r(32, 4, 32, 32, shift=2.0),
         [t, None, None, None, None, True], F.batch_norm, (None, None, None, None, True)),
        ("welford", "layer_norm over 4096", "layer_norm", r(8, 4096, shift=3.0), [t, [4096]], F.layer_norm,
         ((4096,),)),
        ("online_softmax", "softmax over 8192", "softmax", 4 * r(8, 8192), [t, -1], F.softmax, (-1,)),
        ("online_softmax", "log_softmax over 8192", "log_softmax", 4 * r(8, 8192), [t, -1], F.log_softmax, (-1,)),
        ("splitk", "linear K=4096", "linear", r(16, 4096), [t, {"t": "input.1"}], F.linear, (r(64, 4096),)),
        ("winograd", "conv2d 3x3 64->32 on 2x64x16x16", "conv2d", r(2, 64, 16, 16), [t, {"t": "input.1"}],
         F.conv2d, (r(32, 64, 3, 3), None, 1, 1)),
        ("libm", "exp of 65536", "exp", r(65536), [t], torch.exp, ()),
        ("libm", "tanh of 65536", "tanh", r(65536), [t], torch.tanh, ()),
    ]
    out = []
    for fam, what, name, x, args, func, rest in cases:
        with torch.no_grad():
            ref = func(x, *rest)
            exact = func(x.double(), *[a.double() if isinstance(a, torch.Tensor) else a for a in rest])
            with AK.AltKernels([fam]):
                dev = func(x, *rest)
        arrays = {"input.0": x.numpy(), "output.0": exact.numpy()}
        if rest and isinstance(rest[0], torch.Tensor):
            arrays["input.1"] = rest[0].numpy()
        own, rerr, scale, n = B.finite_norms(dev.numpy(), exact.numpy(), ref.numpy())

        def norm(k: str, arrays: Dict[str, Any] = arrays) -> float:
            return float(np.linalg.norm(arrays[k].astype(np.float64)))
        bound = A.kernel_bound(name, {"args": args, "kwargs": {}}, arrays, norm, "output.0", scale, "torch.float32")
        rms = min(B.rms(arrays[k]) for k in arrays if k.startswith("input."))
        old = B.judged("output.0", own, rerr, scale, n, "torch.float32", rms)
        new = B.judged("output.0", own, rerr, scale, n, "torch.float32", rms, kernels=bound)
        out.append({"family": fam, "case": what, "own_vs_cpu": own / rerr if rerr else math.inf,
                    "old": old.ratio, "new": new.ratio})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help="all families together on five architectures")
    ap.add_argument("--archs", default="", help="comma-separated architectures (default: all available)")
    ap.add_argument("--faults", default="", help="bench_diagnosis.py --out results (default: run its fast faults)")
    ap.add_argument("--out", default="", help="write every result as JSON here")
    ap.add_argument("--self-test", action="store_true",
                    help="only check each kernel against float64 and judge the long reductions")
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from benchmarks.faults import alt_kernels as AK, archs, runner

    print("self-test (relative L2 error against float64, float32 inputs):")
    for fam, what, alt, cpu in AK.self_test():
        print(f"  {fam:15s} {what:34s} alternative {alt:.2e}  CPU kernel {cpu:.2e}")
    print("long reductions (a device's sizes), own error / budget: the CPU reference's alone -> with the "
          "kernel bound:")
    long_cases = stress()
    for c in long_cases:
        print(f"  {c['family']:15s} {c['case']:42s} own/CPU's {c['own_vs_cpu']:6.2f}  {c['old']:6.3f} -> "
              f"{c['new']:6.3f}")
    if a.self_test:
        return 0
    have = set(archs.available_archs())
    names = [n for n in (a.archs.split(",") if a.archs else (FAST_ARCHS if a.fast else ARCHS)) if n in have]
    variants = [list(AK.FAMILIES)] + ([] if a.fast else [[f] for f in AK.FAMILIES])
    t_start = time.perf_counter()
    root = tempfile.mkdtemp(prefix="ptdbg_alt_")
    ws = runner.Workspace(root)
    results: List[AltResult] = []
    print()
    print(f"{'arch':9s} {'dev':4s} {'kernels':15s} {'calls':>5s} {'judged':>6s} {'pass':4s} {'max ratio':>9s}  "
          f"worst call / root causes")
    try:
        for name in names:
            for dev in DEVICES:
                for fams in variants:
                    r = run_alt(name, dev, fams, ws)
                    results.append(r)
                    if not r.used and not r.error:
                        continue
                    top = max(r.worst.values(), default=[math.nan, ""])
                    extra = r.error or ("; ".join(r.root_causes[:2]) if r.root_causes else top[1])
                    print(f"{name:9s} {dev:4s} {r.families:15s} {sum(r.used.values()):5d} {r.judged:6d} "
                          f"{'-' if r.passed is None else ('yes' if r.passed else 'no'):4s} {top[0]:9.3g}  {extra}",
                          flush=True)
        faults = fault_ratios(a.faults, ws)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    ran = [r for r in results if r.used and not r.error]
    fa = [r for r in ran if r.false_alarm]
    print()
    print(f"runs: {len(ran)} ({len(names)} architectures x {len(DEVICES)} devices x "
          f"{len(variants)} kernel sets, runs where no kernel applied left out); errors: "
          f"{sum(bool(r.error) for r in results)}")
    print(f"false alarms (passed False or a root cause): {len(fa)}/{len(ran)}"
          + ("".join(f"\n  {r.arch} {r.device} {r.families}: {'; '.join(r.root_causes[:3])}" for r in fa)))
    print(f"{'family':15s} {'calls':>6s} {'largest clean ratio':>20s}  where")
    overall = 0.0
    for fam in AK.FAMILIES:
        best: List[Any] = [-1.0, "", ""]
        calls = 0
        for r in ran:
            calls += r.used.get(fam, 0)
            w = r.worst.get(fam)
            if w and w[0] > best[0]:
                best = [w[0], w[1], f"{r.arch} {r.device} {r.families}"]
        overall = max(overall, best[0])
        print(f"{fam:15s} {calls:6d} {best[0]:20.3g}  {best[1]} ({best[2]})" if best[0] >= 0
              else f"{fam:15s} {calls:6d} {'-':>20s}")
    low = min(faults, key=lambda r: r["ratio"]) if faults else None
    if low is not None:
        print(f"smallest ratio of a planted fault found over budget: {low['ratio']:.3g} ({low['case']}) "
              f"of {len(faults)}")
        print(f"margin: largest clean ratio {overall:.3g} (x{1 / overall:.3g} below the budget), smallest fault "
              f"ratio {low['ratio']:.3g} (x{low['ratio']:.3g} above it)")
    print(f"time: {time.perf_counter() - t_start:.0f} s")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump({"runs": [dict(asdict(r), false_alarm=r.false_alarm) for r in results],
                       "faults": faults, "long": long_cases}, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
