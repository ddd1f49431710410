"""Shared set-up of the example precision suite (``example_models/test_*.py``).

The ``ptdbg_dump`` fixture comes from the pytest-ptdbg plugin (entry point ``ptdbg``); here only
what every example test wants: one intra-op thread per process (the suite runs under
``pytest -n 2`` on small CI machines, and two processes with many threads each only slow down).
"""
import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_worker():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
