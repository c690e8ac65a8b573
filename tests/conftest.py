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

#: The test files that take longest (seconds: ``--durations=0`` summed per file, two workers,
#: 2026-12-03), run first. pytest's addopts (``--dist loadfile --no-loadscope-reorder``) give a
#: worker the next file in collection order when it runs dry, so the long files spread over the
#: workers and the short ones fill in at the end (longest first); without the order the last
#: long file could start alone at the end. The others keep their order after these.
LONGEST_FIRST = (
    "test_readme_production.py",  # 75
    "test_bad_input.py",  # 57
    "calibrate/test_fidelity_real.py",  # 55
    "calibrate/test_request_fit_intervals.py",  # 55
    "calibrate/test_aggregate_fit.py",  # 53
    "test_fuzz.py",  # 21
    "replay/test_ray.py",  # 20
    "replay/test_sweep.py",  # 15
    "calibrate/test_fit.py",  # 14
    "calibrate/test_fix_from.py",  # 12
)


def pytest_collection_modifyitems(items) -> None:
    """Put the files of :data:`LONGEST_FIRST` first, in that order (a stable sort: a file's own
    tests keep their order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    here = Path(__file__).parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(here).as_posix(), len(rank)))


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

