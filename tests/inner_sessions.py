"""pytester for in-process inner sessions that keep the library modules (used by the ``tester``
fixtures of ``tests/plugin`` and ``tests/identity``).

pytester drops every module imported during an inner run and during the test; torch cannot be
imported twice in one process (its native parts register once), so only modules of the inner
sessions' own files (under the base temp dir) are dropped. Patched before pytester takes its
first snapshot.
"""
import sys

from _pytest.pytester import SysModulesSnapshot


def keep_library_modules(request, monkeypatch, tmp_path_factory):
    """The ``pytester`` fixture, made with only the inner sessions' own modules dropped."""
    root = str(tmp_path_factory.getbasetemp())
    orig = SysModulesSnapshot.__init__

    def init(self, preserve=None):
        def keep(name):
            path = getattr(sys.modules.get(name), "__file__", None) or ""
            return not path.startswith(root) or bool(preserve and preserve(name))
        orig(self, preserve=keep)

    monkeypatch.setattr(SysModulesSnapshot, "__init__", init)
    return request.getfixturevalue("pytester")
