"""pyproject.toml declares the Python versions the tests run on.

scripts/test runs the whole suite on .venv's Python and scripts/test-pythons runs tests/unit (this file among
them) on every other CPython >= requires-python the machine has: each of those runs checks its own version here.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _project() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def _declared_minors(classifiers: list[str]) -> list[int]:
    return sorted(int(m.group(1)) for c in classifiers if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c)))


def test_the_python_running_the_tests_is_declared():
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"Programming Language :: Python :: {version}" in _project()["classifiers"], (
        f"the tests run on Python {version}, which pyproject.toml's classifiers do not declare: add it once they pass"
    )


def test_the_declared_versions_start_at_requires_python_with_none_left_out():
    project = _project()
    lowest = re.fullmatch(r">=\s*3\.(\d+)", project["requires-python"])
    assert lowest is not None, project["requires-python"]
    minors = _declared_minors(project["classifiers"])
    assert minors == list(range(int(lowest.group(1)), int(lowest.group(1)) + len(minors)))
    assert minors
