"""The architecture's contracts catch what they are for (import-linter, ``pyproject.toml``).

The test command runs ``lint-imports`` on the tree; these tests show, on a copy of the
package, that the contracts hold as it is and break on a deliberate back-import (the engine
reaching up into the harness, the kind of loop the redesign removed) and on a cycle
between two sibling modules.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def _copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src" / "tether", tmp_path / "src" / "tether",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command;"
         " sys.exit(lint_imports_command())", "--no-cache"],
        cwd=tree, env=env, capture_output=True, text=True, check=False)


def _add_import(tree: Path, module: str, line: str) -> None:
    path = tree / "src" / Path(*module.split(".")).with_suffix(".py")
    text = path.read_text()
    anchor = "from __future__ import annotations\n"
    path.write_text(text.replace(anchor, anchor + "\n" + line + "\n", 1))


def test_the_package_keeps_every_contract(tmp_path: Path) -> None:
    """The copy checked below is the package as it is: every contract is kept."""
    result = _lint_imports(_copy_of_the_package(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_back_import_from_the_engine_into_the_harness_is_caught(tmp_path: Path) -> None:
    """The engine must not know the harness: a type-only import is still an import."""
    tree = _copy_of_the_package(tmp_path)
    _add_import(tree, "tether.engine.recovery",
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from tether.harness import Harness  # noqa: F401")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "tether.engine.recovery -> tether.harness" in result.stdout
    assert "BROKEN" in result.stdout


def test_a_cycle_between_two_sibling_modules_is_caught(tmp_path: Path) -> None:
    """The model importing the errors' importer makes a cycle the acyclic contract names."""
    tree = _copy_of_the_package(tmp_path)
    _add_import(tree, "tether.errors", "import tether.model  # noqa: F401")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "No import cycles anywhere in tether" in result.stdout
    assert "tether.errors" in result.stdout
