"""The linters find nothing: ruff (syntax errors, pyflakes, line length, bugbear, complexity and statement counts)
and mypy (type hints of the core); both configured in pyproject.toml. lint-imports: tests/test_layers.py."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _require(module: str) -> None:
    if shutil.which(module) is None and subprocess.run([sys.executable, "-m", module, "--version"],
                                                       capture_output=True).returncode:
        pytest.fail(f"{module} is not installed: pip install '.[test]'")


def test_ruff_finds_nothing():
    _require("ruff")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(ROOT)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_finds_nothing_in_the_core():
    """The modules of ``[tool.mypy] files`` type-check (about 10 s without a cache on one core)."""
    _require("mypy")
    res = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
