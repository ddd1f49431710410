"""Where things are, for tests in any folder of ``tests/``: the repository root, ``tests/``,
``tests/data``, and the paths of one dumped step (:class:`StepDump`, :func:`step_paths`; no torch)."""
import os
from dataclasses import dataclass

from pytest_ptdbg.format import records

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
DATA_DIR = os.path.join(TESTS_DIR, "data")


@dataclass(frozen=True)
class StepDump:
    """Where one dumped step lives."""

    dump_path: str
    rank_dir: str
    pkl: str
    data_dir: str


def step_paths(dump_path: "str | os.PathLike[str]", step: int = 0, rank: int = 0, mode: str = "api_stack") -> StepDump:
    """The paths of one step and rank of ``dump_path``."""
    dump_path = str(dump_path)
    return StepDump(dump_path, records.rank_dir(dump_path, step, rank),
                    records.pkl_path(dump_path, step, rank, mode), records.data_path(dump_path, step, rank, mode))
