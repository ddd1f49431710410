"""The identity suite's fixtures: ``tester``, pytester whose in-process inner sessions keep the
library modules (as ``tests/plugin/conftest.py`` does: torch cannot be imported twice)."""
import pytest
from inner_sessions import keep_library_modules


@pytest.fixture
def tester(request, monkeypatch, tmp_path_factory):
    """pytester for in-process inner sessions that drops only the inner sessions' own modules
    (files under the base temp dir); goldens on (the default), never in CI mode."""
    pytester = keep_library_modules(request, monkeypatch, tmp_path_factory)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    return pytester
