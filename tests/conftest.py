"""Shared pytest fixtures.

The test folders mirror the packages and hold no ``__init__.py``: pytest puts this folder on
``sys.path`` (it holds this conftest), so every test imports the shared helpers (``helpers``,
``fuzzlib``, ``pp_golden``) by name; each test file's own folder is on it too
(``test_sched_heap:OldSjf`` names a scheduler class of that file).
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# A test run started in the background of a non-interactive shell inherits Ctrl-C ignored
# (SIG_IGN), and so would every command the tests start; the Ctrl-C tests need what a
# terminal gives: Python's default handler here, the default disposition in subprocesses.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: Real-data files live beside the repository: <repo>/../shared/data/real.
REAL_DATA_DIR = Path(__file__).parents[2] / "shared" / "data" / "real"


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The folder of real data files; skips (or fails with SERVECAL_REQUIRE_REAL_DATA=1) if absent."""
    if not REAL_DATA_DIR.is_dir():
        if os.environ.get("SERVECAL_REQUIRE_REAL_DATA") == "1":
            pytest.fail(f"real data not found at {REAL_DATA_DIR} (SERVECAL_REQUIRE_REAL_DATA=1)")
        pytest.skip(f"real data not found at {REAL_DATA_DIR}")
    return REAL_DATA_DIR

