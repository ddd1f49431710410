"""The main job's demo: dump one training step of an example model and summarise the dump.

``python -m pytest_ptdbg.cli.demo [--out DIR] [--model tiny_gpt|mlp] [--summary-only]`` (also
``ptdbg demo``) runs forward, backward and one optimizer step of a model shipped in the package
(``cli/demo_model.py``, so it works from a normal install) under
``PrecisionDebugger`` in ``api_stack`` mode, then prints where the dump is, how many APIs were
recorded forward and backward (and how many of them in the optimizer step), and its size.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set

from pytest_ptdbg.format import records

DEFAULT_OUT = "ptdbg-report"  # the README's name


@dataclass
class DumpSummary:
    """What one rank folder of a dump holds."""

    rank_dir: str
    pkl_path: str
    forward_apis: int = 0
    backward_apis: int = 0
    optimizer_apis: int = 0
    tensor_records: int = 0
    stack_records: int = 0
    npy_files: int = 0
    total_bytes: int = 0
    first_api: str = ""
    bad_lines: List[int] = field(default_factory=list)

    def text(self) -> str:
        """The printed summary."""
        lines = [
            f"dump:            {self.rank_dir}",
            f"records:         {self.pkl_path}",
            f"APIs forward:    {self.forward_apis} (of which {self.optimizer_apis} in the optimizer step)",
            f"APIs backward:   {self.backward_apis}",
            f"tensor records:  {self.tensor_records}, stack records: {self.stack_records}",
            f"tensor files:    {self.npy_files}",
            f"size on disk:    {_human(self.total_bytes)} ({self.total_bytes} bytes)",
        ]
        if self.bad_lines:
            lines.append(f"unreadable lines in {self.pkl_path}: {self.bad_lines[:10]}")
        if self.first_api:
            lines.append(f"inspect an API:  ptdbg parse {self.pkl_path} {self.first_api}")
        return "\n".join(lines)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def summarize_dump(rank_dir: str, mode: str = "api_stack") -> DumpSummary:
    """Count the APIs, records and bytes of the dump in ``rank_dir`` (no torch needed)."""
    pkl = os.path.join(rank_dir, records.pkl_name(mode))
    if not os.path.isfile(pkl):
        raise FileNotFoundError(f"no {records.pkl_name(mode)} in {rank_dir}")
    s = DumpSummary(rank_dir=rank_dir, pkl_path=pkl)
    seen: Dict[str, Set[str]] = {d: set() for d in records.DIRECTIONS}
    optimizer: Set[str] = set()
    with open(pkl, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if records.is_stack_record(rec):
                    s.stack_records += 1
                    continue
                parsed = records.parse_name(rec[0])
            except (ValueError, IndexError, TypeError):
                s.bad_lines.append(lineno)
                continue
            s.tensor_records += 1
            s.first_api = s.first_api or parsed.api_key
            seen[parsed.direction].add(parsed.api_key)
            extra = rec[6] if len(rec) > 6 and isinstance(rec[6], dict) else {}
            if extra.get("ctx") == records.OPTIMIZER_CTX and parsed.direction == records.FORWARD:
                optimizer.add(parsed.api_key)
    s.forward_apis, s.backward_apis = len(seen[records.FORWARD]), len(seen[records.BACKWARD])
    s.optimizer_apis = len(optimizer)
    for root, _dirs, files in os.walk(rank_dir):
        for name in files:
            s.total_bytes += os.path.getsize(os.path.join(root, name))
            s.npy_files += name.endswith(".npy")
    return s


def run_demo(out: str = DEFAULT_OUT, model_name: str = "tiny_gpt", summary_only: bool = False,
             seed: int = 0, mode: str = "api_stack") -> DumpSummary:
    """Dump one training step of ``model_name`` under ``out`` and return its summary.

    A previous demo dump under ``out`` (its ``ptdbg_dump_v4.0`` folder) is replaced.
    """
    from pytest_ptdbg import PrecisionDebugger, seed_all
    from pytest_ptdbg.cli import demo_model

    if model_name not in demo_model.MODELS:
        raise ValueError(f"model={model_name!r}: expected one of {', '.join(demo_model.MODELS)}")
    old = os.path.join(out, records.DUMP_DIR_NAME)
    if os.path.isdir(old):
        shutil.rmtree(old)
    os.makedirs(out, exist_ok=True)
    model, batch = demo_model.build(model_name, seed=seed)
    seed_all(seed)
    debugger = PrecisionDebugger(dump_path=out, hook_name="dump", step=[0])
    debugger.configure_hook(mode=mode, summary_only=summary_only)
    debugger.start()
    try:
        demo_model.train_step(model, batch)
    finally:
        debugger.stop()
    debugger.step()
    rank_dirs = sorted(d for d in os.listdir(records.step_dir(out, 0)) if d.startswith("rank"))
    if not rank_dirs:
        raise FileNotFoundError(f"the debugger wrote no rank folder under {records.step_dir(out, 0)}")
    return summarize_dump(os.path.join(records.step_dir(out, 0), rank_dirs[0]), mode)


def _model_names() -> tuple:
    from pytest_ptdbg.cli.demo_model import MODELS

    return MODELS


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """The demo's options (the ``ptdbg demo`` subcommand reuses this)."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    p = parser or argparse.ArgumentParser(
        prog="ptdbg demo" if invoked == "ptdbg" else "python -m pytest_ptdbg.cli.demo",
        description="Dump one training step of an example model and summarise the dump.")
    p.add_argument("--out", "-o", default=DEFAULT_OUT,
                   help=f"dump directory (default: ./{DEFAULT_OUT}); a previous demo dump there is replaced")
    p.add_argument("--model", default="tiny_gpt", choices=_model_names(),
                   help="demo model, shipped in the package (default: tiny_gpt)")
    p.add_argument("--summary-only", action="store_true", help="statistics only, no .npy tensor files")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, batch and dropout (default: 0)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the demo; returns the process exit status."""
    args = build_parser().parse_args(argv)
    try:
        summary = run_demo(args.out, args.model, args.summary_only, args.seed)
    except (ValueError, OSError) as exc:
        print(f"ptdbg demo: error: {exc}", file=sys.stderr)
        return 2
    print(f"ptdbg demo: one training step of the demo model {args.model} "
          "(forward, backward, optimizer step), mode api_stack")
    print(summary.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
