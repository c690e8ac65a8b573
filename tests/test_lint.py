"""ruff (pyflakes rules and syntax errors, configured in pyproject.toml) finds nothing."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    if shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                       capture_output=True).returncode:
        pytest.fail("ruff is not installed: pip install '.[test]'")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(ROOT)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
