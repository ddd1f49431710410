"""The identity suite's fixtures: ``tester``, pytester whose in-process inner sessions keep the
library modules (as ``tests/plugin/conftest.py`` does: torch cannot be imported twice)."""
import sys

import pytest

from _pytest.pytester import SysModulesSnapshot


@pytest.fixture
def tester(request, monkeypatch, tmp_path_factory):
    """pytester for in-process inner sessions that drops only the inner sessions' own modules
    (files under the base temp dir); goldens on (the default), never in CI mode."""
    root = str(tmp_path_factory.getbasetemp())
    orig = SysModulesSnapshot.__init__

    def init(self, preserve=None):
        def keep(name):
            path = getattr(sys.modules.get(name), "__file__", None) or ""
            return not path.startswith(root) or bool(preserve and preserve(name))
        orig(self, preserve=keep)

    monkeypatch.setattr(SysModulesSnapshot, "__init__", init)
    pytester = request.getfixturevalue("pytester")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    return pytester
