"""Where things are, for tests in any folder of ``tests/``: the repository root, ``tests/``, ``tests/data``."""
import os

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
DATA_DIR = os.path.join(TESTS_DIR, "data")
