"""The one-way imports of DESIGN.md (schemas <- traces <- replay <- calibrate), checked by import-linter."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def test_import_layers():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not found: install the test extra (pip install '.[test]')")
    root = Path(__file__).parents[1]
    res = subprocess.run([exe, "--config", str(root / "pyproject.toml")], cwd=root, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
