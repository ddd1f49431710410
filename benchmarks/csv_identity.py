"""Check that the compare writes byte-identical CSVs (and the same verdicts) as another version.

``python benchmarks/csv_identity.py --make DIR``: dumps pairs of real example-model steps into DIR
(every model of ``example_models.MODELS``, full tensors and statistics only, the "NPU" side with
1e-6 weight noise, and the tiny GPT with a planted 1e-2 weight fault so that rows fail).

``python benchmarks/csv_identity.py --check OLD_ROOT DIR [PAIR_DIR ...]``: compares every pair in
DIR (and the extra ``npu,bench`` rank folders given) with this tree's code and with the code at
OLD_ROOT (e.g. ``git archive b14dae3 | tar -x -C /tmp/old``), each in a fresh process, with
several option sets (default, ``stack_mode``, ``rule="dtype"``, forced summary), and diffs the CSV
bytes, ``passed``, the problems and the internal verdict columns. Exit status 1 on any difference.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

OPTIONS = {"default": {}, "stack": {"stack_mode": True}, "dtype": {"rule": "dtype"},
           "summary": {"summary_compare": True}}


def make(d: str) -> None:
    import torch

    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import example_models as em
    from real_dumps import dump_one_step, perturb

    torch.set_num_threads(1)
    for name in em.MODELS:
        for summary in (False, True):
            for side, noise in (("npu", 1e-6), ("bench", 0.0)):
                out = os.path.join(d, f"{name}_{'stats' if summary else 'full'}_{side}")
                if os.path.isdir(out):
                    continue
                prep = (lambda m: [perturb(m, n, rel=noise, seed=i) for i, (n, _) in
                                   enumerate(m.named_parameters())] and None) if noise else None
                torch.manual_seed(0)
                dump_one_step(out, name, summary_only=summary, prepare=prep)
    for side in ("npu", "bench"):
        out = os.path.join(d, f"gptfault_full_{side}")
        if not os.path.isdir(out):
            def prep(m, _s=side):
                if _s == "npu":
                    n = [k for k, _ in m.named_parameters()][3]
                    perturb(m, n, rel=1e-2, seed=5)
                return None
            torch.manual_seed(0)
            dump_one_step(out, "tiny_gpt", prepare=prep)


def pairs(d: str) -> list:
    from_dir = []
    for e in sorted(os.listdir(d)):
        if e.endswith("_npu") and os.path.isdir(os.path.join(d, e[:-4] + "_bench")):
            from_dir.append((os.path.join(d, e), os.path.join(d, e[:-4] + "_bench")))
    return from_dir


_RUN = r"""
import hashlib, json, os, sys, tempfile
sys.path.insert(0, os.environ["CHECK_ROOT"])
from pytest_ptdbg import api
from pytest_ptdbg.format import records
out = {}
for npu, bench, opt_name, opts in json.loads(sys.argv[1]):
    def rank(p):
        return p if os.path.isfile(os.path.join(p, records.pkl_name("api_stack"))) else records.rank_dir(p)
    param = {"npu_pkl_path": rank(npu), "bench_pkl_path": rank(bench), "is_print_compare_log": False}
    with tempfile.TemporaryDirectory() as t:
        r = api.compare(param, t, replay_check=False, **opts)
        with open(r.csv_path, "rb") as f:
            csv = f.read()
    cols = [c for c in ("_passed", "_unusable", "_arg_changed", "_code_path", "_nan_mismatch", "_paired",
                        "_api", "_bench_api", "_io", "_index", "_order", "_ctx", "_family", "_direction", "_arg",
                        "_npu_nonfinite", "_bench_nonfinite")
            if c in r.table.columns]
    internal = {c: [str(v) for v in r.table[c].tolist()] for c in cols}
    internal["_rel_l2"] = [repr(float(v)) for v in r.table["_rel_l2"].tolist()]
    out[f"{npu}|{bench}|{opt_name}"] = {
        "csv_sha": hashlib.sha256(csv).hexdigest(), "csv_len": len(csv), "passed": bool(r.passed),
        "problems": r.problems, "internal": hashlib.sha256(json.dumps(internal).encode()).hexdigest(),
        "rows": len(r.table), "dtypes": [str(t) for t in r.table.dtypes]}
print(json.dumps(out))
"""


def run(root: str, jobs: list) -> dict:
    env = dict(os.environ, CHECK_ROOT=root, PYTHONPATH=root)
    p = subprocess.run([sys.executable, "-c", _RUN, json.dumps(jobs)], capture_output=True, text=True, env=env,
                       cwd=root)
    if p.returncode:
        raise SystemExit(f"{root}: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def check(old: str, d: str, extra: list, options: list) -> int:
    ps = pairs(d) if d else []
    ps += [tuple(x.split(",")) for x in extra]
    jobs = [(n, b, k, OPTIONS[k]) for n, b in ps for k in options]
    new_res, old_res = run(ROOT, jobs), run(old, jobs)
    bad = 0
    for key in sorted(new_res):
        a, b = new_res[key], old_res[key]
        diff = [k for k in a if a[k] != b[k]]
        print(f"{'SAME' if not diff else 'DIFFERENT ' + ','.join(diff)}: {key} ({a['rows']} rows, "
              f"passed={a['passed']})", flush=True)
        bad += bool(diff)
    return bad


def main() -> None:
    if sys.argv[1] == "--make":
        make(sys.argv[2])
        return
    if sys.argv[1] == "--check":
        opts = os.environ.get("CHECK_OPTIONS", "default,stack,dtype,summary").split(",")
        d = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else ""
        sys.exit(1 if check(sys.argv[2], d, sys.argv[4:], opts) else 0)
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
