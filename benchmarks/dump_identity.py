"""Check that this tree's capture writes byte-identical dumps to another version's.

``python benchmarks/dump_identity.py --check OLD_ROOT [--dir DIR]``: dumps the benchmark workloads
(``bench_dump.py``'s per-call loop, MLP, TransformerEncoder, tiny GPT-2 from a ``transformers``
config when it imports) and every model of ``example_models.MODELS``, statistics only and full
tensors, three steps each (so that what carries over between steps, such as cached statistics,
is exercised), once with this tree's ``pytest_ptdbg`` and once with OLD_ROOT's (e.g.
``git archive 65aac50 | tar -x -C /tmp/old``), each in a fresh process running this same file
(the stack records name the same user frames), and diffs every file's bytes: the ``.pkl``
record lines, every ``.npy`` and the manifest. Exit status 1 on any difference, naming the file
and the first differing line.
"""
from __future__ import annotations

import argparse
import filecmp
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEPS = 3


def _examples():
    """``example_models`` of this tree, whichever tree's ``pytest_ptdbg`` is imported."""
    spec = importlib.util.spec_from_file_location(
        "example_models", os.path.join(ROOT, "example_models", "__init__.py"),
        submodule_search_locations=[os.path.join(ROOT, "example_models")])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["example_models"] = mod
    spec.loader.exec_module(mod)
    return mod


def workloads(em) -> dict:
    """name -> a function making a fresh training-step callable (same seed every time)."""
    sys.path.insert(1, HERE)
    import bench_dump as bd

    out = {"loop": bd._loop_workload, "mlp": lambda: bd.make_workload("mlp"),
           "transformer": lambda: bd.make_workload("transformer")}
    try:
        import transformers  # noqa: F401
        out["gpt2_tiny"] = lambda: bd.make_workload("gpt2_tiny")
    except Exception:  # transformers missing: the example models below still run
        pass
    for name in em.MODELS:
        def make(_n=name):
            import torch
            torch.manual_seed(0)
            model, batch = em.MODELS[_n](seed=0)
            return lambda: em.train_step(model, batch)
        out["ex_" + name] = make
    return out


def make(code_root: str, out: str) -> None:
    sys.path.insert(0, code_root)
    import torch

    torch.set_num_threads(1)
    em = _examples()
    from pytest_ptdbg import PrecisionDebugger

    assert os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["pytest_ptdbg"].__file__))) == \
        os.path.abspath(code_root), "pytest_ptdbg imported from the wrong tree"
    for name, factory in workloads(em).items():
        for summary in (True, False):
            torch.manual_seed(0)
            step = factory()
            d = os.path.join(out, f"{name}_{'stats' if summary else 'full'}")
            dbg = PrecisionDebugger(dump_path=d, hook_name="dump", step=list(range(STEPS)))
            dbg.configure_hook(mode="api_stack", summary_only=summary)
            for _ in range(STEPS):
                dbg.start()
                step()
                dbg.stop()
                dbg.step()
            dbg.close()


def _first_diff(a: str, b: str) -> str:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        la, lb = fa.read().split(b"\n"), fb.read().split(b"\n")
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return f"line {i + 1}:\n  old {x[:300]!r}\n  new {y[:300]!r}"
    return f"{len(la)} lines (old) vs {len(lb)} (new)"


def diff_trees(old: str, new: str) -> list:
    problems = []
    for dirpath, _dirs, files in os.walk(old):
        rel = os.path.relpath(dirpath, old)
        for f in files:
            a, b = os.path.join(dirpath, f), os.path.join(new, rel, f)
            if not os.path.exists(b):
                problems.append(f"missing in new: {os.path.join(rel, f)}")
            elif not filecmp.cmp(a, b, shallow=False):
                what = _first_diff(a, b) if f.endswith((".pkl", ".json")) else "bytes differ"
                problems.append(f"differs: {os.path.join(rel, f)}: {what}")
    for dirpath, _dirs, files in os.walk(new):
        rel = os.path.relpath(dirpath, new)
        for f in files:
            if not os.path.exists(os.path.join(old, rel, f)):
                problems.append(f"only in new: {os.path.join(rel, f)}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", metavar="OLD_ROOT", help="the other version's source tree")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--make", nargs=2, metavar=("CODE_ROOT", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.make:
        make(*a.make)
        return 0
    if not a.check:
        ap.error("--check OLD_ROOT is required")
    d = a.dir or tempfile.mkdtemp(prefix="dump_identity_")
    try:
        for label, root in (("old", os.path.abspath(a.check)), ("new", ROOT)):
            target = os.path.join(d, label)
            shutil.rmtree(target, ignore_errors=True)
            env = dict(os.environ, PYTHONPATH=root)
            subprocess.run([sys.executable, os.path.abspath(__file__), "--make", root, target], check=True, env=env)
        problems = diff_trees(os.path.join(d, "old"), os.path.join(d, "new"))
        n = sum(len(f) for _, _, f in os.walk(os.path.join(d, "new")))
        for p in problems[:40]:
            print(p)
        print(f"{n} files compared, {len(problems)} differences")
        return 1 if problems else 0
    finally:
        if a.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
